package lab

import (
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// nftListingSample is nft 1.0.6's `nft -a list ruleset` of a trimmed
// kube-proxy table, its IPv6 proxier's reject (which no IPv4 packet meets)
// and a counting lab policy: elements wrapped over lines, element comments
// with a comma, a chain comment, a counter.
const nftListingSample = `table ip kube-proxy { # handle 1
	comment "rules for kube-proxy"
	set cluster-ips { # handle 1
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 10.96.0.70, 10.96.0.71,
			     10.96.0.72 }
	}

	map no-endpoint-services { # handle 2
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to services with no endpoints"
		elements = { 10.96.0.72 . udp . 53 comment "kube-system/dns:dns" : drop,
			     10.96.0.70 . tcp . 80 comment "shop/cart:http" : goto reject-chain,
			     10.96.0.71 . tcp . 80 comment "shop/cart-a, b:http" : goto reject-chain }
	}

	chain filter-forward { # handle 3
		type filter hook forward priority filter; policy accept;
		ct state new jump service-endpoints-check # handle 6
	}

	chain service-endpoints-check { # handle 4
		ip daddr . meta l4proto . th dport vmap @no-endpoint-services # handle 7
	}

	chain reject-chain { # handle 5
		comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
		reject # handle 8
	}
}
table ip6 kube-proxy { # handle 4
	chain reject-chain { # handle 42
		comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
		reject # handle 43
	}
}
table inet lab-policy { # handle 2
	chain lab-policy { # handle 1
		ip daddr 10.244.2.2 tcp dport 9000 counter packets 3 bytes 180 reject with tcp reset comment "deny backend/api admin" # handle 2
	}
}
`

func TestParseNFTListing(t *testing.T) {
	l, err := parseNFTListing(nftListingSample)
	if err != nil {
		t.Fatal(err)
	}
	kp := l.table("ip", "kube-proxy")
	if kp == nil || len(kp.chains) != 3 || !kp.chain("filter-forward").base || kp.chain("reject-chain").base {
		t.Fatalf("tables %+v", l.tables)
	}
	if n := len(kp.sets["cluster-ips"].elems); n != 3 {
		t.Errorf("cluster-ips has %d elements, want 3", n)
	}
	if el := kp.elem("no-endpoint-services", "10.96.0.71 . tcp . 80"); el == nil || el.comment != "shop/cart-a, b:http" || el.value != "goto reject-chain" {
		t.Errorf("element %+v", el)
	}
	if el := kp.elem("no-endpoint-services", "10.96.0.72 . udp . 53"); el == nil || el.value != "drop" {
		t.Errorf("element %+v", el)
	}
	r := kp.chain("reject-chain").rules
	if len(r) != 1 || r[0].text != "reject" || r[0].handle != 8 {
		t.Errorf("reject-chain rules %+v (its comment is no rule)", r)
	}
	pol := l.table("inet", labPolicyTable).chain(labPolicyTable).rules[0]
	if !pol.counter || pol.packets != 3 || pol.comment() != "deny backend/api admin" {
		t.Errorf("policy rule %+v", pol)
	}
}

func TestProveNFTNoEndpointReject(t *testing.T) {
	l, err := parseNFTListing(nftListingSample)
	if err != nil {
		t.Fatal(err)
	}
	e := &Expectation{Proto: "tcp", Dst: "10.96.0.70:80", Mechanism: NoEndpointReject, Proof: Proof{NodeUnreach: 1}}
	c := &cluster{}
	if missing := c.proveNFT(e, counters{nft: l}, counters{nft: l}); len(missing) != 0 {
		t.Fatalf("unproven: %v", missing)
	}
	r := e.Proof.Rule
	if r == nil || r.Chain != "reject-chain" || r.Handle != 8 || r.Element == nil || r.Element.Comment != "shop/cart:http" {
		t.Fatalf("rule %+v", r)
	}
	e.Proof.NodeUnreach = 0
	if missing := c.proveNFT(e, counters{nft: l}, counters{nft: l}); len(missing) == 0 {
		t.Error("a reject without an ICMP error was proven")
	}
}

func TestCompareNFTRule(t *testing.T) {
	want := RuleHit{Backend: backendNFT, Family: "ip", Table: "kube-proxy", Chain: "reject-chain", Handle: 8, Text: "reject",
		Element: &ElementHit{Map: "no-endpoint-services", Key: "10.96.0.70 . tcp . 80", Comment: "shop/cart:http"}}
	good := trace.Rule{Backend: trace.BackendNFTables, Family: "ip", Table: "kube-proxy", Chain: "reject-chain", Handle: 8, Text: "reject",
		Element: &trace.RuleElement{Map: "no-endpoint-services", Key: "10.96.0.70 . tcp . 80", Comment: "shop/cart:http"}}
	if w := compareNFTRule(good, want); len(w) != 0 {
		t.Fatalf("the same rule differs: %v", w)
	}
	for name, bad := range map[string]func(*trace.Rule){
		"handle":  func(r *trace.Rule) { r.Handle = 9 },
		"family":  func(r *trace.Rule) { r.Family = "inet" },
		"backend": func(r *trace.Rule) { r.Backend = "" },
		"comment": func(r *trace.Rule) {
			r.Element = &trace.RuleElement{Map: "no-endpoint-services", Key: "10.96.0.70 . tcp . 80"}
		},
		"element":   func(r *trace.Rule) { r.Element = nil },
		"uncertain": func(r *trace.Rule) { r.Uncertain = "2 rules could have" },
	} {
		r := good
		bad(&r)
		if w := compareNFTRule(r, want); len(w) == 0 {
			t.Errorf("a rule with another %s passed", name)
		}
	}
	counted := RuleHit{Backend: backendNFT, Family: "inet", Handle: 2, Text: `ip daddr 10.244.2.2 tcp dport 9000 counter packets 3 bytes 180 reject with tcp reset`}
	tracer := trace.Rule{Backend: trace.BackendNFTables, Family: "inet", Handle: 2, Text: strings.Replace(counted.Text, "packets 3 bytes 180", "packets 0 bytes 0", 1)}
	if w := compareNFTRule(tracer, counted); len(w) != 0 {
		t.Errorf("a counter's numbers made the rule differ: %v", w)
	}
}
