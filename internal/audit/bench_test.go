package audit

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/nft/nftgen"
	"github.com/tracer-dev/tracer/internal/trace"
)

// bigNode is a node with n ClusterIP Services of one TCP port and one
// endpoint each, in kube-proxy's iptables mode (KUBE-SERVICES, one
// KUBE-SVC and KUBE-SEP chain per Service: the walk is linear in n, the
// worst case) or its IPVS mode (ipsets and virtual servers: the rules do
// not grow with n), and a pod on the node to connect from.
func bigNode(n int, ipvs bool) *trace.Snapshot {
	svcIP := func(i int) string { return fmt.Sprintf("10.96.%d.%d", i/250, i%250+1) }
	epIP := func(i int) string { return fmt.Sprintf("10.244.%d.%d", 2+i/250, i%250+1) }
	snap := &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "172.18.0.2/16", Up: true}},
		Pods:      []trace.Pod{{Namespace: "shop", Name: "client", IPs: []string{"10.244.1.2"}, Node: "node-1"}},
	}
	var nat, filter, ipset strings.Builder
	nat.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n")
	filter.WriteString("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n")
	if ipvs {
		ipset.WriteString("create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n")
		nat.WriteString("-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\n")
	} else {
		for i := 0; i < n; i++ {
			fmt.Fprintf(&nat, ":KUBE-SVC-%d - [0:0]\n:KUBE-SEP-%d - [0:0]\n", i, i)
		}
		nat.WriteString("-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n")
	}
	for i := 0; i < n; i++ {
		snap.Services = append(snap.Services, trace.Service{Namespace: fmt.Sprintf("ns%d", i), Name: "svc", Type: "ClusterIP",
			ClusterIPs: []string{svcIP(i)}, Ports: []trace.ServicePort{{Name: "http", Proto: "TCP", Port: 80}}})
		if ipvs {
			snap.Addresses = append(snap.Addresses, trace.Address{Interface: "kube-ipvs0", Address: svcIP(i) + "/32"})
			fmt.Fprintf(&ipset, "add KUBE-CLUSTER-IP %s,tcp:80\n", svcIP(i))
			snap.IPVS = append(snap.IPVS, trace.IPVSService{Proto: "tcp", Address: svcIP(i) + ":80", Scheduler: "rr", Reals: []string{epIP(i) + ":8080"}})
			continue
		}
		fmt.Fprintf(&nat, "-A KUBE-SERVICES -d %s/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-%d\n", svcIP(i), i)
		fmt.Fprintf(&nat, "-A KUBE-SVC-%d -j KUBE-SEP-%d\n", i, i)
		fmt.Fprintf(&nat, "-A KUBE-SEP-%d -p tcp -m tcp -j DNAT --to-destination %s:8080\n", i, epIP(i))
	}
	nat.WriteString("COMMIT\n")
	filter.WriteString("COMMIT\n")
	snap.Rules = map[string]string{"all": nat.String() + filter.String()}
	snap.Ipsets = ipset.String()
	return snap
}

// bigNFTNode is a node of n ClusterIP Services with 3 endpoints each in
// kube-proxy's nftables mode (internal/nft/nftgen's table).
func bigNFTNode(n int) *trace.Snapshot {
	_, js, listing := nftgen.KubeProxy(n, 3)
	snap := &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "192.168.0.2/24", Up: true}},
		NFTables:  &trace.NFTRuleset{JSON: js, Listing: string(listing)},
		Pods:      []trace.Pod{{Namespace: "shop", Name: "client", IPs: []string{"10.1.0.9"}, Node: "node-1"}},
	}
	for i := 1; i <= n; i++ {
		snap.Services = append(snap.Services, trace.Service{Namespace: fmt.Sprintf("ns%d", i), Name: fmt.Sprintf("svc%d", i), Type: "ClusterIP",
			ClusterIPs: []string{nftgen.SvcIP(i)}, Ports: []trace.ServicePort{{Name: "p80", Proto: "TCP", Port: 80}}})
	}
	return snap
}

func benchmarkAudit(b *testing.B, snap *trace.Snapshot) {
	n := len(snap.Services)
	env, err := enrich.NewSnapshotEnv("node-1", snap)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.ReportAllocs()
	for b.Loop() {
		r := Audit("node-1", snap, env)
		if r.Problems() != 0 || r.Walked < 2*n {
			b.Fatalf("%d problems, %d walked: %+v", r.Problems(), r.Walked, r.Findings[:min(len(r.Findings), 3)])
		}
	}
	b.ReportMetric(float64(n), "services")
}

// BenchmarkAudit5000IPTables audits a node of 5,000 Services in
// kube-proxy's iptables mode: every Service's port from a pod and from the
// node, and a ping, each walked through KUBE-SERVICES.
func BenchmarkAudit5000IPTables(b *testing.B) { benchmarkAudit(b, bigNode(5000, false)) }

// BenchmarkAudit5000IPVS is the same node in IPVS mode.
func BenchmarkAudit5000IPVS(b *testing.B) { benchmarkAudit(b, bigNode(5000, true)) }

// BenchmarkAudit5000NFTables is a node of 5,000 Services with 3
// endpoints each in nftables mode: its maps find a Service in one lookup.
func BenchmarkAudit5000NFTables(b *testing.B) { benchmarkAudit(b, bigNFTNode(5000)) }
