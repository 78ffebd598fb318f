package predict

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/trace"
)

// ipvsNode is node-2 of seed 000 in IPVS mode (testdata/ipvs-node.ndjson,
// a trace header built from internal/rules/testdata's iptables-save and
// ipset save): kube-proxy's ipsets and KUBE-IPVS-FILTER, and portmap's
// CNI-HOSTPORT-DNAT jump ahead of KUBE-SERVICES (where portmap <= 0.7.4
// put it, as in the seed's cluster), with mysql-b's hostPort 3306 and
// 30080. Virtual server 10.96.0.20:3306 (Service svc-b) sends to mysql-a,
// 10.96.0.10:80 has two real servers, 10.96.0.30:80 none.
func ipvsNode(t *testing.T) enrich.Env {
	t.Helper()
	tr, err := trace.ReadFile("testdata/ipvs-node.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	snap := tr.Header.Snapshot
	env, err := enrich.NewSnapshotEnv(tr.Header.Node, snap)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func predict(t *testing.T, env enrich.Env, proto, src, dst string) *Prediction {
	t.Helper()
	var d netip.AddrPort
	if strings.Contains(dst, ":") {
		d = netip.MustParseAddrPort(dst)
	} else {
		d = netip.AddrPortFrom(netip.MustParseAddr(dst), 0)
	}
	p, err := Predict(env, Conn{Proto: proto, Src: netip.MustParseAddr(src), Dst: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s %s -> %s: %s\n  steps: %s\n  uncertain: %v\n  %s", proto, src, dst, p.Verdict(), strings.Join(p.Steps, "\n         "), p.Uncertain, p.Flow.Explanation)
	return p
}

func TestPredictHostportHijack(t *testing.T) {
	p := predict(t, ipvsNode(t), "tcp", "10.244.1.7", "10.96.0.20:3306")
	if p.Verdict() != trace.VerdictHostportHijack {
		t.Fatalf("verdict %s, want %s", p.Verdict(), trace.VerdictHostportHijack)
	}
	r := p.Flow.Rule
	if r == nil || r.Chain != "CNI-DN-8b747bf054247edf07ca9" || r.Owner == nil || r.Owner.Pod == nil || r.Owner.Pod.Name != "mysql-b" {
		t.Fatalf("rule %+v", r)
	}
	if p.Flow.Reply == nil || p.Flow.Reply.Src != "10.244.1.5:3306" {
		t.Errorf("goes to %+v, want mysql-b's 10.244.1.5:3306", p.Flow.Reply)
	}
	if len(p.Uncertain) != 0 {
		t.Errorf("uncertain: %v", p.Uncertain)
	}
}

func TestPredictPingClusterIPRejected(t *testing.T) {
	p := predict(t, ipvsNode(t), "icmp", "10.244.1.7", "10.96.0.20")
	if p.Verdict() != trace.VerdictIPVSFilterReject {
		t.Fatalf("verdict %s, want %s", p.Verdict(), trace.VerdictIPVSFilterReject)
	}
	if r := p.Flow.Rule; r == nil || r.Chain != "KUBE-IPVS-FILTER" {
		t.Fatalf("rule %+v", r)
	}
}

func TestPredictIPVSService(t *testing.T) {
	p := predict(t, ipvsNode(t), "tcp", "10.244.1.7", "10.96.0.10:80")
	if p.Verdict() != trace.VerdictOK {
		t.Fatalf("verdict %s, want ok", p.Verdict())
	}
	if p.Flow.Reply == nil || p.Flow.Reply.Src != "10.244.1.5:8080" {
		t.Errorf("goes to %+v, want the first real server", p.Flow.Reply)
	}
}

func TestPredictIPVSNoRealServer(t *testing.T) {
	p := predict(t, ipvsNode(t), "tcp", "10.244.1.7", "10.96.0.30:80")
	if p.Verdict() != trace.VerdictIPVSNoEndpoint {
		t.Fatalf("verdict %s, want %s", p.Verdict(), trace.VerdictIPVSNoEndpoint)
	}
}

// A near miss: mysql-b's hostPort is 3306; the Service's other address
// and port are not taken.
func TestPredictNearMisses(t *testing.T) {
	env := ipvsNode(t)
	for _, c := range []struct{ proto, src, dst, want string }{
		{"tcp", "10.244.1.7", "10.244.2.7:3306", trace.VerdictOK},  // mysql-a's pod IP: routed, not local
		{"tcp", "10.244.1.7", "172.18.0.2:22", trace.VerdictOK},    // the node's sshd
		{"icmp", "10.244.1.7", "172.18.0.2", trace.VerdictOK},      // the node's own address: it answers
		{"tcp", "10.244.1.7", "10.96.0.20:80", trace.VerdictReset}, // in KUBE-CLUSTER-IP but no virtual server: nothing listens
	} {
		if p := predict(t, env, c.proto, c.src, c.dst); p.Verdict() != c.want {
			t.Errorf("%s %s -> %s: %s, want %s", c.proto, c.src, c.dst, p.Verdict(), c.want)
		}
	}
}

func TestPredictRefusesBadConnections(t *testing.T) {
	env := ipvsNode(t)
	for _, c := range []Conn{
		{Proto: "tcp", Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddrPort("10.0.0.2:0")},
		{Proto: "gre", Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddrPort("10.0.0.2:1")},
		{Proto: "tcp", Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddrPort("10.0.0.2:1")},
		{Proto: "tcp", Dst: netip.MustParseAddrPort("10.0.0.2:1")},
	} {
		if _, err := Predict(env, c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// nftNode is kube-proxy v1.37.2's nftables ruleset (the real one's,
// internal/nft/testdata): node 198.51.100.10; ns4/svc4 172.30.0.44:80 with
// endpoints 10.180.0.4 and .5, ns6/svc6 172.30.0.46:80 without endpoints,
// ns7/svc7 NodePort 30007 with externalTrafficPolicy Local and no local
// endpoint.
func nftNode(t *testing.T) enrich.Env {
	t.Helper()
	j, err := os.ReadFile("../nft/testdata/kube-proxy-v1.37.2.json")
	if err != nil {
		t.Fatal(err)
	}
	l, err := os.ReadFile("../nft/testdata/kube-proxy-v1.37.2.nft")
	if err != nil {
		t.Fatal(err)
	}
	port := func(p, np uint16) []trace.ServicePort {
		return []trace.ServicePort{{Name: "p80", Proto: "TCP", Port: p, NodePort: np}}
	}
	snap := &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "198.51.100.10/24", Up: true}},
		NFTables:  &trace.NFTRuleset{JSON: j, Listing: string(l)},
		Pods: []trace.Pod{
			{Namespace: "ns1", Name: "client", IPs: []string{"10.180.0.9"}, Node: "node-1"},
			{Namespace: "ns4", Name: "ep-4", IPs: []string{"10.180.0.4"}, Node: "node-1"},
			{Namespace: "ns4", Name: "ep-5", IPs: []string{"10.180.0.5"}, Node: "node-1"},
		},
		Services: []trace.Service{
			{Namespace: "ns4", Name: "svc4", Type: "ClusterIP", ClusterIPs: []string{"172.30.0.44"}, Ports: port(80, 0)},
			{Namespace: "ns6", Name: "svc6", Type: "ClusterIP", ClusterIPs: []string{"172.30.0.46"}, Ports: port(80, 0)},
			{Namespace: "ns7", Name: "svc7", Type: "NodePort", ClusterIPs: []string{"172.30.0.47"}, ETP: "Local", Ports: port(80, 30007)},
		},
	}
	env, err := enrich.NewSnapshotEnv("node-1", snap)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestPredictKubeProxyNFT(t *testing.T) {
	env := nftNode(t)
	for _, c := range []struct{ proto, src, dst, want string }{
		{"tcp", "10.180.0.9", "172.30.0.44:80", trace.VerdictOK},
		{"tcp", "10.180.0.9", "172.30.0.46:80", trace.VerdictServiceNoEndpoint},
		{"tcp", "203.0.113.7", "198.51.100.10:30007", trace.VerdictServiceNoEndpoint},
		{"icmp", "10.180.0.9", "172.30.0.44", trace.VerdictClusterIPReject},
		{"tcp", "10.180.0.9", "172.30.0.44:81", trace.VerdictClusterIPReject},
	} {
		p := predict(t, env, c.proto, c.src, c.dst)
		if p.Verdict() != c.want {
			t.Errorf("%s %s -> %s: %s, want %s", c.proto, c.src, c.dst, p.Verdict(), c.want)
		}
		if p.Verdict() != trace.VerdictOK && (p.Flow.Rule == nil || !p.Flow.Rule.NFTables()) {
			t.Errorf("%s %s -> %s: rule %+v, want kube-proxy's nftables rule", c.proto, c.src, c.dst, p.Flow.Rule)
		}
	}
}
