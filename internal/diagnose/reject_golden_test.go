package diagnose

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// TestRejectTexts holds the whole explanation of kube-proxy's nftables
// cluster-ips-check verdicts and of the generic rejects, resets and drops
// to testdata: their texts are built piece by piece for speed, and a piece
// lost or doubled shows here. -update rewrites the file.
func TestRejectTexts(t *testing.T) {
	clusterIPs := func(fam, text string) *trace.Rule {
		return &trace.Rule{Backend: trace.BackendNFTables, Family: fam, Table: "kube-proxy", Chain: "cluster-ips-check", Handle: 12,
			EntryChain: "filter-forward", Path: []string{"filter-forward", "cluster-ips-check"}, Text: text}
	}
	nftReject := clusterIPs("ip", `ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`)
	other := &trace.Rule{Table: "filter", Chain: "FORWARD", EntryChain: "FORWARD", Path: []string{"FORWARD"}, Text: "-A FORWARD -d 10.9.9.9/32 -j REJECT --reject-with icmp-host-prohibited"}
	dropRule := &trace.Rule{Table: "filter", Chain: "INPUT", EntryChain: "INPUT", Path: []string{"INPUT"}, Text: "-A INPUT -p tcp --dport 9999 -j DROP"}
	cases := []struct {
		name, proto, src, dst string
		rule                  *trace.Rule
		kinds                 []string
		reason                string // the first event's, when set
		by                    string // a reset's
	}{
		{"ping to a ClusterIP", "icmp", "10.0.0.2:0", "10.96.0.10:0", nftReject, []string{trace.KindReject}, "", ""},
		{"ping6 to a ClusterIP", "icmpv6", "[fd00:10:244:1::7]:0", "[fd00:10:96::a]:0", clusterIPs("ip6", `ip6 daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`), []string{trace.KindReject}, "icmp6-port-unreachable", ""},
		{"wrong port of a ClusterIP", "tcp", "10.0.0.2:40000", "10.96.0.10:8080", nftReject, []string{trace.KindReject, trace.KindDrop}, "", ""},
		{"wrong port of an address no Service has", "tcp", "10.0.0.2:40000", "10.96.9.9:8080", nftReject, []string{trace.KindReject}, "", ""},
		{"unallocated ClusterIP", "tcp", "10.0.0.2:40000", "10.96.9.9:80", clusterIPs("ip", "ip daddr 10.96.0.0/16 drop"), []string{trace.KindDrop}, "", ""},
		{"another rule's reject", "tcp", "10.0.0.2:40000", "10.9.9.9:80", other, []string{trace.KindReject}, "icmp-host-prohibited", ""},
		{"a reject no rule explains", "udp", "10.0.0.2:40000", "10.9.9.8:53", nil, []string{trace.KindReject}, "", ""},
		{"a tcp-reset REJECT", "tcp", "10.0.0.2:40000", "10.9.9.9:80", other, []string{trace.KindReset}, "", trace.ResetByNetfilter},
		{"a REJECT's drop alone", "tcp", "10.0.0.2:40000", "10.9.9.9:80", other, []string{trace.KindDrop}, "", ""},
		{"a rule's drop", "tcp", "10.0.0.2:40000", "172.18.0.2:9999", dropRule, []string{trace.KindDrop}, "NETFILTER_DROP", ""},
		{"a drop without reason", "tcp", "10.0.0.2:40000", "172.18.0.2:9999", nil, []string{trace.KindDrop}, "", ""},
	}
	var got strings.Builder
	for _, c := range cases {
		f := flow(c.proto, c.src, c.dst, "", c.kinds...)
		f.Rule = c.rule
		if c.reason != "" || c.kinds[0] == trace.KindDrop {
			f.Events[0].Reason = c.reason
		}
		if c.by != "" {
			f.Events[0].By = c.by
		}
		r := Diagnose(f, newEnv())
		fmt.Fprintf(&got, "%s: %s: %s\n", c.name, r.Verdict, r.Explanation)
	}
	matchGolden(t, "testdata/rejects.golden", got.String())
}
