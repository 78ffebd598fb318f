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
