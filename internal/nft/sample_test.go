package nft

import (
	"net/netip"
	"os"
	"testing"

	"github.com/tracer-dev/tracer/internal/rules"
)

func load(t testing.TB, name string) *Ruleset {
	t.Helper()
	js, err := os.ReadFile("testdata/" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	txt, err := os.ReadFile("testdata/" + name + ".nft")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Parse(js, txt, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range rs.Warnings {
		t.Errorf("warning: %s", w)
	}
	return rs
}

func tcp(src, dst string) rules.Packet {
	return rules.Packet{Proto: rules.ProtoTCP, Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst), State: rules.CTNew}
}

func TestSampleServiceDNAT(t *testing.T) {
	rs := load(t, "sample")
	node := rules.NewMemNode()
	at, err := rs.Attribute(tcp("10.1.0.9:40000", "172.30.0.44:80"), node,
		rules.KernelAction{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: netip.MustParseAddrPort("10.180.0.5:80")})
	if err != nil || at == nil {
		t.Fatalf("attribute: %v %v", at, err)
	}
	o := at.Outcome
	t.Logf("%s path %v uncertain %v %v notes %v", o.String(), o.Chains(), at.Uncertain, at.Reasons, at.Notes)
	if at.Uncertain || o.Rule == nil || o.Rule.Handle != 33 || o.Rule.Text != "meta l4proto tcp dnat to 10.180.0.5:80" {
		t.Fatalf("got %s", o.String())
	}
	el, _ := o.Element()
	if el == nil || el.KeyText() != "172.30.0.44 . tcp . 80" {
		t.Fatalf("element %v", el.KeyText())
	}
}

func TestSampleClusterIPReject(t *testing.T) {
	rs := load(t, "sample")
	pkt := rules.Packet{Proto: rules.ProtoICMP, Src: netip.MustParseAddrPort("10.1.0.9:0"), Dst: netip.MustParseAddrPort("172.30.0.44:0"), State: rules.CTNew, ICMPType: 8, ICMPKnown: true}
	at, err := rs.Attribute(pkt, rules.NewMemNode(), rules.KernelAction{Kind: rules.ActionReject, Hook: "FORWARD", ICMPType: 3, ICMPCode: 3})
	if err != nil || at == nil {
		t.Fatalf("attribute: %v %v", at, err)
	}
	if at.Uncertain || at.Outcome.Rule.Handle != 22 {
		t.Fatalf("got %s %v", at.Outcome.String(), at.Reasons)
	}
}

func TestSampleNoEndpoint(t *testing.T) {
	rs := load(t, "sample")
	// In the sample, no-endpoint-services is not dispatched from any chain,
	// so a reject to 172.30.0.46 is cluster-ips-check's? No: .46 is not in
	// cluster-ips; the prefix drop catches it.
	at, err := rs.Attribute(tcp("10.1.0.9:40000", "172.30.0.46:80"), rules.NewMemNode(), rules.KernelAction{Kind: rules.ActionDrop, Hook: "FORWARD"})
	if err != nil || at == nil {
		t.Fatalf("attribute: %v %v", at, err)
	}
	if at.Outcome.Rule.Handle != 23 {
		t.Fatalf("got %s", at.Outcome.String())
	}
}

// The watcher checks its two listings against each other by counting:
// the counts must agree on what nft printed, and tell a rule missing from
// one of them.
func TestListedRulesCounts(t *testing.T) {
	for _, name := range []string{"sample", "portmap-v1.10.0", "portmap-v1.10.0-dualstack", "kube-proxy-v1.37.2"} {
		js, _ := os.ReadFile("testdata/" + name + ".json")
		listing, _ := os.ReadFile("testdata/" + name + ".nft")
		rs, err := Parse(js, listing, nil)
		if err != nil {
			t.Fatal(err)
		}
		if j, l := JSONRules(js), ListedRules(listing); j != rs.Rules() || l != rs.Rules() {
			t.Errorf("%s: json %d, listing %d, parsed %d rules", name, j, l, rs.Rules())
		}
		cut := listing[:len(listing)/2]
		if ListedRules(cut) == JSONRules(js) {
			t.Errorf("%s: half a listing counts as many rules as the JSON", name)
		}
	}
}
