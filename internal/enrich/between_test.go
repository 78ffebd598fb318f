package enrich

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// vipRules DNATs the VIP 10.96.0.1:80 to backend.
func vipRules(backend string) string {
	return "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n" +
		"-A PREROUTING -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination " + backend + "\nCOMMIT\n"
}

func vipEnv(t *testing.T, backend string) Env {
	t.Helper()
	env, err := NewNodeEnv("node-1", &trace.Snapshot{Rules: map[string]string{"nat": vipRules(backend)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// joinBetween joins one DNAT to 10.0.0.2:80 with the rules in force
// (inForce) and those read next (next, "" for none yet).
func joinBetween(t *testing.T, inForce, next string) *trace.Flow {
	t.Helper()
	env := vipEnv(t, inForce)
	var out []*trace.Flow
	j := NewStages(&join.Joiner{}, &Enricher{Env: func(time.Time) Env { return env }, Emit: func(f *trace.Flow) { out = append(out, f) }})
	if next != "" {
		nextEnv := vipEnv(t, next)
		j.Enrich.EnvAfter = func(time.Time) Env { return nextEnv }
	}
	j.Add(dnatTo("10.1.0.9:40000", "10.96.0.1:80", "10.0.0.2:80"), time.Unix(1700000000, 0))
	j.Flush()
	if len(out) != 1 {
		t.Fatalf("%d flows", len(out))
	}
	return out[0]
}

// The kernel DNAT'd to 10.0.0.2 while the last reading of the rules said
// 10.0.0.1: the rules changed between two readings. The next reading's
// rule agrees with the kernel, so it is the rule that decided.
func TestEnrichBetweenReadings(t *testing.T) {
	f := joinBetween(t, "10.0.0.1:80", "10.0.0.2:80")
	if f.Rule == nil || !strings.Contains(f.Rule.Text, "10.0.0.2:80") || f.Rule.Uncertain != "" {
		t.Errorf("rule %+v: want the next reading's rule to 10.0.0.2:80, certain", f.Rule)
	}
	// No reading after the decision yet: the rule in force, uncertain.
	f = joinBetween(t, "10.0.0.1:80", "")
	if f.Rule == nil || !strings.Contains(f.Rule.Text, "10.0.0.1:80") || f.Rule.Uncertain == "" {
		t.Errorf("without a next reading: rule %+v, want the rule in force, uncertain", f.Rule)
	}
	// The next reading does not agree either: the rule in force stays.
	f = joinBetween(t, "10.0.0.1:80", "10.0.0.3:80")
	if f.Rule == nil || !strings.Contains(f.Rule.Text, "10.0.0.1:80") || f.Rule.Uncertain == "" {
		t.Errorf("next reading disagrees too: rule %+v, want the rule in force, uncertain", f.Rule)
	}
	// The rule in force agrees: the next reading is not asked.
	f = joinBetween(t, "10.0.0.2:80", "10.0.0.3:80")
	if f.Rule == nil || !strings.Contains(f.Rule.Text, "10.0.0.2:80") || f.Rule.Uncertain != "" {
		t.Errorf("rule in force agrees: rule %+v", f.Rule)
	}
}

// A flow whose rule is uncertain and that no reading after its decision
// settles yet is held for one (HoldFor): the reading that comes settles
// it; without one, it leaves with the rule in force, uncertain, once its
// wait is over.
func TestEnricherHoldsUncertainFlowForNextReading(t *testing.T) {
	inForce, nextEnv := vipEnv(t, "10.0.0.1:80"), vipEnv(t, "10.0.0.2:80")
	var next Env
	var out []*trace.Flow
	j := NewStages(&join.Joiner{Linger: time.Second}, &Enricher{HoldFor: 3 * time.Second,
		Env: func(time.Time) Env { return inForce }, EnvAfter: func(time.Time) Env { return next },
		Emit: func(f *trace.Flow) { out = append(out, f) }})
	t0 := time.Unix(1700000000, 0)
	holdFirst(t, j, t0, func() int { return len(out) })
	next = nextEnv
	j.Expire(t0.Add(2 * time.Second))
	if len(out) != 1 || j.Open() != 0 {
		t.Fatalf("%d flows out, %d open after the next reading", len(out), j.Open())
	}
	if r := out[0].Rule; r == nil || !strings.Contains(r.Text, "10.0.0.2:80") || r.Uncertain != "" {
		t.Errorf("rule %+v: want the next reading's, certain", r)
	}

	next, out = nil, nil
	j.Add(dnatTo("10.1.0.9:40001", "10.96.0.1:80", "10.0.0.2:80"), t0.Add(10*time.Second))
	j.Expire(t0.Add(11100 * time.Millisecond))
	j.Expire(t0.Add(14 * time.Second))
	if len(out) != 0 {
		t.Fatal("left before its wait was over")
	}
	j.Expire(t0.Add(14200 * time.Millisecond))
	if len(out) != 1 || out[0].Rule == nil || out[0].Rule.Uncertain == "" {
		t.Fatalf("after the wait: %d flows, want the flow with the rule in force, uncertain", len(out))
	}
}

// holdFirst adds a flow at t0 whose rule the enricher's readings leave
// uncertain, and checks that the end of its linger holds it.
func holdFirst(t *testing.T, j *Stages, t0 time.Time, emitted func() int) {
	t.Helper()
	j.Add(dnatTo("10.1.0.9:40000", "10.96.0.1:80", "10.0.0.2:80"), t0)
	j.Expire(t0.Add(1100 * time.Millisecond))
	if emitted() != 0 || j.Open() != 1 {
		t.Fatalf("%d flows out, %d open: the uncertain flow was not held", emitted(), j.Open())
	}
}

// A held flow keeps its memory while it waits (the enricher keeps it from
// the joiner's ReuseFlows): flows that
// finish and leave meanwhile reuse theirs, not its, and it leaves as it
// was held.
func TestEnricherHoldsItsFlowsMemory(t *testing.T) {
	inForce, certain := vipEnv(t, "10.0.0.1:80"), vipEnv(t, "10.0.0.2:80")
	env := inForce
	var next Env
	var out []string
	seen := map[*trace.Flow]int{}
	j := NewStages(&join.Joiner{Linger: time.Second, ReuseFlows: true}, &Enricher{HoldFor: 3 * time.Second,
		Env: func(time.Time) Env { return env }, EnvAfter: func(time.Time) Env { return next },
		Emit: func(f *trace.Flow) {
			b, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(b))
			seen[f]++
		}})
	t0 := time.Unix(1700000000, 0)
	holdFirst(t, j, t0, func() int { return len(out) })
	// Flows of the same shape that the rule in force decides for certain
	// leave one by one while the first is held.
	env = certain
	for i := range 5 {
		at := t0.Add(time.Duration(2+i) * 100 * time.Millisecond)
		j.Add(dnatTo(fmt.Sprintf("10.1.0.%d:%d", 10+i, 41000+i), "10.96.0.1:80", "10.0.0.2:80"), at)
		j.Expire(at.Add(1100 * time.Millisecond))
	}
	if len(out) != 5 || j.Open() != 1 {
		t.Fatalf("%d flows out, %d open; want the 5 certain ones out and the held one open", len(out), j.Open())
	}
	if len(seen) != 1 {
		t.Errorf("5 flows left one by one in %d blocks; want one, reused", len(seen))
	}
	for i, s := range out {
		if !strings.Contains(s, fmt.Sprintf(`"src":"10.1.0.%d:%d"`, 10+i, 41000+i)) {
			t.Errorf("flow %d reads %s", i, s)
		}
	}
	next = certain
	j.Expire(t0.Add(3 * time.Second))
	if len(out) != 6 {
		t.Fatalf("%d flows out after the next reading; want 6", len(out))
	}
	held := out[5]
	if !strings.Contains(held, `"src":"10.1.0.9:40000"`) || strings.Count(held, `"kind":"dnat"`) != 1 {
		t.Errorf("the held flow left as %s", held)
	}
}

// At exit a held flow leaves with the rest: settled when a reading after
// its decision has come by then, else with the rule in force, uncertain.
// A flow the join finishes at its own Flush is not held: nothing waits
// for a later reading at exit.
func TestEnricherFlushReleasesHeldFlows(t *testing.T) {
	for _, tc := range []struct {
		name      string
		next      string // "" : no reading after the decision
		wantTo    string
		uncertain bool
	}{
		{"settled at exit", "10.0.0.2:80", "10.0.0.2:80", false},
		{"unsettled at exit", "", "10.0.0.1:80", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inForce := vipEnv(t, "10.0.0.1:80")
			var next Env
			var out []*trace.Flow
			j := NewStages(&join.Joiner{Linger: time.Second}, &Enricher{HoldFor: time.Hour,
				Env: func(time.Time) Env { return inForce }, EnvAfter: func(time.Time) Env { return next },
				Emit: func(f *trace.Flow) { out = append(out, f) }})
			t0 := time.Unix(1700000000, 0)
			holdFirst(t, j, t0, func() int { return len(out) })
			// The second flow is still open at the Flush, which finishes it
			// unheld although its rule is just as uncertain.
			j.Add(dnatTo("10.1.0.9:40001", "10.96.0.1:80", "10.0.0.2:80"), t0.Add(2*time.Second))
			if tc.next != "" {
				next = vipEnv(t, tc.next)
			}
			j.Join.Flush()
			if held := j.Enrich.Held(); held != 1 {
				t.Fatalf("%d flows held after the join's Flush; want the first only", held)
			}
			j.Enrich.Flush()
			if len(out) != 2 || j.Open() != 0 {
				t.Fatalf("%d flows out, %d open after the Flush; want both out", len(out), j.Open())
			}
			for _, f := range out {
				if f.Rule == nil || !strings.Contains(f.Rule.Text, tc.wantTo) || (f.Rule.Uncertain != "") != tc.uncertain {
					t.Errorf("flow from %s: rule %+v; want the rule to %s, uncertain %v", f.Orig.Src, f.Rule, tc.wantTo, tc.uncertain)
				}
			}
		})
	}
}
