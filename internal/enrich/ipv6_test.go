package enrich

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// node6 is a node whose ip6tables filter rejects ping6 to its own
// address; rule is the INPUT rule that does it.
func node6(rule string) *trace.Snapshot {
	return &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "fd00:172:18::2/64", Up: true}},
		Rules: map[string]string{"ip6/filter": "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n" +
			rule + "\nCOMMIT\n"},
	}
}

// ping6Reject is the kernel's ICMPv6 error for a ping6 from a pod to the
// node: the echo request (type 128) answered with adm-prohibited.
func ping6Reject() event.Event {
	return event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet:   event.Tuple{Src: netip.MustParseAddr("fd00:10:244:1::7"), Dst: netip.MustParseAddr("fd00:172:18::2"), Proto: 58},
		ICMPType: 1, ICMPCode: 1}
}

// An echo-request match decides a ping6 flow: the flow opened with one.
func TestAttributePing6ByICMPv6Type(t *testing.T) {
	for _, rule := range []string{
		// what ip6tables-save prints
		"-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 128 -j REJECT --reject-with icmp6-adm-prohibited",
		// what a user writes
		"-A INPUT -p icmpv6 -m icmp6 --icmpv6-type echo-request -j REJECT --reject-with icmp6-adm-prohibited",
	} {
		t.Run(rule, func(t *testing.T) {
			flows := joinOnNode(t, "node-6", node6(rule), nil, ping6Reject())
			if len(flows) != 1 {
				t.Fatalf("%d flows", len(flows))
			}
			f := flows[0]
			if f.Proto != "icmpv6" {
				t.Errorf("proto %q", f.Proto)
			}
			r := f.Rule
			if r == nil || r.Chain != "INPUT" || r.Text != rule {
				t.Fatalf("rule %+v", r)
			}
			if r.Uncertain != "" {
				t.Errorf("echo-request match left undecided: %s", r.Uncertain)
			}
		})
	}
}

// An ip6tables rule is recorded and explained as one; IPv4 rules keep no
// family, as they always had.
func TestIP6TablesRuleFamily(t *testing.T) {
	const rule = "-A INPUT -p ipv6-icmp -j REJECT --reject-with icmp6-adm-prohibited"
	flows := joinOnNode(t, "node-6", node6(rule), nil, ping6Reject())
	if len(flows) != 1 {
		t.Fatalf("%d flows", len(flows))
	}
	f := flows[0]
	if f.Rule == nil || f.Rule.Family != "ip6" || f.Rule.Backend != "" || f.Rule.Text != rule {
		t.Fatalf("rule %+v", f.Rule)
	}
	if want := "ip6tables rule `" + rule + "` (table filter"; !strings.Contains(f.Explanation, want) {
		t.Errorf("explanation lacks %q: %s", want, f.Explanation)
	}

	flows = joinEnriched(t, event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet: tuple(1, "10.244.1.7:7", "10.96.0.10:2048"), ICMPType: 3, ICMPCode: 3})
	if r := flows[0].Rule; r == nil || r.Family != "" {
		t.Fatalf("IPv4 rule %+v", r)
	}
	if !strings.Contains(flows[0].Explanation, "Rule `-A KUBE-IPVS-FILTER") {
		t.Errorf("IPv4 rule evidence changed: %s", flows[0].Explanation)
	}
}

// The same for a native nftables rule: `icmpv6 type echo-request` decides
// which of two rejects sent the error, where an unknown type left both.
func TestAttributePing6NFTICMPv6Type(t *testing.T) {
	const js = `{"nftables": [
{"table": {"family": "ip6", "name": "fw", "handle": 1}},
{"chain": {"family": "ip6", "table": "fw", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
{"rule": {"family": "ip6", "table": "fw", "chain": "input", "handle": 2, "expr": [
  {"match": {"op": "==", "left": {"payload": {"protocol": "icmpv6", "field": "type"}}, "right": "echo-request"}},
  {"reject": {"type": "icmpv6", "expr": "admin-prohibited"}}]}},
{"rule": {"family": "ip6", "table": "fw", "chain": "input", "handle": 3, "expr": [
  {"reject": {"type": "icmpv6", "expr": "admin-prohibited"}}]}}]}`
	snap := &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "fd00:172:18::2/64", Up: true}},
		NFTables:  &trace.NFTRuleset{JSON: []byte(js)},
	}
	flows := joinOnNode(t, "node-6", snap, nil, ping6Reject())
	if len(flows) != 1 {
		t.Fatalf("%d flows", len(flows))
	}
	r := flows[0].Rule
	if r == nil || !r.NFTables() || r.Family != "ip6" || r.Table != "fw" || r.Handle != 2 {
		t.Fatalf("rule %+v", r)
	}
	if r.Uncertain != "" {
		t.Errorf("echo-request match left undecided: %s", r.Uncertain)
	}
}
