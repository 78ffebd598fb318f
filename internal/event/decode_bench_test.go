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

// BenchmarkRecord turns decoded events into their trace form, as the
// live reader does for every event.
func BenchmarkRecord(b *testing.B) {
	var evs []event.Event
	for _, r := range mix.Records(1000, time.Microsecond) {
		e, err := event.Decode(r, mix.Clock)
		if err != nil {
			b.Fatal(err)
		}
		evs = append(evs, e)
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		_ = evs[i].Record(mix.Names{})
		if i++; i == len(evs) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
