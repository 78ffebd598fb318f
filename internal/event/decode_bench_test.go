package event_test

import (
	"testing"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/event"
)

// BenchmarkDecode parses ring buffer records of the benchmark mix (DNATs
// with replies, DNAT+SNAT, rejects with their drops, resets).
func BenchmarkDecode(b *testing.B) {
	recs := mix.Records(1000, time.Microsecond)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		if _, err := event.Decode(recs[i], mix.Clock); err != nil {
			b.Fatal(err)
		}
		if i++; i == len(recs) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
