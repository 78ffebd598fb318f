package rules

import (
	"strings"
	"testing"
)

// The filter rules kube-proxy's iptables mode writes for Services without
// (local) endpoints, as its own tests expect them (the fixture's first
// line says where from). The rule texts below are that fixture's lines.
const (
	svc6NoEndpoints = `-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT`
	svc2ExternalIP  = `-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j DROP`
	svc2LBIP        = `-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP`
	svc2NodePort    = `-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP`
)

// kubeProxyNode is kube-proxy's test node: its address is testNodeIP
// (192.168.0.2) of proxier_test.go.
func kubeProxyNode(t *testing.T) *MemNode {
	t.Helper()
	n := NewMemNode()
	if err := n.AddLocal("192.168.0.2", "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAttributeKubeProxyNoEndpoints walks kube-proxy's real filter rules
// for the first packet of a connection, from the base chain the kernel
// runs for it (FORWARD for a pod's, OUTPUT for the node's own, INPUT for
// one to a node address), and checks the kernel's REJECT or DROP lands on
// the exact rule kube-proxy wrote. The expected outcomes are kube-proxy's
// own: TestTracePacket's "REJECT" and "DROP" and TestNoEndpointsReject.
func TestAttributeKubeProxyNoEndpoints(t *testing.T) {
	rs := loadSave(t, "kube-proxy-iptables-filter.save")
	n := kubeProxyNode(t)
	reject := KernelAction{Kind: ActionReject, ICMPType: 3, ICMPCode: 3}
	drop := KernelAction{Kind: ActionDrop}
	cases := []struct {
		name    string
		pkt     Packet
		hook    string
		act     KernelAction
		rule    string
		path    string
		verdict Verdict
	}{
		{"pod to ClusterIP", tcp("10.0.0.2:40000", "172.30.0.46:80"), "FORWARD", reject, svc6NoEndpoints, "FORWARD → KUBE-SERVICES", VerdictReject},
		{"pod to ClusterIP, the REJECT's drop", tcp("10.0.0.2:40000", "172.30.0.46:80"), "FORWARD", drop, svc6NoEndpoints, "FORWARD → KUBE-SERVICES", VerdictReject},
		{"node to ClusterIP", tcp("192.168.0.2:40000", "172.30.0.46:80"), "OUTPUT", reject, svc6NoEndpoints, "OUTPUT → KUBE-SERVICES", VerdictReject},
		{"external to external IP", tcp("203.0.113.2:40000", "192.168.99.22:80"), "FORWARD", drop, svc2ExternalIP, "FORWARD → KUBE-EXTERNAL-SERVICES", VerdictDrop},
		{"external to LB IP", tcp("203.0.113.2:40000", "1.2.3.4:80"), "FORWARD", drop, svc2LBIP, "FORWARD → KUBE-EXTERNAL-SERVICES", VerdictDrop},
		{"external to NodePort on the node's address", tcp("203.0.113.2:40000", "192.168.0.2:3001"), "INPUT", drop, svc2NodePort, "INPUT → KUBE-EXTERNAL-SERVICES", VerdictDrop},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.act.Hook = c.hook
			at, err := rs.Attribute(c.pkt, n, c.act)
			if err != nil {
				t.Fatal(err)
			}
			if at.Uncertain {
				t.Fatalf("uncertain: %s", at.Reason())
			}
			o := at.Result.Outcome
			if o.Rule == nil || o.Rule.Text != c.rule {
				t.Fatalf("outcome %s, want the rule %s", o.String(), c.rule)
			}
			if o.Verdict != c.verdict || o.PathString() != c.path || at.Result.Table != "filter" {
				t.Errorf("verdict %s table %s path %q, want %s filter %q", o.Verdict, at.Result.Table, o.PathString(), c.verdict, c.path)
			}
			if at.Owner != nil {
				t.Errorf("a kube-proxy rule with a portmap owner %+v", at.Owner)
			}
		})
	}
}

// Near misses: the kernel's action, or the packet, is not what these
// rules do, so none of them may be named.
func TestAttributeKubeProxyNoEndpointsNearMisses(t *testing.T) {
	rs := loadSave(t, "kube-proxy-iptables-filter.save")
	n := kubeProxyNode(t)
	established := tcp("10.0.0.2:40000", "172.30.0.46:80")
	established.State = CTEstablished
	cases := []struct {
		name string
		pkt  Packet
		act  KernelAction
	}{
		// The jumps to KUBE-SERVICES take only --ctstate NEW.
		{"established packet to the ClusterIP", established, KernelAction{Kind: ActionDrop, Hook: "FORWARD"}},
		// Another port of the ClusterIP: no rule of the Service.
		{"other port", tcp("10.0.0.2:40000", "172.30.0.46:81"), KernelAction{Kind: ActionReject, Hook: "FORWARD", ICMPType: 3, ICMPCode: 3}},
		// REJECT sends port-unreachable; the kernel sent host-prohibited.
		{"other ICMP error", tcp("10.0.0.2:40000", "172.30.0.46:80"), KernelAction{Kind: ActionReject, Hook: "FORWARD", ICMPType: 3, ICMPCode: 10}},
		// The NodePort rule wants a local destination.
		{"NodePort on a foreign address", tcp("203.0.113.2:40000", "10.9.9.9:3001"), KernelAction{Kind: ActionDrop, Hook: "FORWARD"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			at, err := rs.Attribute(c.pkt, n, c.act)
			if err != nil {
				t.Fatal(err)
			}
			if !at.Uncertain || !strings.Contains(at.Reason(), "agrees with the kernel") {
				t.Errorf("uncertain %v (%s), outcome %s: want no rule agreeing", at.Uncertain, at.Reason(), at.Result.Outcome.String())
			}
		})
	}
}
