package diagnose

import (
	"net/netip"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// TestDiagnoseAllocations: diagnosing a flow allocates nothing of its own
// but its share of the explanations' arena, whatever the verdict. The
// diagnosis itself escaping to the heap (a list of func values it is
// passed through does that) is one allocation a flow.
func TestDiagnoseAllocations(t *testing.T) {
	noEndpoint := flow("tcp", "10.0.0.2:40000", "172.30.0.46:80", "", trace.KindReject, trace.KindDrop)
	noEndpoint.Rule = kubeServicesRule(svc6RejectSaved)
	noEndpoint.Service = &trace.ServiceRef{Namespace: "ns6", Name: "svc6", Port: "p80"}
	ping := flow("icmp", "10.0.0.2:0", "10.96.0.10:0", "", trace.KindReject)
	ping.Rule = &trace.Rule{Backend: trace.BackendNFTables, Family: "ip", Table: "kube-proxy", Chain: "cluster-ips-check",
		EntryChain: "filter-forward", Path: []string{"filter-forward", "cluster-ips-check"}, Text: "ip daddr @cluster-ips reject"}
	dropped := flow("tcp", "10.0.0.2:40000", "172.18.0.2:9999", "", trace.KindDrop)
	dropped.Rule = &trace.Rule{Table: "filter", Chain: "INPUT", EntryChain: "INPUT", Path: []string{"INPUT"}, Text: "-A INPUT -p tcp --dport 9999 -j DROP"}
	env := quietEnv{newEnv()}
	for name, f := range map[string]*trace.Flow{"service-no-endpoint": noEndpoint, "clusterip-reject": ping, "dropped": dropped} {
		a := AddrsOf(f)
		DiagnoseAddrs(f, a, env) // the rule's reading is remembered
		if n := testing.AllocsPerRun(2000, func() { DiagnoseAddrs(f, a, env) }); n > 0.2 {
			t.Errorf("%s: %.2f allocations a diagnosis, want only the arena's share", name, n)
		}
	}
}

// quietEnv is the fake node without IPVS services, whose lookup of one
// formats its key (an allocation of the test's own).
type quietEnv struct{ *fakeEnv }

func (quietEnv) IPVSService(string, netip.AddrPort) (trace.IPVSService, bool) {
	return trace.IPVSService{}, false
}
