package enrich_test

import (
	"testing"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// mixEvents decodes the records of flows of the benchmark mix.
func mixEvents(b testing.TB, flows int, gap time.Duration) []event.Event {
	b.Helper()
	var out []event.Event
	for _, r := range mix.Records(flows, gap) {
		e, err := event.Decode(r, mix.Clock)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// BenchmarkJoin groups events into flows and expires them (no conntrack,
// no enrichment): the joiner's own cost per event, with about 60,000 flows
// open (events 10 µs apart, 1.5 s linger).
func BenchmarkJoin(b *testing.B) {
	const gap = 10 * time.Microsecond
	evs := mixEvents(b, 200_000, gap)
	flows := 0
	j := &enrich.Joiner{Linger: enrich.DefaultLinger, Names: mix.Names{}, ReuseFlows: true, Emit: func(*trace.Flow) { flows++ }}
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

// BenchmarkEnrich is rule attribution, pod and Service naming and the
// diagnosis of one finished flow of the mix, against a kube-proxy (IPVS)
// + portmap rule set and 600 pods.
func BenchmarkEnrich(b *testing.B) {
	env, err := mix.Env()
	if err != nil {
		b.Fatal(err)
	}
	flows := mixFlows(b, 1000)
	scratch := make([]trace.Flow, len(flows))
	for i, f := range flows {
		scratch[i] = *f
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		f := &scratch[i]
		*f = *flows[i]
		enrich.Enrich(f, env)
		if i++; i == len(flows) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "flows/s")
}
