package diagnose

import (
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// incidentCases are the hostport-hijack and IPVS-filter explanations'
// forms.
func incidentCases() []struct {
	name, verdict string
	f             func() *trace.Flow
} {
	pmNFT := func(path ...string) *trace.Rule {
		return &trace.Rule{Backend: trace.BackendNFTables, Family: "ip", Table: "cni_hostport", Chain: "hostports", Handle: 18,
			EntryChain: "prerouting", Path: path, Text: `tcp dport 30123 dnat to 10.180.0.6:8080 comment "45cd2b"`,
			Owner: &trace.Owner{ContainerID: "45cd2b", Pod: &trace.PodRef{Namespace: "web", Name: "hp-np"}}}
	}
	return []struct {
		name, verdict string
		f             func() *trace.Flow
	}{{
		name: "iptables hostPort takes a ClusterIP on kube-ipvs0 and its host listener's port", verdict: trace.VerdictHostportHijack,
		f: func() *trace.Flow {
			f := flow("tcp", "10.244.2.9:40000", "10.96.0.10:80", "10.244.1.5:80", trace.KindDNAT)
			f.Rule = portmapRule
			f.Service = &trace.ServiceRef{Namespace: "web", Name: "front", Port: "80"}
			f.DstPod = &trace.PodRef{Namespace: "ns-b", Name: "hp-1"}
			return f
		},
	}, {
		name: "nftables hostPort before v1.9 takes an address of another node", verdict: trace.VerdictHostportHijack,
		f: func() *trace.Flow {
			f := flow("tcp", "10.180.0.2:40000", "203.0.113.7:30123", "10.180.0.6:8080", trace.KindDNAT)
			f.Rule = pmNFT("prerouting", "hostports")
			return f
		},
	}, {
		name: "nftables hostPort takes a NodePort by hook order", verdict: trace.VerdictHostportHijack,
		f: func() *trace.Flow {
			f := flow("tcp", "10.180.0.2:40000", "192.168.1.10:30123", "10.180.0.6:8080", trace.KindDNAT)
			f.Rule = pmNFT("prerouting", "hostports_all", "hostports")
			f.Service = &trace.ServiceRef{Namespace: "web", Name: "np", Port: "http"}
			return f
		},
	}, {
		name: "KUBE-IPVS-FILTER refuses a LoadBalancer IP's other port", verdict: trace.VerdictIPVSFilterReject,
		f: func() *trace.Flow {
			f := flow("tcp", "10.244.1.7:40000", "192.168.1.200:443", "", trace.KindReject, trace.KindDrop)
			f.Rule = filterRule
			f.Service = &trace.ServiceRef{Namespace: "web", Name: "web"}
			return f
		},
	}, {
		name: "ping to a ClusterIP, unattributed", verdict: trace.VerdictIPVSFilterReject,
		f: func() *trace.Flow {
			f := flow("icmp", "10.244.1.7", "10.96.0.10", "", trace.KindReject)
			f.Events[0].Reason = ""
			return f
		},
	}, {
		name: "ping6 to a ClusterIP", verdict: trace.VerdictIPVSFilterReject,
		f: func() *trace.Flow {
			f := flow("icmpv6", "fd00:10:244:1::7", "fd00:10:96::a", "", trace.KindReject, trace.KindDrop)
			f.Events[0].Reason = "icmp6-port-unreachable"
			f.Rule = filterRule6
			return f
		},
	}, {
		name: "a port on an address with no service port", verdict: trace.VerdictIPVSFilterReject,
		f: func() *trace.Flow {
			f := flow("udp", "10.244.1.7:5000", "10.96.0.99:53", "", trace.KindReject)
			f.Rule = filterRule
			return f
		},
	}}
}

// TestIncidentExplanationsWordForWord holds the hostport-hijack and
// IPVS-filter explanations to the letter, in each of their forms; they
// are written piece by piece into one buffer.
func TestIncidentExplanationsWordForWord(t *testing.T) {
	want := map[string]string{
		"iptables hostPort takes a ClusterIP on kube-ipvs0 and its host listener's port": "hijacked: 10.96.0.10:80 (Service web/front) was DNAT'd to 10.244.1.5:80 (pod ns-b/hp-1) by the hostPort rule of pod ns-b/mysql-b in chain CNI-DN-733b5c318e3a34b1f1ddf, bypassing Service web/front and the host listener on 0.0.0.0:80 (hostNetwork pod ingress/ingress-agent). Why: kube-ipvs0 makes every ClusterIP and LB IP local, so portmap's `-m addrtype --dst-type LOCAL` jump to CNI-HOSTPORT-DNAT matches them, and its DNAT runs before IPVS sees the packet. Rule `-A CNI-DN-733b5c318e3a34b1f1ddf -p tcp -m tcp --dport 3306 -j DNAT --to-destination 10.244.1.5:3306` (table nat, chain path PREROUTING → CNI-HOSTPORT-DNAT → CNI-DN-733b5c318e3a34b1f1ddf). No socket holds a hostPort, so ss, netstat, lsof and ipvsadm show nothing. Fix: remove hostPort 80 from pod ns-b/mysql-b or move it to a port no Service, NodePort or host listener uses; a hostNetwork listener and a hostPort on the same port conflict: pick one.",
		"nftables hostPort before v1.9 takes an address of another node":                 "hijacked: 203.0.113.7:30123 was DNAT'd to 10.180.0.6:8080 by the hostPort rule of pod web/hp-np in chain hostports, bypassing the destination 203.0.113.7:30123 itself, which is not an address of this node. Why: portmap's nftables backend before v1.9 (v1.6.1 to v1.8.x) jumps from its prerouting chain to hostports with no locality check, so it captures every packet to that port whatever the destination: traffic to ClusterIPs routed through this node and to addresses outside the cluster included, which is worse than the iptables backend. nftables rule `tcp dport 30123 dnat to 10.180.0.6:8080 comment \"45cd2b\"` (table ip cni_hostport, chain path prerouting → hostports, handle 18). No socket holds a hostPort, so ss, netstat, lsof and ipvsadm show nothing. Fix: remove hostPort 30123 from pod web/hp-np or move it to a port no Service, NodePort or host listener uses; and upgrade portmap to v1.9 or later, whose nftables backend captures only the node's own addresses.",
		"nftables hostPort takes a NodePort by hook order":                               "hijacked: 192.168.1.10:30123 (Service web/np) was DNAT'd to 10.180.0.6:8080 by the hostPort rule of pod web/hp-np in chain hostports, bypassing Service web/np. Why: portmap's nftables backend (v1.9 and later) jumps to hostports_all for `fib daddr type local`, which matches every address local to the node; kube-proxy's nat-prerouting and portmap's prerouting chain both hook prerouting at priority dstnat; of base chains with the same priority the one registered last runs first, and a connection keeps the first DNAT it gets, so portmap's rule took it before kube-proxy's Service rules could. nftables rule `tcp dport 30123 dnat to 10.180.0.6:8080 comment \"45cd2b\"` (table ip cni_hostport, chain path prerouting → hostports_all → hostports, handle 18). No socket holds a hostPort, so ss, netstat, lsof and ipvsadm show nothing. Fix: remove hostPort 30123 from pod web/hp-np or move it to a port no Service, NodePort or host listener uses.",
		"KUBE-IPVS-FILTER refuses a LoadBalancer IP's other port":                        "rejected by KUBE-IPVS-FILTER: tcp port 443 to 192.168.1.200:443 (Service web/web) is refused because 192.168.1.200 is bound to kube-ipvs0 (ipset KUBE-IPVS-IPS) while kube-proxy's ipsets accept only tcp:80 there, so the filter (kube-proxy IPVS mode ≥ 1.26) REJECTs new connections with icmp-port-unreachable. Rule `-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable` (table filter, chain path INPUT → KUBE-IPVS-FILTER). The LoadBalancer IP of Service web/web is bound to kube-ipvs0 on every node, so in-cluster traffic to it never reaches the cloud load balancer and only the ports of this Service answer. Fix: have the cloud controller publish a hostname in the Service status, or set ipMode: Proxy (Kubernetes ≥ 1.30).",
		"ping to a ClusterIP, unattributed":                                              "rejected by KUBE-IPVS-FILTER: ICMP (ping) to 10.96.0.10 is refused because 10.96.0.10 is bound to kube-ipvs0 (ipset KUBE-IPVS-IPS) while kube-proxy's ipsets accept only tcp:80 there, so the filter (kube-proxy IPVS mode ≥ 1.26) REJECTs new connections with icmp-port-unreachable. The rule was not attributed (no rules snapshot), but the address is on kube-ipvs0 and the packet was rejected. A ClusterIP is virtual: in IPVS mode only its service ports answer, and ping never will. Test the Service with a connection to its port instead.",
		"ping6 to a ClusterIP":                                                           "rejected by KUBE-IPVS-FILTER: ICMP (ping) to fd00:10:96::a is refused because fd00:10:96::a is bound to kube-ipvs0 (ipset KUBE-6-IPVS-IPS) while kube-proxy's ipsets accept only tcp:80 there, so the filter (kube-proxy IPVS mode ≥ 1.26) REJECTs new connections with icmp6-port-unreachable. ip6tables rule `-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-6-IPVS-IPS dst -j REJECT --reject-with icmp6-port-unreachable` (table filter, chain path INPUT → KUBE-IPVS-FILTER). A ClusterIP is virtual: in IPVS mode only its service ports answer, and ping never will. Test the Service with a connection to its port instead.",
		"a port on an address with no service port":                                      "rejected by KUBE-IPVS-FILTER: udp port 53 to 10.96.0.99:53 is refused because 10.96.0.99 is bound to kube-ipvs0 (ipset KUBE-IPVS-IPS) while kube-proxy's ipsets accept no service port there, so the filter (kube-proxy IPVS mode ≥ 1.26) REJECTs new connections with icmp-port-unreachable. Rule `-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable` (table filter, chain path INPUT → KUBE-IPVS-FILTER). Only the Service's own ports are reachable on a kube-ipvs0 address; connect to one of them.",
	}
	for _, c := range incidentCases() {
		t.Run(c.name, func(t *testing.T) {
			r := Diagnose(c.f(), newEnv())
			if r.Verdict != c.verdict || r.Explanation != want[c.name] {
				t.Errorf("got %s: %q\nwant %s: %q", r.Verdict, r.Explanation, c.verdict, want[c.name])
			}
		})
	}
}
