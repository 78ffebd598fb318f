package enrich_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/live/livetest"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TestPrivDroppedConnectionNeverConfirmed: a node DNATs a Service address
// to an endpoint and its FORWARD chain drops new connections to that
// endpoint, as a NetworkPolicy or a firewall does. The client's connect
// times out, the DROP rule's counter counts its SYNs, and `conntrack -L`
// on the node lists no entry of the client's port: each SYN's new entry
// went with the packet, unconfirmed. The tracer must report the attempt
// as one flow, dropped by that rule, its conntrack state the drop's entry
// marked unconfirmed (DST_NAT, never replied), the explanation saying
// conntrack will not show the connection.
func TestPrivDroppedConnectionNeverConfirmed(t *testing.T) {
	requirePrivileged(t, "iptables", "iptables-save", "conntrack")
	if !loader.LoadReasonNames().KnowsDropReason("NETFILTER_DROP") {
		t.Skip("this kernel gives a netfilter drop no reason (no SKB_DROP_REASON_NETFILTER_DROP, before 5.17), and a free without one is reported only for a packet the kernel answered")
	}
	lab, nss := newLab(t, fmt.Sprintf("trunc%d", os.Getpid()%10000), "c", "n", "e")
	c, n, e := nss["c"], nss["n"], nss["e"]
	must(t, lab.Link(c, "eth0", clientAddr+"/24", n, "cni0", "10.0.0.1/24"))
	must(t, lab.Link(n, "eth1", "10.245.0.1/24", e, "eth0", "10.245.0.2/24"))
	run(t, c, "ip", "route", "add", "default", "via", "10.0.0.1")
	run(t, e, "ip", "route", "add", "default", "via", "10.245.0.1")
	must(t, n.Sysctl("net.ipv4.ip_forward", "1"))
	run(t, n, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", "10.96.0.10", "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", "10.245.0.2:8080")
	run(t, n, "iptables", "-A", "FORWARD", "-d", "10.245.0.2", "-p", "tcp", "--dport", "8080", "-m", "conntrack", "--ctstate", "NEW",
		"-m", "comment", "--comment", "node firewall", "-j", "DROP")
	tr := livetest.Start(t, n, livetest.Config{})

	// The SYN at once and its retransmission a second later.
	src, err := dial(c, clientAddr, "10.96.0.10:80", 1500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("connect from %s: %v; want a timeout (the node drops the SYNs)", src, err)
	}
	_, port, _ := strings.Cut(src, ":")
	if out := run(t, n, "conntrack", "-L", "-p", "tcp", "--orig-port-src", port); strings.Contains(out, "sport="+port) {
		t.Fatalf("conntrack -L lists the client's connection, which the node dropped before confirming it:\n%s", out)
	}
	dropRule, drops := savedRule(t, n, "node firewall", "-j DROP")
	if drops < 2 {
		t.Fatalf("the DROP rule counted %d packets; want the SYN and its retransmission", drops)
	}
	time.Sleep(livetest.Linger + time.Second)
	tr.Stop(t)

	var mine []*trace.Flow
	for _, f := range tr.All() {
		if namesEndpoint(f, src) {
			mine = append(mine, f)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("%d flows name the client's endpoint %s, want its connection's one:\n%s", len(mine), src, flowsJSON(mine))
	}
	f := mine[0]
	t.Logf("%s: %s", f.Verdict, f.Explanation)
	drop := 0
	for _, ev := range f.Events {
		if ev.Kind == trace.KindDrop {
			drop++
		}
	}
	if drop != int(drops) {
		t.Errorf("the flow has %d drops, the rule counted %d: %s", drop, drops, livetest.EventList(f.Events))
	}
	if f.Verdict != trace.VerdictDropped || f.Rule == nil || f.Rule.Text != dropRule {
		t.Errorf("verdict %q, rule %+v; want dropped by %s:\n%s", f.Verdict, f.Rule, dropRule, flowsJSON(mine))
	}
	ct := f.Conntrack
	if ct == nil || !ct.Unconfirmed || ct.Replied || !slices.Contains(ct.Status, "DST_NAT") || slices.Contains(ct.Status, "CONFIRMED") {
		t.Errorf("conntrack %+v; want the dropped SYN's entry: unconfirmed, DST_NAT, never replied", ct)
	}
	if !strings.Contains(f.Explanation, "conntrack -L and conntrack -E do not show it") {
		t.Errorf("the explanation does not say conntrack will not show the connection: %s", f.Explanation)
	}
}
