package enrich

import (
	"os"
	"slices"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// kubeProxyNode is a node in kube-proxy's iptables mode whose filter table
// is kube-proxy's own (the rules package's fixture from kubernetes
// v1.37.2's proxier_test.go): node address 192.168.0.2, Service ns6/svc6
// without endpoints, ns2/svc2 with externalTrafficPolicy Local and no
// endpoint on this node.
func kubeProxyNode(t *testing.T) *trace.Snapshot {
	t.Helper()
	filter, err := os.ReadFile("../rules/testdata/kube-proxy-iptables-filter.save")
	if err != nil {
		t.Fatal(err)
	}
	return &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "192.168.0.2/24", Up: true}},
		Rules:     map[string]string{"filter": string(filter)},
		Pods:      []trace.Pod{{Namespace: "ns1", Name: "client", IPs: []string{"10.0.0.2"}, Node: "node-1"}},
		Services: []trace.Service{
			{Namespace: "ns6", Name: "svc6", Type: "ClusterIP", ClusterIPs: []string{"172.30.0.46"},
				Ports: []trace.ServicePort{{Name: "p80", Proto: "TCP", Port: 80}}},
			{Namespace: "ns2", Name: "svc2", Type: "LoadBalancer", ClusterIPs: []string{"172.30.0.42"}, External: []string{"192.168.99.22"},
				LBIPs: []string{"1.2.3.4"}, ETP: "Local", Ports: []trace.ServicePort{{Name: "p80", Proto: "TCP", Port: 80, NodePort: 3001}}},
		},
	}
}

// netfilterDrop names every drop reason NETFILTER_DROP, as the loader
// does for the kernel's number of it.
type netfilterDrop struct{}

func (netfilterDrop) DropReason(uint32) string  { return "NETFILTER_DROP" }
func (netfilterDrop) ResetReason(uint32) string { return "" }

func joinOn(t *testing.T, snap *trace.Snapshot, evs ...event.Event) *trace.Flow {
	t.Helper()
	out := joinOnNode(t, "node-1", snap, netfilterDrop{}, evs...)
	if len(out) != 1 {
		t.Fatalf("%d flows, want one", len(out))
	}
	return out[0]
}

// TestJoinServiceNoEndpoint joins the kernel's events for connections to
// kube-proxy's no-endpoint Services and checks the flow names the rule
// kube-proxy wrote for them (the fixture's line), the chain path from the
// base chain the kernel ran, the Service, and the verdict. The netfilter
// tier sees an ICMP error where it leaves (OUTPUT); the rejected packet
// itself was forwarded.
func TestJoinServiceNoEndpoint(t *testing.T) {
	const (
		reject   = `-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT`
		nodePort = `-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP`
		localOut = 3 // NF_INET_LOCAL_OUT
	)
	cases := []struct {
		name      string
		evs       []event.Event
		rule      string
		path      []string
		service   string
		wantEvent string
	}{
		{"pod to ClusterIP, icmp_send tracepoint and the REJECT's drop",
			[]event.Event{rejectEvent(event.ViaTracepoint, event.NFHookNone, "10.0.0.2:40000", "172.30.0.46:80"), dropEvent("10.0.0.2:40000", "172.30.0.46:80")},
			reject, []string{"FORWARD", "KUBE-SERVICES"}, "ns6/svc6", trace.KindReject},
		{"pod to ClusterIP, ICMP error seen leaving by the netfilter tier",
			[]event.Event{rejectEvent(event.ViaNetfilter, localOut, "10.0.0.2:40000", "172.30.0.46:80")},
			reject, []string{"FORWARD", "KUBE-SERVICES"}, "ns6/svc6", trace.KindReject},
		{"node to ClusterIP",
			[]event.Event{rejectEvent(event.ViaTracepoint, event.NFHookNone, "192.168.0.2:40000", "172.30.0.46:80")},
			reject, []string{"OUTPUT", "KUBE-SERVICES"}, "ns6/svc6", trace.KindReject},
		{"node to ClusterIP, netfilter tier",
			[]event.Event{rejectEvent(event.ViaNetfilter, localOut, "192.168.0.2:40000", "172.30.0.46:80")},
			reject, []string{"OUTPUT", "KUBE-SERVICES"}, "ns6/svc6", trace.KindReject},
		{"external client to the NodePort of an ETP=Local Service",
			[]event.Event{dropEvent("203.0.113.2:40000", "192.168.0.2:3001")},
			nodePort, []string{"INPUT", "KUBE-EXTERNAL-SERVICES"}, "ns2/svc2", trace.KindDrop},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := joinOn(t, kubeProxyNode(t), c.evs...)
			if f.Verdict != trace.VerdictServiceNoEndpoint {
				t.Fatalf("verdict %s, rule %+v: %s", f.Verdict, f.Rule, f.Explanation)
			}
			r := f.Rule
			if r == nil || r.Text != c.rule || r.Table != "filter" || r.Uncertain != "" || !slices.Equal(r.Path, c.path) {
				t.Fatalf("rule %+v, want %s via %v", r, c.rule, c.path)
			}
			if f.Service == nil || f.Service.Namespace+"/"+f.Service.Name != c.service || f.Service.Port != "p80" {
				t.Errorf("service %+v, want %s port p80", f.Service, c.service)
			}
			if f.Events[0].Kind != c.wantEvent {
				t.Errorf("first event %s, want %s", f.Events[0].Kind, c.wantEvent)
			}
		})
	}
}
