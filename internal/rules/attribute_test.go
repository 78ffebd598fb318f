package rules

import (
	"net/netip"
	"strings"
	"testing"
)

func dnatTo(hook, to string) KernelAction {
	return KernelAction{Kind: ActionDNAT, Hook: hook, To: netip.MustParseAddrPort(to)}
}

func TestAttributeHijack(t *testing.T) {
	rs := loadSave(t, "appended.save")
	n := testNode(t)
	at, err := rs.Attribute(tcp("10.244.2.9:40000", "10.96.0.20:3306"), n, dnatTo("PREROUTING", "10.244.1.5:3306"))
	if err != nil {
		t.Fatal(err)
	}
	if at.Uncertain || at.Reason() != "" {
		t.Fatalf("uncertain: %v", at.Reasons)
	}
	if at.Result.Rule.Text != "-A "+mysqlChain+" -p tcp -m tcp --dport 3306 -j DNAT --to-destination 10.244.1.5:3306" {
		t.Errorf("rule %q", at.Result.Rule.Text)
	}
	if at.Owner == nil || at.Owner.ContainerID != mysqlID || !at.Owner.Verified {
		t.Errorf("owner %+v", at.Owner)
	}
	if got := at.Result.PathString(); got != "PREROUTING → CNI-HOSTPORT-DNAT → "+mysqlChain {
		t.Errorf("path %q", got)
	}
	// raw and mangle PREROUTING were passed on the way.
	if len(at.Passed) != 2 || at.Passed[0].Table != "raw" || at.Passed[1].Table != "mangle" {
		t.Errorf("passed %d tables", len(at.Passed))
	}
}

func TestAttributeDisagreement(t *testing.T) {
	rs := loadSave(t, "appended.save")
	n := testNode(t)
	cases := []struct {
		name string
		pkt  Packet
		act  KernelAction
		why  string
	}{
		{"wrong-backend", tcp("10.244.2.9:40000", "10.96.0.20:3306"), dnatTo("PREROUTING", "10.244.1.9:3306"), "outside"},
		{"wrong-port", tcp("10.244.2.9:40000", "10.96.0.20:3306"), dnatTo("PREROUTING", "10.244.1.5:3307"), "outside"},
		// The rules accept the service port in nat: whatever DNAT'd it
		// (IPVS, another tool), it was not an iptables rule.
		{"accepted", tcp("10.244.2.9:40000", "10.96.0.20:80"), dnatTo("PREROUTING", "10.244.1.6:80"), "no destination NAT"},
		{"wrong-icmp", ping("10.244.1.7", "10.96.0.20"), KernelAction{Kind: ActionReject, Hook: "INPUT", ICMPType: 3, ICMPCode: 10}, "sends ICMP 3/3"},
		{"reset-not-icmp", tcp("10.244.1.7:40000", "10.96.0.20:443"), KernelAction{Kind: ActionReset, Hook: "INPUT"}, "no TCP reset"},
		{"drop-but-accepted", tcp("10.244.1.7:40000", "10.96.0.20:80"), KernelAction{Kind: ActionDrop, Hook: "INPUT"}, "does not drop"},
		{"masquerade-to-foreign", tcp("10.244.1.7:40000", "10.244.1.5:3306"), KernelAction{Kind: ActionSNAT, Hook: "POSTROUTING",
			To: netip.MustParseAddrPort("8.8.8.8:1000")}, "not known to be one"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.act.Kind == ActionSNAT {
				c.pkt.Mark = 0x2000
			}
			at, err := rs.Attribute(c.pkt, n, c.act)
			if err != nil {
				t.Fatal(err)
			}
			if !at.Uncertain || !strings.Contains(at.Reason(), c.why) {
				t.Errorf("uncertain %v reasons %q: want %q", at.Uncertain, at.Reasons, c.why)
			}
		})
	}
}

func TestAttributeRejectDropSNAT(t *testing.T) {
	rs := loadSave(t, "appended.save")
	n := testNode(t)
	reject := KernelAction{Kind: ActionReject, Hook: "INPUT", ICMPType: 3, ICMPCode: 3}
	at, err := rs.Attribute(ping("10.244.1.7", "10.96.0.20"), n, reject)
	if err != nil {
		t.Fatal(err)
	}
	if at.Uncertain || at.Result.Rule == nil || at.Result.Rule.Chain != "KUBE-IPVS-FILTER" || at.Result.PathString() != "INPUT → KUBE-IPVS-FILTER" {
		t.Fatalf("reject: %+v %v", at.Result.Outcome, at.Reasons)
	}
	if at.Owner != nil {
		t.Errorf("kube-proxy rule with a portmap owner %+v", at.Owner)
	}
	// The drop that follows the ICMP error is the same rule.
	at, err = rs.Attribute(ping("10.244.1.7", "10.96.0.20"), n, KernelAction{Kind: ActionDrop, Hook: "INPUT"})
	if err != nil || at.Uncertain || at.Result.Rule.Chain != "KUBE-IPVS-FILTER" {
		t.Fatalf("drop: %v %+v", err, at)
	}
	// Accept of a service port: the INPUT policy.
	at, err = rs.Attribute(tcp("10.244.1.7:40000", "10.96.0.20:80"), n, KernelAction{Kind: ActionAccept, Hook: "INPUT"})
	if err != nil || at.Uncertain || !at.Result.ByPolicy() {
		t.Fatalf("accept: %v %+v", err, at)
	}
	// Hairpin masquerade to the node's cni0 address.
	p := tcp("10.244.1.7:40000", "10.244.1.5:3306")
	p.Mark = 0x2000
	at, err = rs.Attribute(p, n, KernelAction{Kind: ActionSNAT, Hook: "POSTROUTING", To: netip.MustParseAddrPort("10.244.1.1:40000")})
	if err != nil || at.Uncertain || at.Result.Rule.Chain != PortmapMasqChain {
		t.Fatalf("snat: %v %+v", err, at)
	}
}

func TestAttributeSettlesDoubt(t *testing.T) {
	rs := withRule(t, readTestdata(t, "appended.save"), ":KUBE-SERVICES - [0:0]",
		"-A KUBE-SERVICES -m statistic --mode random --probability 0.50000000000 -j RETURN")
	n := testNode(t)
	pkt := tcp("10.244.2.9:40000", "10.96.0.20:80")
	// The walk alone cannot tell; the kernel's DNAT to nginx-hp can only
	// have come from the hostPort branch.
	at, err := rs.Attribute(pkt, n, dnatTo("PREROUTING", "10.244.1.6:80"))
	if err != nil {
		t.Fatal(err)
	}
	if at.Uncertain || at.Result.Rule == nil || at.Result.Rule.Chain != nginxChain || at.Owner == nil || at.Owner.ContainerID != nginxID {
		t.Fatalf("uncertain %v reasons %v outcome %s", at.Uncertain, at.Reasons, at.Result.Outcome.String())
	}
	if len(at.Notes) == 0 || !strings.Contains(at.Notes[0], "statistic") {
		t.Errorf("notes %q: want the settled statistic rule", at.Notes)
	}
	if len(at.Result.Alternatives) != 1 || at.Result.Alternatives[0].Verdict != VerdictAccept {
		t.Errorf("alternatives %v", at.Result.Alternatives)
	}
	// A kernel that passed it untranslated settles the other branch.
	at, err = rs.Attribute(pkt, n, KernelAction{Kind: ActionAccept, Hook: "PREROUTING"})
	if err != nil {
		t.Fatal(err)
	}
	if at.Uncertain || at.Result.Rule == nil || at.Result.Rule.Chain != "KUBE-SERVICES" || at.Result.Rule.Index != 6 {
		t.Errorf("accept: uncertain %v (%v), outcome %s", at.Uncertain, at.Reasons, at.Result.Outcome.String())
	}
	// A drop agrees with neither: no rule is named with confidence.
	at, err = rs.Attribute(pkt, n, KernelAction{Kind: ActionDrop, Hook: "PREROUTING"})
	if err != nil || !at.Uncertain {
		t.Errorf("drop: %v uncertain %v", err, at.Uncertain)
	}
}

func TestAttributeRanges(t *testing.T) {
	rs := loadSave(t, "misc.save")
	n := NewMemNode()
	if err := n.AddLocal("192.0.2.1", "10.9.0.1"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		pkt   Packet
		to    string
		agree bool
	}{
		{tcp("10.9.9.9:1", "10.8.0.1:9000"), "10.0.0.1:9005", true},
		{tcp("10.9.9.9:1", "10.8.0.1:9000"), "10.0.0.1:9011", false},
		{tcp("10.9.9.9:1", "10.8.0.1:8080"), "10.9.0.1:3128", true}, // REDIRECT
		{tcp("10.9.9.9:1", "10.8.0.1:8080"), "10.9.0.1:3129", false},
		{tcp("10.9.9.9:1", "10.8.0.1:7000"), "10.0.0.5:80", true}, // address range
		{tcp("10.9.9.9:1", "10.8.0.1:7000"), "10.0.0.10:80", false},
		{Packet{Proto: ProtoUDP, Src: netip.MustParseAddrPort("10.9.9.9:1"), Dst: netip.MustParseAddrPort("10.8.0.1:53"), State: CTNew, InIface: "eth0"}, "10.0.0.2:53", true},
		// No port in --to-destination: a DNAT keeps the port.
		{Packet{Proto: ProtoUDP, Src: netip.MustParseAddrPort("10.9.9.9:1"), Dst: netip.MustParseAddrPort("10.8.0.1:53"), State: CTNew, InIface: "eth0"}, "10.0.0.2:54", false},
	}
	for _, c := range cases {
		at, err := rs.Attribute(c.pkt, n, dnatTo("PREROUTING", c.to))
		if err != nil {
			t.Fatal(err)
		}
		if at.Uncertain == c.agree {
			t.Errorf("%s -> %s: uncertain %v (%v), want agreement %v", c.pkt.Dst, c.to, at.Uncertain, at.Reasons, c.agree)
		}
	}
}

func TestAttributeErrors(t *testing.T) {
	rs := loadSave(t, "appended.save")
	for _, act := range []KernelAction{
		{Kind: ActionDNAT, Hook: "NOWHERE", To: netip.MustParseAddrPort("10.0.0.1:1")},
		{Kind: ActionDNAT, Hook: "INPUT", To: netip.MustParseAddrPort("10.0.0.1:1")},
		{Kind: ActionSNAT, Hook: "PREROUTING", To: netip.MustParseAddrPort("10.0.0.1:1")},
		{Kind: ActionDNAT, Hook: "PREROUTING"},
		{Kind: "teleport", Hook: "INPUT"},
	} {
		if _, err := rs.Attribute(Packet{}, nil, act); err == nil {
			t.Errorf("%+v: want an error", act)
		}
	}
	if rt, c, ok := RejectICMP("", IPv6); !ok || rt != 1 || c != 4 {
		t.Errorf("IPv6 default reject %d/%d", rt, c)
	}
}

// In OUTPUT, nat runs before filter: filter must see the DNAT'd address.
func TestAttributeOutputSeesTranslation(t *testing.T) {
	rs := mustParse(t, `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A OUTPUT -d 10.96.0.50/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.3.3:8080
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A OUTPUT -d 10.244.3.3/32 -p tcp -m tcp --dport 8080 -j REJECT --reject-with icmp-host-prohibited
COMMIT
`)
	p := tcp("172.18.0.2:40000", "10.96.0.50:80")
	p.InIface = ""
	at, err := rs.Attribute(p, nil, KernelAction{Kind: ActionReject, Hook: "OUTPUT", ICMPType: 3, ICMPCode: 10})
	if err != nil {
		t.Fatal(err)
	}
	if at.Uncertain || at.Result.Table != "filter" || at.Result.Rule == nil {
		t.Fatalf("uncertain %v reasons %v result %s", at.Uncertain, at.Reasons, at.Result.Outcome.String())
	}
}
