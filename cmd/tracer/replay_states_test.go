package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// TestReplayRuleInForce replays a trace recorded while a VIP's DNAT rule
// was rewritten between two connections (TestRuleInForceAtDecision made
// it): each flow is attributed to the rule whose target the kernel's own
// dnat event confirms, the second one thanks to the state line. Without
// the line, as in a trace from before state lines, the trace still
// replays, and the second flow falls to the header's rule, which the
// attribution itself marks uncertain.
func TestReplayRuleInForce(t *testing.T) {
	agree := func(f *trace.Flow) bool {
		return len(f.Events) > 0 && f.Events[0].Kind == trace.KindDNAT && f.Rule != nil &&
			strings.HasSuffix(f.Rule.Text, "--to-destination "+f.Events[0].To) && f.Rule.Uncertain == ""
	}
	code, out, stderr := runTracer("replay", "-o", "json", rulesChangedFixture)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	tr, err := trace.ReadAll(strings.NewReader(out), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Flows) != 2 || len(tr.States) != 1 || tr.Flows[0].Events[0].To == tr.Flows[1].Events[0].To {
		t.Fatalf("want two flows DNAT'd to two backends and the state line between, got %d flows, %d states", len(tr.Flows), len(tr.States))
	}
	for _, f := range tr.Flows {
		if !agree(f) {
			t.Errorf("flow at %s, dnat to %s: rule %+v", f.Time, f.Events[0].To, f.Rule)
		}
	}

	data, err := os.ReadFile(rulesChangedFixture)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.SplitAfter(string(data), "\n") {
		if !strings.Contains(l, `"type":"state"`) {
			kept = append(kept, l)
		}
	}
	tr = replayText(t, "without the state line", strings.Join(kept, ""))
	if len(tr.Flows) != 2 || !agree(tr.Flows[0]) || agree(tr.Flows[1]) {
		t.Errorf("without the state line the first flow keeps its rule and the second falls to the header's: %+v, %+v", tr.Flows[0].Rule, tr.Flows[1].Rule)
	}

	// The rewrite read only after the second decision (the poll's lag):
	// the rules in force say backend A, the kernel chose B, and the state
	// read next says B, so B's rule decided.
	late := strings.Replace(string(data), `"type":"state","time":"2026-12-02T11:31:38.459803558Z"`, `"type":"state","time":"2026-12-02T11:31:39.900000000Z"`, 1)
	if late == string(data) {
		t.Fatal("the fixture's state line moved")
	}
	for _, f := range replayText(t, "state read late", late).Flows {
		if !agree(f) {
			t.Errorf("state read after the decision: flow at %s, dnat to %s: rule %+v", f.Time, f.Events[0].To, f.Rule)
		}
	}
}

// replayText replays a trace given as text with -o json and reads what it
// wrote.
func replayText(t *testing.T, what, text string) *trace.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.ndjson")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runTracer("replay", "-o", "json", path)
	if code != 0 {
		t.Fatalf("%s: exit %d: %s", what, code, stderr)
	}
	tr, err := trace.ReadAll(strings.NewReader(out), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}
