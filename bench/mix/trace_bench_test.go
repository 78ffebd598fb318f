package mix_test

// The trace stage's benchmarks live here, beside the mix they feed on: in
// internal/trace their imports (the whole enrich stage) would be built
// with coverage instrumentation into every fuzz target of the package
// (748 packages instead of 132).

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// diagnosedFlows is the benchmark mix joined and diagnosed.
func diagnosedFlows(b *testing.B, n int) []*trace.Flow {
	b.Helper()
	env, err := mix.Env()
	if err != nil {
		b.Fatal(err)
	}
	var out []*trace.Flow
	j := enrich.NewStages(&join.Joiner{Names: mix.Names{}},
		&enrich.Enricher{Env: func(time.Time) enrich.Env { return env }, Emit: func(f *trace.Flow) { out = append(out, f) }})
	evs, err := mix.Events(n, time.Microsecond)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range evs {
		j.Add(e, e.Time)
	}
	j.Flush()
	return out
}

// BenchmarkEncode writes diagnosed flows of the mix as NDJSON (to
// io.Discard): the cost of `tracer trace -o json` per flow.
func BenchmarkEncode(b *testing.B) {
	flows := diagnosedFlows(b, 1000)
	w, err := trace.NewWriter(io.Discard, trace.Header{Node: mix.Node})
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		if err := w.WriteFlow(flows[i]); err != nil {
			b.Fatal(err)
		}
		if i++; i == len(flows) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "flows/s")
}

// BenchmarkStoreAppend copies diagnosed flows into the UI's store.
func BenchmarkStoreAppend(b *testing.B) {
	flows := diagnosedFlows(b, 1000)
	s := trace.NewStore()
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		s.Append(flows[i])
		if i++; i == len(flows) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "flows/s")
}

// BenchmarkStoreAppendCapped copies diagnosed flows of the mix, each with
// its own client address, into a store with the default caps, so that
// past the first 200,000 flows every append also evicts.
func BenchmarkStoreAppendCapped(b *testing.B) {
	flows := diagnosedFlows(b, 1000)
	// More addresses than the cap retains, made before the clock starts.
	clients := make([]string, 1<<18)
	for i := range clients {
		clients[i] = clientAddr(i)
	}
	s := trace.NewCappedStore(trace.DefaultCaps)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		f := *flows[i%len(flows)]
		f.Orig.Src = clients[i%len(clients)]
		s.Append(&f)
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "flows/s")
	b.ReportMetric(float64(s.Memory())/(1<<20), "est-MiB")
	b.ReportMetric(float64(s.Retained()), "retained")
}

// clientAddr is a distinct client address and port for each i.
func clientAddr(i int) string {
	return fmt.Sprintf("10.%d.%d.%d:%d", i>>16&0xff, i>>8&0xff, i&0xff, 30000+i%30000)
}

// BenchmarkRecord turns decoded events into their trace form, as
// `tracer trace --events` does for every event (the joiner writes a
// flow's events with its own Encoder when the flow finishes).
func BenchmarkRecord(b *testing.B) {
	evs, err := mix.Events(1000, time.Microsecond)
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		_ = trace.EventOf(evs[i], mix.Names{})
		if i++; i == len(evs) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
