package rules

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The dumps in testdata were captured with gen.sh: iptables 1.8.9, ipset
// 7.17 and the real CNI portmap plugin (1.1.1) in a throwaway namespace.
//
// mysql-b  10.244.1.5 hostPort 3306->3306 and 30080->80, chain CNI-DN-8b747bf054247edf07ca9
// nginx-hp 10.244.1.6 hostPort 80->80, chain CNI-DN-2a43db1cddb367fe221a2
const (
	mysqlID    = "4b1c0f6de2a94b3f8c1e7a5d9e0b2c3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d"
	nginxID    = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"
	mysqlChain = "CNI-DN-8b747bf054247edf07ca9"
	nginxChain = "CNI-DN-2a43db1cddb367fe221a2"
)

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func loadSave(t testing.TB, name string) *Ruleset {
	t.Helper()
	return mustParse(t, readTestdata(t, name))
}

func mustParse(t testing.TB, text string) *Ruleset {
	t.Helper()
	rs, err := ParseSaveString(text, IPv4)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// testNode is the node of kube-proxy-ipvs.md: 172.18.0.2, cni0 10.244.1.1,
// every ClusterIP and the LB IP on kube-ipvs0, and kube-proxy's ipsets.
func testNode(t testing.TB) *MemNode {
	t.Helper()
	n := NewMemNode()
	if err := n.AddLocal("172.18.0.2", "10.244.1.1", "10.96.0.10", "10.96.0.20", "10.96.0.30", "192.168.1.200"); err != nil {
		t.Fatal(err)
	}
	if err := n.LoadIPSetSave(strings.NewReader(readTestdata(t, "ipsets.save"))); err != nil {
		t.Fatal(err)
	}
	return n
}

func tcp(src, dst string) Packet {
	return Packet{Proto: ProtoTCP, Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst), State: CTNew, InIface: "eth0"}
}

func ping(src, dst string) Packet {
	return Packet{Proto: ProtoICMP, Src: netip.AddrPortFrom(netip.MustParseAddr(src), 0),
		Dst: netip.AddrPortFrom(netip.MustParseAddr(dst), 0), ICMPType: 8, ICMPKnown: true, State: CTNew, InIface: "cni0"}
}

func mustEval(t *testing.T, rs *Ruleset, table, chain string, p Packet, n NodeState) *Result {
	t.Helper()
	res, err := rs.Evaluate(table, chain, p, n)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

type want struct {
	verdict   Verdict
	chain     string // chain of the deciding rule; "" for a policy
	index     int
	path      string
	uncertain bool
	mark      uint32
}

func check(t *testing.T, res *Result, w want) {
	t.Helper()
	if res.Verdict != w.verdict {
		t.Errorf("verdict %s, want %s (%s)", res.Verdict, w.verdict, res.Outcome.String())
	}
	switch {
	case w.chain == "" && res.Rule != nil:
		t.Errorf("decided by %s, want the policy", res.Rule.ID())
	case w.chain != "" && res.Rule == nil:
		t.Errorf("decided by the policy, want %s #%d", w.chain, w.index)
	case w.chain != "" && (res.Rule.Chain != w.chain || res.Rule.Index != w.index):
		t.Errorf("decided by %s, want %s #%d", res.Rule.ID(), w.chain, w.index)
	}
	if got := res.PathString(); got != w.path {
		t.Errorf("path %q, want %q", got, w.path)
	}
	if res.Uncertain != w.uncertain {
		t.Errorf("uncertain %v (%v), want %v", res.Uncertain, res.Reasons, w.uncertain)
	}
	if res.Mark != w.mark {
		t.Errorf("mark %#x, want %#x", res.Mark, w.mark)
	}
}

func TestHostPortHijack(t *testing.T) {
	appended, prepended := loadSave(t, "appended.save"), loadSave(t, "prepended.save")
	n := testNode(t)
	const pm = "PREROUTING → CNI-HOSTPORT-DNAT → "
	cases := []struct {
		name string
		rs   *Ruleset
		pkt  Packet
		want want
		to   string // --to-destination of the deciding DNAT
	}{
		// 3306 is a hostPort but no service port: even the fixed order
		// lets CNI-HOSTPORT-DNAT take a ClusterIP (LOCAL on kube-ipvs0).
		{"clusterip-hostport-appended", appended, tcp("10.244.2.9:40000", "10.96.0.20:3306"),
			want{VerdictDNAT, mysqlChain, 3, pm + mysqlChain, false, 0}, "10.244.1.5:3306"},
		{"clusterip-hostport-prepended", prepended, tcp("10.244.2.9:40000", "10.96.0.20:3306"),
			want{VerdictDNAT, mysqlChain, 3, pm + mysqlChain, false, 0}, "10.244.1.5:3306"},
		// A service ip,port: KUBE-SERVICES accepts it first when portmap
		// appends ...
		{"service-port-appended", appended, tcp("10.244.2.9:40000", "10.96.0.20:80"),
			want{VerdictAccept, "KUBE-SERVICES", 5, "PREROUTING → KUBE-SERVICES", false, 0}, ""},
		// ... but portmap <= 0.7.4 prepended, and hostPort 80 wins.
		{"service-port-prepended", prepended, tcp("10.244.2.9:40000", "10.96.0.20:80"),
			want{VerdictDNAT, nginxChain, 3, pm + nginxChain, false, 0}, "10.244.1.6:80"},
		// NodePort 30080 is also mysql-b's hostPort: KUBE-NODE-PORT marks
		// it for masquerade and returns, then the hostPort DNAT takes it.
		{"nodeport-equals-hostport", appended, tcp("192.168.5.5:40000", "172.18.0.2:30080"),
			want{VerdictDNAT, mysqlChain, 6, pm + mysqlChain, false, 0x4000}, "10.244.1.5:80"},
		// Not local: nothing in nat applies.
		{"remote-pod", appended, tcp("10.244.2.9:40000", "10.244.2.7:3306"),
			want{VerdictAccept, "", 0, "PREROUTING", false, 0}, ""},
		// From outside the pod CIDR to a ClusterIP service: the negated
		// source match sends it to KUBE-MARK-MASQ first.
		{"clusterip-from-outside", appended, tcp("192.168.5.5:40000", "10.96.0.20:80"),
			want{VerdictAccept, "KUBE-SERVICES", 5, "PREROUTING → KUBE-SERVICES", false, 0x4000}, ""},
		// Hairpin: a pod on this node reaching the hostPort is marked by
		// CNI-HOSTPORT-SETMARK for CNI-HOSTPORT-MASQ.
		{"hairpin", appended, tcp("10.244.1.7:40000", "10.96.0.20:3306"),
			want{VerdictDNAT, mysqlChain, 3, pm + mysqlChain, false, 0x2000}, "10.244.1.5:3306"},
		// Established packets never see the nat table.
		{"established", appended, func() Packet { p := tcp("10.244.2.9:40000", "10.96.0.20:3306"); p.State = CTEstablished; return p }(),
			want{VerdictNotTraversed, "", 0, "PREROUTING", false, 0}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := mustEval(t, c.rs, "nat", "PREROUTING", c.pkt, n)
			check(t, res, c.want)
			if c.to != "" && res.Rule != nil {
				if got := res.Rule.Target.NAT[0].String(); got != c.to {
					t.Errorf("DNAT to %s, want %s", got, c.to)
				}
			}
		})
	}
}

func TestOutputFromLoopback(t *testing.T) {
	rs := loadSave(t, "appended.save")
	// KUBE-SERVICES returns at once for 127.0.0.0/8; the hostPort rule
	// marks localhost for masquerade and DNATs.
	p := tcp("127.0.0.1:40000", "127.0.0.1:3306")
	p.InIface = ""
	res := mustEval(t, rs, "nat", "OUTPUT", p, testNode(t))
	check(t, res, want{VerdictDNAT, mysqlChain, 3, "OUTPUT → CNI-HOSTPORT-DNAT → " + mysqlChain, false, 0x2000})
	if len(res.Doubts) != 0 {
		t.Errorf("doubts %v, want none", res.Doubts)
	}
}

func TestPathCarriesPortmapJump(t *testing.T) {
	rs := loadSave(t, "appended.save")
	res := mustEval(t, rs, "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.96.0.20:3306"), testNode(t))
	via := res.Path[2].Via
	if via == nil || via.Chain != PortmapDNATChain || !strings.Contains(via.Comment, mysqlID) {
		t.Fatalf("path step %+v: want the CNI-HOSTPORT-DNAT jump with the container id", res.Path[2])
	}
	if res.Path[1].Via.Text != "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT" {
		t.Errorf("path step 1 via %q", res.Path[1].Via.Text)
	}
}

func TestIPVSFilter(t *testing.T) {
	rs := loadSave(t, "appended.save")
	n := testNode(t)
	const reject = "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable"
	cases := []struct {
		name string
		pkt  Packet
		want want
	}{
		{"ping-clusterip", ping("10.244.1.7", "10.96.0.20"),
			want{VerdictReject, "KUBE-IPVS-FILTER", 6, "INPUT → KUBE-IPVS-FILTER", false, 0}},
		{"service-port", tcp("10.244.1.7:40000", "10.96.0.20:80"),
			want{VerdictAccept, "", 0, "INPUT", false, 0}},
		{"not-a-service-port", tcp("10.244.1.7:40000", "10.96.0.20:443"),
			want{VerdictReject, "KUBE-IPVS-FILTER", 6, "INPUT → KUBE-IPVS-FILTER", false, 0}},
		// Seed 004: the LB IP is on kube-ipvs0, 443 belongs to the cloud LB.
		{"lb-ip-other-port", tcp("10.244.1.7:40000", "192.168.1.200:443"),
			want{VerdictReject, "KUBE-IPVS-FILTER", 6, "INPUT → KUBE-IPVS-FILTER", false, 0}},
		{"lb-ip-service-port", tcp("10.244.1.7:40000", "192.168.1.200:80"),
			want{VerdictAccept, "", 0, "INPUT", false, 0}},
		{"ping-established", func() Packet { p := ping("10.244.1.7", "10.96.0.20"); p.State = CTEstablished; return p }(),
			want{VerdictAccept, "", 0, "INPUT", false, 0}},
		{"ping-node", ping("10.244.1.7", "172.18.0.2"),
			want{VerdictAccept, "", 0, "INPUT", false, 0}},
		{"health-check-node-port", tcp("192.168.5.5:40000", "172.18.0.2:32000"),
			want{VerdictAccept, "KUBE-NODE-PORT", 1, "INPUT → KUBE-NODE-PORT", false, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := mustEval(t, rs, "filter", "INPUT", c.pkt, n)
			check(t, res, c.want)
			if c.want.verdict == VerdictReject && res.Rule != nil {
				if res.Rule.Text != reject {
					t.Errorf("rule text %q, want %q", res.Rule.Text, reject)
				}
				if res.Rule.Target.RejectWith != "icmp-port-unreachable" {
					t.Errorf("reject-with %q", res.Rule.Target.RejectWith)
				}
			}
		})
	}
}

func TestMarkThenMasquerade(t *testing.T) {
	rs := loadSave(t, "appended.save")
	n := testNode(t)
	pre := mustEval(t, rs, "nat", "PREROUTING", tcp("10.244.1.7:40000", "10.96.0.20:3306"), n)
	if pre.Mark != 0x2000 {
		t.Fatalf("mark after PREROUTING %#x, want 0x2000 from CNI-HOSTPORT-SETMARK", pre.Mark)
	}
	post := tcp("10.244.1.7:40000", "10.244.1.5:3306")
	post.InIface, post.OutIface, post.Mark = "cni0", "cni0", pre.Mark
	res := mustEval(t, rs, "nat", "POSTROUTING", post, n)
	check(t, res, want{VerdictMasquerade, PortmapMasqChain, 1, "POSTROUTING → CNI-HOSTPORT-MASQ", false, 0x2000})

	// Without the mark it falls through: KUBE-POSTROUTING returns.
	post.Mark = 0
	res = mustEval(t, rs, "nat", "POSTROUTING", post, n)
	check(t, res, want{VerdictAccept, "", 0, "POSTROUTING", false, 0})

	// kube-proxy's mark: --xor-mark (saved as --set-xmark 0x4000/0x0)
	// clears it before MASQUERADE --random-fully.
	post.Mark = 0x4000
	res = mustEval(t, rs, "nat", "POSTROUTING", post, n)
	check(t, res, want{VerdictMasquerade, "KUBE-POSTROUTING", 4, "POSTROUTING → KUBE-POSTROUTING", false, 0})
	if !slices.Contains(res.Rule.Target.Flags, "--random-fully") {
		t.Errorf("flags %v, want --random-fully", res.Rule.Target.Flags)
	}

	// KUBE-LOOP-BACK (hash:ip,port,ip, dst,dst,src): a pod reaching itself.
	loop := tcp("10.244.1.5:40000", "10.244.1.5:8080")
	res = mustEval(t, rs, "nat", "POSTROUTING", loop, n)
	check(t, res, want{VerdictMasquerade, "KUBE-POSTROUTING", 1, "POSTROUTING → KUBE-POSTROUTING", false, 0})
}

const setFlagsDump = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m set --match-set KUBE-CLUSTER-IP dst -j DROP
-A INPUT -m set ! --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A INPUT -m set --match-set KUBE-CLUSTER-IP dst,src -j ACCEPT
-A INPUT -m set --match-set KUBE-CLUSTER-IP dst,dst -j REJECT --reject-with icmp-host-prohibited
COMMIT
`

func TestSetFlags(t *testing.T) {
	rs := mustParse(t, setFlagsDump)
	n := testNode(t)
	// "dst" has fewer flags than hash:ip,port has dimensions: never a
	// match in the kernel. "dst,src" takes the source port.
	res := mustEval(t, rs, "filter", "INPUT", tcp("10.244.1.7:40000", "10.96.0.20:80"), n)
	check(t, res, want{VerdictReject, "INPUT", 4, "INPUT", false, 0})
	res = mustEval(t, rs, "filter", "INPUT", tcp("10.244.1.7:80", "10.96.0.20:81"), n)
	check(t, res, want{VerdictAccept, "INPUT", 2, "INPUT", false, 0})
	res = mustEval(t, rs, "filter", "INPUT", tcp("10.244.1.7:40000", "10.96.0.20:80"), n)
	if res.Rule.Target.RejectWith != "icmp-host-prohibited" {
		t.Errorf("reject-with %q", res.Rule.Target.RejectWith)
	}
}

func TestUnknownSetIsUncertain(t *testing.T) {
	rs := mustParse(t, setFlagsDump)
	res := mustEval(t, rs, "filter", "INPUT", tcp("10.244.1.7:40000", "10.96.0.20:80"), NewMemNode())
	if !res.Uncertain || len(res.Reasons) == 0 || !strings.Contains(strings.Join(res.Reasons, " "), `ipset "KUBE-CLUSTER-IP" is not known`) {
		t.Fatalf("uncertain %v reasons %v", res.Uncertain, res.Reasons)
	}
}

// withRule inserts a rule line after the given line of a dump.
func withRule(t *testing.T, dump, after, rule string) *Ruleset {
	t.Helper()
	if !strings.Contains(dump, after+"\n") {
		t.Fatalf("dump has no line %q", after)
	}
	return mustParse(t, strings.Replace(dump, after+"\n", after+"\n"+rule+"\n", 1))
}

func TestUnknownMatchUncertain(t *testing.T) {
	dump := readTestdata(t, "appended.save")
	n := testNode(t)
	// A random RETURN at the top of KUBE-SERVICES: the service port may
	// go to the hostPort chain or be accepted.
	rs := withRule(t, dump, ":KUBE-SERVICES - [0:0]", "-A KUBE-SERVICES -m statistic --mode random --probability 0.50000000000 -j RETURN")
	res := mustEval(t, rs, "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.96.0.20:80"), n)
	if !res.Uncertain {
		t.Fatal("want uncertain")
	}
	if res.Verdict != VerdictAccept || len(res.Alternatives) != 1 || res.Alternatives[0].Rule.Chain != nginxChain {
		t.Errorf("outcome %s, alternatives %v", res.Outcome.String(), res.Alternatives)
	}
	if len(res.Reasons) != 1 || !strings.Contains(res.Reasons[0], `"statistic"`) || !strings.Contains(res.Reasons[0], "KUBE-SERVICES #1") {
		t.Errorf("reasons %q: want the statistic rule", res.Reasons)
	}
	// For 3306 both branches end at the same DNAT: the doubt is recorded
	// but the answer is certain.
	res = mustEval(t, rs, "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.96.0.20:3306"), n)
	if res.Uncertain || res.Rule.Chain != mysqlChain || len(res.Doubts) != 1 {
		t.Errorf("uncertain %v rule %v doubts %v", res.Uncertain, res.Rule, res.Doubts)
	}

	// -m bpf in front of the DNAT rule itself.
	rs = withRule(t, dump, ":KUBE-SERVICES - [0:0]", `-A PREROUTING -p tcp -m bpf --bytecode "4,48 0 0 9,21 0 1 6,6 0 0 1,6 0 0 0" -j ACCEPT`)
	res = mustEval(t, rs, "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.96.0.20:3306"), n)
	if !res.Uncertain || !strings.Contains(strings.Join(res.Reasons, " "), `"bpf"`) {
		t.Errorf("uncertain %v reasons %v: want the bpf match named", res.Uncertain, res.Reasons)
	}
	// A certain non-match elsewhere in the rule wins over the unknown one.
	res = mustEval(t, rs, "nat", "PREROUTING", Packet{Proto: ProtoUDP, Src: netip.MustParseAddrPort("10.244.2.9:1"),
		Dst: netip.MustParseAddrPort("10.96.0.10:53"), State: CTNew, InIface: "eth0"}, n)
	if res.Uncertain || len(res.Doubts) != 0 {
		t.Errorf("udp: uncertain %v doubts %v", res.Uncertain, res.Doubts)
	}
}

func TestUnknownTargetAndInterface(t *testing.T) {
	rs := mustParse(t, `*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -d 10.1.0.0/16 -j NETMAP --to 10.2.0.0/16
-A PREROUTING -i veth+ -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1
-A PREROUTING -j DNAT --to-destination 10.0.0.2
COMMIT
`)
	res := mustEval(t, rs, "nat", "PREROUTING", tcp("10.9.0.1:1", "10.1.0.5:80"), nil)
	if !res.Uncertain || !strings.Contains(strings.Join(res.Reasons, " "), "NETMAP") {
		t.Errorf("NETMAP: uncertain %v reasons %v", res.Uncertain, res.Reasons)
	}
	p := tcp("10.9.0.1:1", "10.3.0.5:80")
	p.InIface = ""
	res = mustEval(t, rs, "nat", "PREROUTING", p, nil)
	if !res.Uncertain || !strings.Contains(strings.Join(res.Reasons, " "), "in interface") {
		t.Errorf("no iface: uncertain %v reasons %v", res.Uncertain, res.Reasons)
	}
	p.InIface = "veth1234"
	res = mustEval(t, rs, "nat", "PREROUTING", p, nil)
	check(t, res, want{VerdictDNAT, "PREROUTING", 2, "PREROUTING", false, 0})
	p.InIface = "eth0"
	res = mustEval(t, rs, "nat", "PREROUTING", p, nil)
	check(t, res, want{VerdictDNAT, "PREROUTING", 3, "PREROUTING", false, 0})
}

func TestGotoReturnPolicy(t *testing.T) {
	rs := mustParse(t, `*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:A - [0:0]
:B - [0:0]
:C - [0:0]
:D - [0:0]
-A INPUT -p tcp -g A
-A INPUT -p udp -j C
-A INPUT -j ACCEPT
-A A -j B
-A A -j RETURN
-A B -p tcp -m tcp --dport 22 -j ACCEPT
-A C -g D
-A C -j DROP
-A D -p udp -m udp --dport 53 -j ACCEPT
COMMIT
`)
	// The goto replaced INPUT's frame: A's RETURN ends the base chain and
	// its policy decides, INPUT #3 is never reached.
	res := mustEval(t, rs, "filter", "INPUT", tcp("10.0.0.1:1", "10.0.0.2:80"), nil)
	check(t, res, want{VerdictDrop, "", 0, "INPUT", false, 0})
	res = mustEval(t, rs, "filter", "INPUT", tcp("10.0.0.1:1", "10.0.0.2:22"), nil)
	check(t, res, want{VerdictAccept, "B", 1, "INPUT → A → B", false, 0})
	if !res.Path[1].Goto || res.Path[2].Goto {
		t.Errorf("goto flags %+v", res.Path)
	}
	// C goes to D; D falls off its end and returns to INPUT (C's caller),
	// skipping C #2.
	udp := Packet{Proto: ProtoUDP, Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("10.0.0.2:54"), State: CTNew}
	res = mustEval(t, rs, "filter", "INPUT", udp, nil)
	check(t, res, want{VerdictAccept, "INPUT", 3, "INPUT", false, 0})
	udp.Dst = netip.MustParseAddrPort("10.0.0.2:53")
	res = mustEval(t, rs, "filter", "INPUT", udp, nil)
	check(t, res, want{VerdictAccept, "D", 1, "INPUT → C → D", false, 0})
}

func TestLoopIsCutShort(t *testing.T) {
	rs := mustParse(t, `*filter
:INPUT ACCEPT [0:0]
:A - [0:0]
:B - [0:0]
-A INPUT -j A
-A A -j B
-A B -j A
COMMIT
`)
	res := mustEval(t, rs, "filter", "INPUT", tcp("10.0.0.1:1", "10.0.0.2:80"), nil)
	if !res.Uncertain || !res.Incomplete || res.Verdict != VerdictUnknown {
		t.Fatalf("loop: %s uncertain %v", res.Outcome.String(), res.Uncertain)
	}
}

func TestEvaluateErrors(t *testing.T) {
	rs := loadSave(t, "appended.save")
	for _, c := range [][2]string{{"nosuch", "INPUT"}, {"filter", "NOSUCH"}, {"nat", "KUBE-SERVICES"}} {
		if _, err := rs.Evaluate(c[0], c[1], Packet{}, nil); err == nil {
			t.Errorf("Evaluate(%s, %s): want an error", c[0], c[1])
		}
	}
}

func TestForkBudget(t *testing.T) {
	var b strings.Builder
	b.WriteString("*filter\n:INPUT ACCEPT [0:0]\n")
	for i := 0; i < 100; i++ {
		b.WriteString("-A INPUT -m statistic --mode nth --every 2 -j LOG\n")
	}
	b.WriteString("-A INPUT -m statistic --mode nth --every 2 -j DROP\nCOMMIT\n")
	rs := mustParse(t, b.String())
	res := mustEval(t, rs, "filter", "INPUT", tcp("10.0.0.1:1", "10.0.0.2:80"), nil)
	if !res.Uncertain || !res.Incomplete || !strings.Contains(strings.Join(res.Reasons, " "), "undecidable rules") {
		t.Fatalf("uncertain %v reasons %v", res.Uncertain, res.Reasons)
	}
}
