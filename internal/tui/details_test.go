package tui

import (
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"github.com/tracer-dev/tracer/internal/trace"
)

// A native nftables rule is shown with its family, table, handle and the
// map element that led to it, the way nft names them.
func TestRuleLinesNFTables(t *testing.T) {
	f := &trace.Flow{Rule: &trace.Rule{Backend: trace.BackendNFTables, Family: "ip", Table: "kube-proxy", Handle: 29,
		Chain: "reject-chain", EntryChain: "filter-forward", Path: []string{"filter-forward", "service-endpoints-check", "reject-chain"},
		Text: "reject", Element: &trace.RuleElement{Map: "no-endpoint-services", Key: "172.30.0.46 . tcp . 80", Comment: "ns6/svc6:p80"}}}
	got := ansi.Strip(strings.Join(ruleLines(f, 120), "\n"))
	for _, want := range []string{
		"nftables table ip kube-proxy: filter-forward → service-endpoints-check → reject-chain (handle 29)",
		`via element 172.30.0.46 . tcp . 80 of map no-endpoint-services ("ns6/svc6:p80")`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rule lines lack %q:\n%s", want, got)
		}
	}
}

// An ip6tables rule is named as one: its text alone reads like an
// iptables rule.
func TestRuleLinesIP6Tables(t *testing.T) {
	f := &trace.Flow{Rule: &trace.Rule{Family: "ip6", Table: "nat", Chain: "CNI-DN-abc",
		Path: []string{"PREROUTING", "CNI-HOSTPORT-DNAT", "CNI-DN-abc"},
		Text: "-A CNI-DN-abc -p tcp -m tcp --dport 80 -j DNAT --to-destination [fd44:1::2]:8080"}}
	got := ansi.Strip(strings.Join(ruleLines(f, 120), "\n"))
	if want := "ip6tables table nat: PREROUTING → CNI-HOSTPORT-DNAT → CNI-DN-abc"; !strings.Contains(got, want) {
		t.Errorf("rule lines lack %q:\n%s", want, got)
	}
}

// A connection whose entry conntrack never confirmed says so where its
// conntrack state is shown: whoever looks in conntrack finds nothing.
func TestConntrackLinesUnconfirmed(t *testing.T) {
	f := &trace.Flow{Orig: trace.Tuple{Src: "10.0.0.2:4000", Dst: "10.96.0.10:80"},
		Conntrack: &trace.Conntrack{Status: []string{"DST_NAT"}, Unconfirmed: true}}
	got := ansi.Strip(strings.Join(conntrackLines(f), "\n"))
	if want := "state -  UNREPLIED  never confirmed (in no conntrack table)"; !strings.Contains(got, want) {
		t.Errorf("conntrack lines lack %q:\n%s", want, got)
	}
	f.Conntrack.Unconfirmed = false
	if got := ansi.Strip(strings.Join(conntrackLines(f), "\n")); strings.Contains(got, "confirmed") {
		t.Errorf("a confirmed entry's lines say otherwise:\n%s", got)
	}
}
