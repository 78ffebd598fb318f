package enrich_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/tests/vm/guest"
)

// The mix, joined, enriched and written as the live pipeline does it,
// reads the same byte for byte whether each flow
// is a new allocation or reuses an emitted flow's memory.
func TestReuseFlowsWritesTheSame(t *testing.T) {
	guest.SkipKernelIndependent(t)
	fresh, fb := writeMix(t, false)
	reused, rb := writeMix(t, true)
	if fb.flows < 1000 || fb.blocks != fb.flows {
		t.Fatalf("without reuse: %d flows in %d blocks; want over 1,000, each its own", fb.flows, fb.blocks)
	}
	if rb.flows != fb.flows || rb.blocks > fb.flows/10 {
		t.Errorf("with reuse: %d flows in %d blocks; want %d flows in a tenth as many", rb.flows, rb.blocks, fb.flows)
	}
	t.Logf("%d flows: %d blocks fresh, %d reused", fb.flows, fb.blocks, rb.blocks)
	if !bytes.Equal(fresh, reused) {
		a, b := bytes.Split(fresh, []byte("\n")), bytes.Split(reused, []byte("\n"))
		for i := range min(len(a), len(b)) {
			if !bytes.Equal(a[i], b[i]) {
				t.Fatalf("line %d differs:\nfresh  %s\nreused %s", i, a[i], b[i])
			}
		}
		t.Fatalf("%d lines fresh, %d reused", len(a), len(b))
	}
}

type emitted struct{ flows, blocks int }

// writeMix runs 6,000 connections of the mix through mix.NewPipeline,
// which expires flows every 100 ms of the events' clock as the live
// pipeline does, and returns its NDJSON.
func writeMix(t *testing.T, reuse bool) ([]byte, emitted) {
	t.Helper()
	env, err := mix.Env()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	p, err := mix.NewPipeline(&buf, env)
	if err != nil {
		t.Fatal(err)
	}
	p.Stages.Join.ReuseFlows = reuse
	var n emitted
	seen := map[*trace.Flow]bool{}
	emit := p.Stages.Enrich.Emit
	p.Stages.Enrich.Emit = func(f *trace.Flow) {
		n.flows++
		if !seen[f] {
			seen[f] = true
			n.blocks++
		}
		emit(f)
	}
	for _, r := range mix.Records(6000, 500*time.Microsecond) {
		p.Feed(r)
	}
	p.Finish()
	if p.Errors != 0 {
		t.Fatalf("%d errors in the pipeline", p.Errors)
	}
	return buf.Bytes(), n
}
