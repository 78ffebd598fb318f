package live

import (
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich/node"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// The environment a flow is diagnosed in is made from the node's state as
// the watcher read it: its rules are the state's parsed rules, not a copy
// printed and parsed again at every change of the node.
func TestEnvSharesTheStatesParsedRules(t *testing.T) {
	st, err := node.FromSnapshot(&trace.Snapshot{Rules: map[string]string{
		"nat":     "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.1.5:8080\nCOMMIT\n",
		"ip6/nat": "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n",
	}})
	if err != nil {
		t.Fatal(err)
	}
	s := &states{node: "node-1"}
	s.seed(st)
	env := s.envAt(time.Now())
	for _, fam := range []rules.Family{rules.IPv4, rules.IPv6} {
		if got, want := env.Ruleset(fam), st.Ruleset(fam); got == nil || got != want {
			t.Errorf("%v: the env's rules %p, the state's %p", fam, got, want)
		}
	}
}
