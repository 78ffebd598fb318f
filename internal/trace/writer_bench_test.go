package trace_test

import (
	"io"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
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
	j := &enrich.Joiner{Env: func() enrich.Env { return env }, Emit: func(f *trace.Flow) { out = append(out, f) }}
	for _, r := range mix.Records(n, time.Microsecond) {
		e, err := event.Decode(r, mix.Clock)
		if err != nil {
			b.Fatal(err)
		}
		j.Add(e, e.Record(mix.Names{}), e.Time)
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
