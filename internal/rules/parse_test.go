package rules

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestParseRealDump(t *testing.T) {
	rs := loadSave(t, "appended.save")
	if len(rs.Tables) != 4 {
		t.Fatalf("%d tables, want raw mangle nat filter", len(rs.Tables))
	}
	in := rs.Chain("filter", "INPUT")
	if in == nil || in.Policy != "ACCEPT" || !in.Builtin() || len(in.Rules) != 3 {
		t.Fatalf("filter INPUT: %+v", in)
	}
	ks := rs.Chain("nat", "KUBE-SERVICES")
	if ks.Builtin() || len(ks.Rules) != 6 {
		t.Fatalf("nat KUBE-SERVICES: policy %q, %d rules", ks.Policy, len(ks.Rules))
	}
	if got := rs.Tables["nat"].Order[:4]; !reflect.DeepEqual(got, []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"}) {
		t.Errorf("chain order %v", got)
	}
	// The portmap jump: comment unescaped, the line kept verbatim.
	j := rs.PortmapJump(mysqlChain)
	if j == nil {
		t.Fatal("no CNI-HOSTPORT-DNAT jump to the mysql chain")
	}
	wantText := `-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"cbr0\" id: \"` + mysqlID + `\"" -m multiport --dports 3306,30080 -j ` + mysqlChain
	if j.Text != wantText {
		t.Errorf("text\n%s\nwant\n%s", j.Text, wantText)
	}
	if want := `dnat name: "cbr0" id: "` + mysqlID + `"`; j.Comment != want {
		t.Errorf("comment %q, want %q", j.Comment, want)
	}
	if j.Index != 1 || j.Target.Kind != TargetJump || j.Target.Chain != mysqlChain {
		t.Errorf("jump %+v", j.Target)
	}
	var kinds []MatchKind
	for _, m := range j.Matches {
		kinds = append(kinds, m.Kind)
	}
	if !reflect.DeepEqual(kinds, []MatchKind{MatchProto, MatchComment, MatchDstPort}) {
		t.Errorf("match kinds %v", kinds)
	}
	if !reflect.DeepEqual(j.Matches[2].Ports, []PortRange{{3306, 3306}, {30080, 30080}}) {
		t.Errorf("ports %v", j.Matches[2].Ports)
	}

	// MARK forms as iptables-save prints them.
	marks := map[string][2]uint32{
		"-A CNI-HOSTPORT-SETMARK -m comment --comment \"CNI portfwd masquerade mark\" -j MARK --set-xmark 0x2000/0x2000": {0x2000, 0x2000},
		"-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000":                                                            {0x4000, 0x4000},
		"-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0":                                                             {0x4000, 0},
	}
	for _, r := range rs.Rules() {
		if w, ok := marks[r.Text]; ok {
			if r.Target.Kind != TargetMark || r.Target.MarkValue != w[0] || r.Target.MarkMask != w[1] {
				t.Errorf("%s: %+v", r.Text, r.Target)
			}
			delete(marks, r.Text)
		}
	}
	if len(marks) != 0 {
		t.Errorf("MARK rules not found: %v", marks)
	}
	neg := rs.Chain("nat", "KUBE-SERVICES").Rules[2]
	if m := neg.Matches[0]; m.Kind != MatchSource || !m.Negate || m.Prefix != netip.MustParsePrefix("10.244.0.0/16") {
		t.Errorf("negated source: %+v", m)
	}
	if m := neg.Matches[2]; m.Kind != MatchSet || m.SetName != "KUBE-CLUSTER-IP" || !reflect.DeepEqual(m.SetDirs, []Dir{DirDst, DirDst}) {
		t.Errorf("set match: %+v", m)
	}
}

func TestParseMisc(t *testing.T) {
	rs := loadSave(t, "misc.save")
	rule := func(table, chain string, i int) *Rule {
		t.Helper()
		c := rs.Chain(table, chain)
		if c == nil || i > len(c.Rules) {
			t.Fatalf("no %s %s #%d", table, chain, i)
		}
		return c.Rules[i-1]
	}
	// DNAT/SNAT/MASQUERADE/REDIRECT ranges.
	nat := []struct {
		i    int
		kind TargetKind
		want string
	}{
		{1, TargetRedirect, ":3128"},
		{2, TargetDNAT, "10.0.0.1:9000-9010"},
		{3, TargetDNAT, "10.0.0.2"},
		{4, TargetDNAT, "10.0.0.3-10.0.0.9:80"},
	}
	for _, c := range nat {
		r := rule("nat", "PREROUTING", c.i)
		if r.Target.Kind != c.kind || len(r.Target.NAT) != 1 || r.Target.NAT[0].String() != c.want {
			t.Errorf("%s: %+v", r.Text, r.Target)
		}
	}
	if r := rule("nat", "POSTROUTING", 1); r.Target.Kind != TargetSNAT || r.Target.NAT[0].String() != "192.0.2.1" ||
		!r.Matches[0].IfWild || r.Matches[0].Iface != "eth" {
		t.Errorf("SNAT: %+v %+v", r.Target, r.Matches)
	}
	if r := rule("nat", "POSTROUTING", 2); r.Target.Kind != TargetMasquerade || r.Target.NAT[0].String() != ":1024-65535" ||
		!reflect.DeepEqual(r.Target.Flags, []string{"--random-fully"}) {
		t.Errorf("MASQUERADE: %+v", r.Target)
	}
	if r := rule("nat", "POSTROUTING", 3); r.Matches[1].Kind != MatchUnknown || !strings.Contains(r.Matches[1].Reason, `"bpf"`) {
		t.Errorf("bpf: %+v", r.Matches)
	}

	if r := rule("filter", "INPUT", 3); r.Matches[1].Kind != MatchICMPType || r.Matches[1].ICMP != (ICMPSpec{Type: 8, Code: -1}) {
		t.Errorf("icmp type: %+v", r.Matches)
	}
	if r := rule("filter", "INPUT", 5); r.Target.Kind != TargetGoto || r.Target.Chain != "GO" ||
		!reflect.DeepEqual(r.Matches[1].Ports, []PortRange{{80, 80}, {8000, 8080}, {443, 443}}) {
		t.Errorf("goto multiport: %+v %+v", r.Target, r.Matches)
	}
	if r := rule("filter", "INPUT", 6); r.Target.Kind != TargetContinue || !r.Matches[1].Negate || r.Matches[1].Kind != MatchSrcPort ||
		!reflect.DeepEqual(r.Target.Args, []string{"--log-prefix", "x y "}) {
		t.Errorf("LOG: %+v %+v", r.Target, r.Matches)
	}
	if r := rule("filter", "INPUT", 7); !r.Matches[0].Negate || r.Matches[0].Kind != MatchSet || r.Target.Kind != TargetReturn {
		t.Errorf("negated set: %+v", r.Matches)
	}
	if r := rule("filter", "INPUT", 9); r.Matches[0].Kind != MatchCTState || r.Matches[0].States != CTNew ||
		r.Matches[1].Kind != MatchCTOrigDst || r.Matches[2].Kind != MatchCTStatus {
		t.Errorf("conntrack: %+v", r.Matches)
	}
	for _, i := range []int{10, 11} {
		if r := rule("filter", "INPUT", i); r.Matches[0].Kind != MatchUnknown || r.Matches[0].Reason == "" {
			t.Errorf("%s: %+v", r.Text, r.Matches)
		}
	}
	if r := rule("filter", "INPUT", 14); r.Target.Kind != TargetReject || r.Target.RejectWith != "tcp-reset" {
		t.Errorf("reject: %+v", r.Target)
	}
	if r := rule("filter", "INPUT", 15); r.Target.Kind != TargetContinue || r.Matches[0].Mark != 1 || r.Matches[0].Mask != 0xffffffff {
		t.Errorf("CONNMARK: %+v %+v", r.Target, r.Matches)
	}
	if r := rule("filter", "INPUT", 16); r.Text != "-A INPUT" || r.Target.Kind != TargetNone || len(r.Matches) != 0 {
		t.Errorf("counter-only: %+v", r)
	}
	if r := rule("filter", "INPUT", 17); r.Comment != `a "quoted" comment` || r.Matches[1].Prefix != netip.MustParsePrefix("10.1.2.3/32") {
		t.Errorf("comment %q %+v", r.Comment, r.Matches)
	}
	if r := rule("filter", "INPUT", 19); r.Matches[0].Kind != MatchDstType || !r.Matches[0].Negate || r.Matches[1].Kind != MatchUnknown {
		t.Errorf("addrtype: %+v", r.Matches)
	}
	if r := rule("filter", "FORWARD", 1); r.Matches[0].Iface != "veth" || !r.Matches[0].IfWild || !r.Matches[1].Negate ||
		r.Matches[1].Kind != MatchOutIface || r.Matches[3].Ports[0] != (PortRange{1000, 2000}) || !r.Matches[4].Negate {
		t.Errorf("forward: %+v", r.Matches)
	}
	if rs.Chain("filter", "INPUT").Policy != "DROP" {
		t.Errorf("INPUT policy %q", rs.Chain("filter", "INPUT").Policy)
	}
}

func TestParseSyntaxVariants(t *testing.T) {
	rs := mustParse(t, `# Generated by iptables-save v1.8.9
*nat
:PREROUTING ACCEPT [3:180]
:X - [0:0]
[12:720] -A PREROUTING -p tcp --dport 8080 -j X
-A X -m mark --mark 0x1/0x3 -j MARK --or-mark 0x4
-A X -j MARK --and-mark 0xfffffffe
-A X -j MARK --set-mark 0x10/0xf0
-A X -p tcp -j DNAT --to-destination [2001:db8::1]:80
-A X -s 10.0.0.0/255.255.0.0 -j SNAT --to-source 10.9.9.9:1000-2000 --persistent
-A X -m ttl --ttl-gt 3 -j ACCEPT
-A X -m addrtype --dst-type LOCAL -m comment --comment "-starts with a dash" -j RETURN
COMMIT
`)
	x := rs.Chain("nat", "X").Rules
	pre := rs.Chain("nat", "PREROUTING").Rules[0]
	if pre.Text != "-A PREROUTING -p tcp --dport 8080 -j X" || pre.Matches[1].Kind != MatchDstPort || pre.Matches[1].Module != "tcp" {
		t.Errorf("implicit tcp module / counters: %q %+v", pre.Text, pre.Matches)
	}
	type xm struct{ v, m uint32 }
	for i, w := range []xm{{4, 4}, {0, 1}, {0x10, 0xf0}} {
		if got := (xm{x[i].Target.MarkValue, x[i].Target.MarkMask}); got != w {
			t.Errorf("%s: %+v, want %+v", x[i].Text, got, w)
		}
	}
	if x[3].Target.NAT[0].MinAddr != netip.MustParseAddr("2001:db8::1") || x[3].Target.NAT[0].MinPort != 80 {
		t.Errorf("v6 DNAT %+v", x[3].Target.NAT)
	}
	if x[4].Matches[0].Prefix != netip.MustParsePrefix("10.0.0.0/16") || x[4].Target.NAT[0].String() != "10.9.9.9:1000-2000" {
		t.Errorf("dotted mask / SNAT %+v %+v", x[4].Matches, x[4].Target)
	}
	if x[5].Matches[0].Kind != MatchUnknown || !strings.Contains(x[5].Matches[0].Reason, `"ttl"`) {
		t.Errorf("ttl: %+v", x[5].Matches)
	}
	if x[6].Comment != "-starts with a dash" || x[6].Target.Kind != TargetReturn {
		t.Errorf("dash comment: %q %+v", x[6].Comment, x[6].Target)
	}
}

func TestParseErrors(t *testing.T) {
	bad := map[string]string{
		"no commit":         "*filter\n:INPUT ACCEPT [0:0]\n",
		"rule outside":      "-A INPUT -j ACCEPT\n",
		"commit outside":    "COMMIT\n",
		"nested table":      "*filter\n*nat\nCOMMIT\n",
		"unterminated":      "*filter\n-A INPUT -m comment --comment \"x -j ACCEPT\nCOMMIT\n",
		"bad address":       "*filter\n-A INPUT -s 10.0.0.300 -j ACCEPT\nCOMMIT\n",
		"bad dnat":          "*nat\n-A PREROUTING -j DNAT --to-destination 10.0.0.1:x\nCOMMIT\n",
		"garbage":           "*filter\nhello\nCOMMIT\n",
		"dangling negate":   "*filter\n-A INPUT !\nCOMMIT\n",
		"chain no policy":   "*filter\n:INPUT\nCOMMIT\n",
		"bad mark target":   "*mangle\n-A PREROUTING -j MARK --frob 1\nCOMMIT\n",
		"-m without module": "*filter\n-A INPUT -m\nCOMMIT\n",
	}
	for name, text := range bad {
		if _, err := ParseSaveString(text, IPv4); err == nil {
			t.Errorf("%s: want an error", name)
		} else if !strings.HasPrefix(err.Error(), "parse iptables-save") {
			t.Errorf("%s: error %q does not name the operation", name, err)
		}
	}
}

func TestTokenize(t *testing.T) {
	got, err := tokenize(`-A X -m comment --comment "dnat name: \"cbr0\" id: \"abc\"" -j  Y`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-A", "X", "-m", "comment", "--comment", `dnat name: "cbr0" id: "abc"`, "-j", "Y"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q", got)
	}
}

func FuzzParseSave(f *testing.F) {
	for _, name := range []string{"appended.save", "prepended.save", "misc.save"} {
		f.Add(readTestdata(f, name))
	}
	f.Add(setFlagsDump)
	f.Add("*filter\n:INPUT DROP [0:0]\n:A - [0:0]\n-A INPUT -g A\n-A A -j INPUT\nCOMMIT\n")
	f.Add("*nat\n-A X -j DNAT --to-destination [::1-::2]:1-2\nCOMMIT\n")
	node := testNode(f)
	pkts := []Packet{
		tcp("10.244.2.9:40000", "10.96.0.20:3306"),
		ping("10.244.1.7", "10.96.0.20"),
		{Proto: ProtoUDP},
	}
	f.Fuzz(func(t *testing.T, text string) {
		rs, err := ParseSaveString(text, IPv4)
		if err != nil {
			return
		}
		// Whatever parsed must also evaluate without panicking.
		for tn, tab := range rs.Tables {
			for cn, c := range tab.Chains {
				if !c.Builtin() {
					continue
				}
				for _, p := range pkts {
					res, err := rs.Evaluate(tn, cn, p, node)
					if err != nil || res == nil || len(res.Path) == 0 {
						t.Fatalf("evaluate %s %s: %v %v", tn, cn, res, err)
					}
				}
			}
		}
	})
}

func TestIPv6Dump(t *testing.T) {
	rs, err := ParseSaveString(`*filter
:INPUT ACCEPT [0:0]
-A INPUT -s fd00:10:244::/64 -p ipv6-icmp -m icmp6 --icmpv6-type 128 -j REJECT
-A INPUT -d ::1/128 -p tcp -m tcp --dport 22 -j DROP
COMMIT
`, IPv6)
	if err != nil {
		t.Fatal(err)
	}
	r := rs.Chain("filter", "INPUT").Rules[0]
	if r.Target.RejectWith != "icmp6-port-unreachable" {
		t.Errorf("default reject-with %q", r.Target.RejectWith)
	}
	p := Packet{Proto: ProtoICMPv6, Src: netip.MustParseAddrPort("[fd00:10:244::5]:0"), Dst: netip.MustParseAddrPort("[fd00::1]:0"),
		ICMPType: 128, ICMPKnown: true, State: CTNew, InIface: "eth0"}
	at, err := rs.Attribute(p, nil, KernelAction{Kind: ActionReject, Hook: "INPUT", ICMPType: 1, ICMPCode: 4})
	if err != nil || at.Uncertain || at.Result.Rule != r {
		t.Fatalf("v6 reject: %v %+v", err, at)
	}
	res, err := rs.Evaluate("filter", "INPUT", tcp("[::1]:5000", "[::1]:22"), nil)
	if err != nil || res.Verdict != VerdictDrop || res.Rule.Index != 2 {
		t.Fatalf("v6 drop: %v %+v", err, res)
	}
	// An IPv4 packet never matches an IPv6 prefix.
	res, err = rs.Evaluate("filter", "INPUT", tcp("127.0.0.1:5000", "127.0.0.1:22"), nil)
	if err != nil || !res.ByPolicy() {
		t.Fatalf("v4 packet: %v %+v", err, res)
	}
}
