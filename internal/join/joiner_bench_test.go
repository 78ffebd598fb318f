package join_test

import (
	"testing"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/join"
)

// BenchmarkJoin groups events into flows and expires them (no conntrack,
// no enrichment): the joiner's own cost per event, with about 60,000 flows
// open (events 10 µs apart, 1.5 s linger).
func BenchmarkJoin(b *testing.B) {
	const gap = 10 * time.Microsecond
	evs, err := mix.Events(200_000, gap)
	if err != nil {
		b.Fatal(err)
	}
	flows := 0
	j := &join.Joiner{Linger: join.DefaultLinger, Names: mix.Names{}, ReuseFlows: true, Emit: func(*join.Flow) { flows++ }}
	now := mix.Clock.BootWall
	next := now
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		d := &evs[i]
		if now.After(next) {
			j.Expire(now)
			next = now.Add(100 * time.Millisecond)
		}
		j.Add(*d, now)
		now = now.Add(gap)
		if i++; i == len(evs) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
