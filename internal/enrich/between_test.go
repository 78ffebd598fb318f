package enrich

import (
	"strings"
	"testing"
	"time"

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
	j := &Joiner{Env: func(time.Time) Env { return env }, Emit: func(f *trace.Flow) { out = append(out, f) }}
	if next != "" {
		nextEnv := vipEnv(t, next)
		j.EnvAfter = func(time.Time) Env { return nextEnv }
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
