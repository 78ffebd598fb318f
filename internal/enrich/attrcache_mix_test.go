package enrich_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/tests/vm/guest"
)

// uncached hides the NodeEnv's attribution cache: only Env's methods are
// promoted.
type uncached struct{ enrich.Env }

// TestAttributionCacheMatchesWalk enriches every flow of the benchmark mix
// (hostPorts, hijacked ClusterIPs, SNAT, IPVS filter rejects, resets) with
// the cache and without it: the flows must come out the same, the cached
// pass after the walks have filled the cache included.
func TestAttributionCacheMatchesWalk(t *testing.T) {
	guest.SkipKernelIndependent(t)
	env, err := mix.Env()
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	walked, cached := mixFlows(t, n), mixFlows(t, n)
	again := mixFlows(t, n)
	for i := range walked {
		enrich.Enrich(walked[i], uncached{env})
		enrich.Enrich(cached[i], env)
	}
	for i := range again {
		enrich.Enrich(again[i], env)
	}
	for i := range walked {
		w, c, a := flowJSON(t, walked[i]), flowJSON(t, cached[i]), flowJSON(t, again[i])
		if c != w || a != w {
			t.Fatalf("flow %d:\nwalked %s\ncached %s\nagain  %s", i, w, c, a)
		}
	}
	hits, misses := env.AttributionCacheStats()
	t.Logf("%d flows twice: %d hits, %d misses", len(walked), hits, misses)
	if hits == 0 || misses == 0 || hits+misses > uint64(2*len(walked)) {
		t.Errorf("%d hits and %d misses for %d attributions", hits, misses, 2*len(walked))
	}
}

// mixFlows is the mix joined into flows, not yet enriched, in the order
// of their times.
func mixFlows(t testing.TB, n int) []*trace.Flow {
	t.Helper()
	var out []*trace.Flow
	j := &join.Joiner{Names: mix.Names{}, Emit: func(f *join.Flow) { out = append(out, f.Record) }}
	evs, err := mix.Events(n, time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range evs {
		j.Add(d, d.Time)
	}
	j.Flush()
	// Flush emits in no particular order.
	slices.SortFunc(out, func(a, b *trace.Flow) int {
		if c := a.Time.Compare(b.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Orig.Src+a.Orig.Dst, b.Orig.Src+b.Orig.Dst)
	})
	return out
}

func flowJSON(t *testing.T, f *trace.Flow) string {
	t.Helper()
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
