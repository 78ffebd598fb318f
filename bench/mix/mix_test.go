package mix

import (
	"io"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

func TestEncodeDecodes(t *testing.T) {
	for i := range Shapes {
		for _, e := range Generate(i) {
			got, err := event.Decode(Encode(nil, e, 5), event.Clock{})
			if err != nil {
				t.Fatalf("flow %d: %v", i, err)
			}
			e.Time = got.Time
			if e.Kind != event.KindIPVS {
				got.To.MaxAddr, got.To.MaxPort = e.To.MaxAddr, e.To.MaxPort
			}
			if !reflect.DeepEqual(got, e) {
				t.Errorf("flow %d:\n got %+v\nwant %+v", i, got, e)
			}
		}
	}
}

// wantVerdict is the verdict the pipeline must give each shape of the
// generated mix: a change to the diagnosis or to the mix that moves one
// fails the test.
var wantVerdict = [Shapes]string{
	trace.VerdictOK, trace.VerdictOK, trace.VerdictOK, trace.VerdictOK,
	trace.VerdictHostportHijack, trace.VerdictHostportHijack,
	trace.VerdictOK,
	trace.VerdictIPVSFilterReject,
	trace.VerdictIPVSFilterReject,
	trace.VerdictReset,
}

// wantRule says which shapes the pipeline must attribute to a rule: every
// one but the stack's reset, which no rule made.
var wantRule = [Shapes]bool{true, true, true, true, true, true, true, true, true, false}

func TestPipelineVerdicts(t *testing.T) {
	const cycles = 3
	flows := pipelineFlows(t, cycles)
	shapeOf := map[trace.Tuple]int{}
	for i := range cycles * Shapes {
		shapeOf[OrigOf(Generate(i))] = i % Shapes
	}
	seen := [Shapes]int{}
	for _, f := range flows {
		shape, ok := shapeOf[f.Orig]
		if !ok {
			t.Errorf("flow %s -> %s is not one the mix generated", f.Orig.Src, f.Orig.Dst)
			continue
		}
		seen[shape]++
		if f.Verdict != wantVerdict[shape] {
			t.Errorf("shape %d (%s): flow %s -> %s has verdict %q, want %q", shape, ShapeName(shape),
				f.Orig.Src, f.Orig.Dst, f.Verdict, wantVerdict[shape])
		}
		if (f.Rule != nil) != wantRule[shape] {
			t.Errorf("shape %d (%s): flow %s -> %s attributed to a rule: %v, want %v", shape, ShapeName(shape),
				f.Orig.Src, f.Orig.Dst, f.Rule != nil, wantRule[shape])
		}
	}
	for shape, n := range seen {
		if n != cycles {
			t.Errorf("shape %d (%s): %d flows, want %d", shape, ShapeName(shape), n, cycles)
		}
	}
}

// pipelineFlows runs cycles rotations of the generated mix through the
// pipeline and returns the flows it emitted.
func pipelineFlows(t *testing.T, cycles int) []*trace.Flow {
	t.Helper()
	env, err := Env()
	if err != nil {
		t.Fatal(err)
	}
	var flows []*trace.Flow
	p, err := NewPipeline(io.Discard, env)
	if err != nil {
		t.Fatal(err)
	}
	emit := p.Stages.Enrich.Emit
	p.Stages.Enrich.Emit = func(f *trace.Flow) { flows = append(flows, f); emit(f) }
	p.Stages.Join.ReuseFlows = false // the flows are kept
	for _, r := range Records(Shapes*cycles, time.Millisecond) {
		p.Feed(r)
	}
	p.Finish()
	if p.Errors != 0 || p.Events != cycles*EventsPerCycle || len(flows) != cycles*Shapes {
		t.Fatalf("errors %d, events %d (want %d), flows %d (want %d)", p.Errors, p.Events, cycles*EventsPerCycle,
			len(flows), cycles*Shapes)
	}
	return flows
}

// BenchmarkPipeline is decode -> trace form -> join -> enrich/diagnose ->
// encode (to io.Discard) per event of the generated mix, on one goroutine:
// what the live pipeline does per ring buffer record. Events arrive 10 µs
// apart in the events' clock (100,000 events/s, 10 flows per 13 events),
// so once the first flows expire 115,000 to 123,000 are open at once (1.5 s
// linger, expiry every 100 ms).
func BenchmarkPipeline(b *testing.B) {
	env, err := Env()
	if err != nil {
		b.Fatal(err)
	}
	const gap = 10 * time.Microsecond
	replay := NewReplay(Records(200_000, gap), gap)
	p, err := NewPipeline(io.Discard, env)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for b.Loop() {
		p.Feed(replay.Next())
	}
	b.StopTimer()
	if p.Errors != 0 {
		b.Fatalf("%d errors", p.Errors)
	}
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(p.Events)/b.Elapsed().Seconds(), "events/s")
	// allocs/op without its rounding down: the target is two.
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(max(p.Events, 1)), "allocs/event")
	// Flows are emitted only once quiet for the linger: how many were
	// says how much of the run was past the joiner's filling.
	b.ReportMetric(float64(p.Flows)/float64(max(p.Events, 1)), "flows/event")
	// A miss of the attribution cache is a walk of the rules.
	hits, misses := env.AttributionCacheStats()
	b.ReportMetric(float64(misses)/float64(max(hits+misses, 1)), "walks/attribution")
}
