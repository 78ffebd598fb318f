package enrich_test

import (
	"testing"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/trace"
)

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
