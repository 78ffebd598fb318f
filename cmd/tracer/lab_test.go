package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/lab"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/trace"
)

func TestLabStatusLine(t *testing.T) {
	s := &labStatus{total: 3}
	if text, alert := s.line(); text != "lab 0/3: 0 passed" || alert {
		t.Errorf("start: %q alert %v", text, alert)
	}
	s.start("hostport-hijack-clusterip")
	s.finish("hostport-hijack-clusterip", labPassed)
	s.start("ipvs-no-endpoint")
	s.finish("ipvs-no-endpoint", labSkipped)
	s.start("ping-clusterip")
	if text, _ := s.line(); text != "lab 2/3: 1 passed, 1 skipped · running ping-clusterip" {
		t.Errorf("running: %q", text)
	}
	s.finish("ping-clusterip", labFailed)
	s.recordFailed(errTest("record /x: no space left on device"))
	text, alert := s.line()
	if text != "lab 3/3: 1 passed, 1 FAILED (ping-clusterip), 1 skipped · record /x: no space left on device" || !alert {
		t.Errorf("end: %q alert %v", text, alert)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

func TestLabRecorderWritesEveryScenarioIntoOneTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lab.ndjson")
	if err := probeRecord(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the probe left %s behind (%v)", path, err)
	}
	run := func(node, dst string) *labRun {
		return &labRun{header: trace.Header{Type: trace.TypeHeader, Schema: trace.Schema, Node: node, Started: time.Unix(1, 0).UTC()},
			flows: []*trace.Flow{{Type: trace.TypeFlow, Time: time.Unix(2, 0).UTC(), Proto: "tcp",
				Orig: trace.Tuple{Src: "10.0.0.1:1", Dst: dst}, Verdict: trace.VerdictOK}}}
	}
	skipped := run("node-x", "10.0.0.9:9")
	skipped.result.Skipped = "needs IPVS"
	rec := &labRecorder{path: path}
	for _, r := range []*labRun{run("node-1", "10.0.0.2:80"), skipped, run("node-2", "10.0.0.3:80")} {
		if err := rec.add(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.close(); err != nil {
		t.Fatal(err)
	}
	tr, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Header.Node != "node-1" || len(tr.Flows) != 2 || tr.Flows[1].Orig.Dst != "10.0.0.3:80" {
		t.Errorf("header node %q, %d flows: want node-1's header and the two scenarios' flows", tr.Header.Node, len(tr.Flows))
	}
}

func TestLabRecordProbeIsBadUsage(t *testing.T) {
	err := probeRecord("/nonexistent-dir/lab.ndjson")
	var u usageError
	if !errors.As(err, &u) {
		t.Fatalf("error %v is not a usage error (exit 2)", err)
	}
}

// TestVMLabGuests: the VM matrix's share of the lab runs every scenario
// that needs IPVS (only the guests have it), names only real scenarios,
// and gives each guest some.
func TestVMLabGuests(t *testing.T) {
	scs := lab.Scenarios()
	guests := vmLabGuests(scs)
	names := map[string]bool{}
	for _, sc := range scs {
		names[sc.Name] = true
		if sc.NeedsIPVS && guests[sc.Name] == "" {
			t.Errorf("%s needs IPVS, which only the guests have, but no guest runs it", sc.Name)
		}
	}
	for name := range vmNFTLabScenarios {
		if !names[name] {
			t.Errorf("vmNFTLabScenarios names %q, which is no scenario", name)
		}
	}
	for _, name := range hostLabScenarios {
		if !names[name] {
			t.Errorf("hostLabScenarios names %q, which is no scenario", name)
		}
	}
	per := map[string]int{}
	for _, g := range guests {
		per[g]++
	}
	for _, k := range vmLabKernels {
		if per[k] == 0 {
			t.Errorf("the %s guest runs no scenario", k)
		}
	}
	t.Logf("scenarios per guest: %v of %d", per, len(scs))
}

type fakeCounted struct{ s live.Stats }

func (f *fakeCounted) Stats() live.Stats { return f.s }

// The lab's header counts every scenario's pipeline: those that ended and
// the one tracing now, so a scenario that lost events keeps saying so.
func TestLabStatusCountsEveryPipeline(t *testing.T) {
	st := &labStatus{total: 3}
	first := &fakeCounted{live.Stats{Events: 10, Lost: 2, ConntrackDrops: 1}}
	st.tracing(first)
	if got := st.counters(); got.Events != 10 || got.Lost != 2 {
		t.Errorf("while the first traces: %+v", got)
	}
	first.s.Events = 15
	st.traced(first)
	first.s.Events = 99 // its counters after it ended are not the lab's
	second := &fakeCounted{live.Stats{Events: 4, ConntrackOverruns: 1, ConntrackEndsEvicted: 3}}
	st.tracing(second)
	got := st.counters()
	want := live.Stats{Events: 19, Lost: 2, ConntrackOverruns: 1, ConntrackEndsEvicted: 3, ConntrackDrops: 1}
	if got != want {
		t.Errorf("while the second traces: %+v, want %+v", got, want)
	}
	st.traced(second)
	if got := st.counters(); got != want {
		t.Errorf("between scenarios: %+v, want %+v", got, want)
	}
}
