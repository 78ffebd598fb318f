package kubeproxy

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/live/livetest"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TestPrivTraceKubeProxyIPTables is TestPrivTraceKubeProxyNFT with the
// real kube-proxy v1.37.2 in iptables mode: the same cluster, Services,
// metadata and attempts from the client pod, checked against the node's
// own tools (which server answered, the node's conntrack, the packet
// counters of `iptables-save -c`, ECONNREFUSED, the ICMP counters of the
// client, the node and the uplink). The tracer must report ClusterIP and
// NodePort connections (TCP, UDP) ok, attributed to the DNAT rule of the
// KUBE-SEP-* chain of the endpoint that answered, with its text as
// iptables-save prints it and the chain path kube-proxy's jumps lead
// through (KUBE-SERVICES, KUBE-NODEPORTS and KUBE-EXT-* for the NodePort,
// KUBE-SVC-*); the Service without endpoints service-no-endpoint by the
// filter table's "has no endpoints" REJECT. A ping and a wrong port to
// the ClusterIP meet no rule on an iptables node (ClusterIPs are not the
// node's addresses and nothing filters them): the node forwards them to
// its default gateway, which drops them, and the tracer must not invent a
// rejection (no clusterip-reject, no ipvs-filter-reject: ok or no flow).
// No other flow may have a verdict but ok. Tiers "best" and "netfilter".
// The host's conntrack settings and rulesets must be unchanged.
//
// The cluster is dual-stack, as TestPrivTraceKubeProxyNFTDualStack's: the
// real kube-proxy's IPv6 proxier writes ip6tables too, and the Service
// attempts (1), (2) and (5) are made over IPv6 as well, each checked the
// same way against `ip6tables-save -c`, `conntrack -L -f ipv6` and the
// client's ICMPv6 counters.
func TestPrivTraceKubeProxyIPTables(t *testing.T) {
	skipShort(t)
	SkipUnlessPrivileged(t)
	requireTools(t, "conntrack", "sysctl")
	checkHostUnchanged(t, IPTables)
	t0 := time.Now()
	c := startTraceClusterOf(t, IPTables, ipv4, ipv6)
	t.Logf("dual-stack cluster, kube-proxy rules of both families and metadata ready in %s", time.Since(t0).Round(time.Millisecond))
	for _, fam := range c.families {
		ipt := c.ipt[fam.nft]
		for k, r := range ipt.sep {
			t.Logf("%s%s: %s", fam.label, k, r.text)
		}
		t.Logf("%sweb/empty: %s", fam.label, ipt.noEndpoint.text)
	}
	for _, tier := range livetest.Tiers {
		t.Run(tier.Name, func(t *testing.T) {
			tier.SkipWithoutLinks(t)
			testIPTablesTier(t, c, tier)
		})
	}
	// kube-proxy rewrites a chain when its Service changes: the rules the
	// checks used must still be the node's.
	for _, fam := range c.families {
		for _, table := range []string{"nat", "filter"} {
			before := c.ipt[fam.nft].saved[table]
			if now := ruleLines(c.kp.saveOf(t, fam, table, false)); now != before {
				t.Errorf("kube-proxy's %s%s table changed during the test; the rules checked were read before:\nbefore:\n%s\nnow:\n%s", fam.label, table, before, now)
			}
		}
	}
}

func testIPTablesTier(t *testing.T, c *traceCluster, tier livetest.Tier) {
	tr := c.startTierTracing(t, tier)
	// (1) and (2): a KUBE-SVC chain's statistic matches pick an endpoint
	// per connection.
	oks := map[string]map[string][]attemptResult{}
	for _, fam := range c.families {
		oks[fam.nft] = c.serviceAttempts(t, fam, c.iptServiceAttempt)
	}

	// (3) ping and (4) a wrong port to the ClusterIP: nothing on the node
	// takes them; they leave through the default route and the uplink
	// drops them.
	pingID := uint16(40000 + len(tier.Name))
	ping := c.forwardedAttempt(t, "ping", "icmp", echoIP, func() (string, error) {
		typ, code, err := pingOnce(c.client, e2eClientIP, echoIP, pingID)
		if err == nil {
			err = fmt.Errorf("answered with ICMP type %d code %d", typ, code)
		}
		return e2eClientIP, err
	}, func() (string, error) { return conntrackICMPReply(c.node, e2eClientIP, echoIP, pingID) })
	wrongDst := net.JoinHostPort(echoIP, strconv.Itoa(wrongPort))
	var wrongSrc string
	wrong := c.forwardedAttempt(t, "wrong port", "tcp", wrongDst, func() (string, error) {
		src, answer, err := fetchTCP(c.client, e2eClientIP, wrongDst)
		if err == nil {
			err = fmt.Errorf("connected, %q answered", answer)
		}
		wrongSrc = src
		return src, err
	}, func() (string, error) { return conntrackReplySource(c.node, "tcp", wrongSrc, wrongDst) })

	// (5) the Service without endpoints: refused by its REJECT in filter.
	var noEPs []attemptResult
	for _, fam := range c.families {
		noEPs = append(noEPs, c.iptNoEndpointAttempt(t, fam, net.JoinHostPort(fam.emptyIP, strconv.Itoa(echoPort))))
	}
	tr.Stop(t)

	// The tracer's flows.
	for i, fam := range c.families {
		ipt, ok := c.ipt[fam.nft], oks[fam.nft]
		for _, a := range ok["clusterip"] {
			c.checkIPTServiceFlow(t, tr, fam, a, []string{"PREROUTING", "KUBE-SERVICES", ipt.echoSVC}, echoTarget)
		}
		for _, a := range ok["nodeport"] {
			c.checkIPTServiceFlow(t, tr, fam, a, []string{"PREROUTING", "KUBE-SERVICES", "KUBE-NODEPORTS", ipt.echoEXT, ipt.echoSVC}, echoTarget)
		}
		for _, a := range ok["udp"] {
			c.checkIPTServiceFlow(t, tr, fam, a, []string{"PREROUTING", "KUBE-SERVICES", ipt.dnsSVC}, dnsTarget)
		}
		c.checkIPTNoEndpointFlow(t, tr, fam, noEPs[i])
	}
	checkNoRejection(t, tr, ping)
	checkNoRejection(t, tr, wrong)
	// Only web/empty's attempts may have a verdict but ok: the ping's and
	// the wrong port's flows, if any, were held to ok above.
	checkNoFalseAlarm(t, tr, noEPs...)
}

// iptRule is a rule as iptables-save prints it: its chain and its "-A"
// line (the text the tracer must name).
type iptRule struct {
	chain, text string
}

// iptRules are the identities read from the node's iptables-save after
// kube-proxy's sync: chain names carry kube-proxy's hashes, never written
// down here.
type iptRules struct {
	// saved are the "-A" lines of the nat and filter tables.
	saved map[string]string
	// echoSVC, dnsSVC: web/echo's KUBE-SVC-* chains for http and dns;
	// echoEXT: the KUBE-EXT-* chain of its http NodePort.
	echoSVC, dnsSVC, echoEXT string
	// sep is the DNAT rule of each endpoint's KUBE-SEP-* chain, by
	// "proto ns/name".
	sep map[string]iptRule
	// noEndpoint is web/empty's "has no endpoints" REJECT in filter.
	noEndpoint iptRule
}

// iptablesSave is `iptables-save -t table` in kp's namespace, with the
// packet counters if counters.
func (kp *KubeProxy) iptablesSave(t *testing.T, table string, counters bool) string {
	t.Helper()
	return kp.saveOf(t, ipv4, table, counters)
}

// saveOf is iptablesSave of fam: ip6tables-save for IPv6.
func (kp *KubeProxy) saveOf(t *testing.T, fam traceFamily, table string, counters bool) string {
	t.Helper()
	cmd := "iptables-save"
	if fam.v6 {
		cmd = "ip6tables-save"
	}
	args := []string{cmd, "-t", table}
	if counters {
		args = append(args, "-c")
	}
	out, err := kp.Exec(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// savedRules are the rules of an iptables-save listing, in order, without
// the packet counters `-c` puts in front.
func savedRules(out string) []iptRule {
	var rules []iptRule
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "[") {
			_, line, _ = strings.Cut(line, " ")
		}
		rest, ok := strings.CutPrefix(line, "-A ")
		if !ok {
			continue
		}
		chain, _, _ := strings.Cut(rest, " ")
		rules = append(rules, iptRule{chain: chain, text: line})
	}
	return rules
}

// ruleLines is a listing's rules alone: iptables-save's header comment
// has the time, its chain lines counters.
func ruleLines(out string) string {
	var lines []string
	for _, r := range savedRules(out) {
		lines = append(lines, r.text)
	}
	return strings.Join(lines, "\n")
}

// packetCounts are the packet counters of `iptables-save -c`, by rule text.
func packetCounts(t *testing.T, out string) map[string]int64 {
	t.Helper()
	n := map[string]int64{}
	for _, line := range strings.Split(out, "\n") {
		counters, text, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(counters, "[") || !strings.HasPrefix(text, "-A ") {
			continue
		}
		pkts, _, _ := strings.Cut(strings.Trim(counters, "[]"), ":")
		v, err := strconv.ParseInt(pkts, 10, 64)
		if err != nil {
			t.Fatalf("packet counter of %q: %v", line, err)
		}
		n[text] = v
	}
	return n
}

// jumpOf is the target of an iptables-save rule (the word after -j).
func jumpOf(text string) string {
	f := strings.Fields(text)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" {
			return f[i+1]
		}
	}
	return ""
}

// findSaved is the one rule of chain (or, ending in "-", of the chains
// with that prefix) containing every string in has.
func findSaved(t *testing.T, rules []iptRule, listing, chain string, has ...string) iptRule {
	t.Helper()
	return findSavedFunc(t, rules, listing, fmt.Sprintf("in %s with %q", chain, has), func(r iptRule) bool {
		inChain := r.chain == chain || strings.HasSuffix(chain, "-") && strings.HasPrefix(r.chain, chain)
		return inChain && !slices.ContainsFunc(has, func(s string) bool { return !strings.Contains(r.text, s) })
	})
}

// findSavedFunc is the one rule keep accepts.
func findSavedFunc(t *testing.T, rules []iptRule, listing, what string, keep func(iptRule) bool) iptRule {
	t.Helper()
	var found []iptRule
	for _, r := range rules {
		if keep(r) {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d rules %s, want one: %+v\n%s", len(found), what, found, listing)
	}
	return found[0]
}

// readIPTablesRules reads the rules the checks expect from the node's own
// iptables-save: the KUBE-SVC-* chains web/echo's ClusterIP rules jump to,
// the KUBE-EXT-* chain of its NodePort, each endpoint's KUBE-SEP-* DNAT
// rule (which its KUBE-SVC-* chain must jump to), and web/empty's REJECT.
func (c *traceCluster) readIPTablesRules(t *testing.T, fam traceFamily) *iptRules {
	t.Helper()
	nat, filter := c.kp.saveOf(t, fam, "nat", false), c.kp.saveOf(t, fam, "filter", false)
	natRules := savedRules(nat)
	ipt := &iptRules{saved: map[string]string{"nat": ruleLines(nat), "filter": ruleLines(filter)}, sep: map[string]iptRule{}}
	svcChain := func(port string) string {
		r := findSaved(t, natRules, nat, "KUBE-SERVICES", fmt.Sprintf(`--comment "web/echo:%s cluster IP"`, port), "-j KUBE-SVC-")
		return jumpOf(r.text)
	}
	ipt.echoSVC, ipt.dnsSVC = svcChain("http"), svcChain("dns")
	// Where nfacct works kube-proxy writes a second rule for the NodePort
	// on 127.0.0.0/8 (localhost NodePorts, counted); the client's
	// connection to the node address takes the other one.
	nodePortRule := fmt.Sprintf("--dport %d -j KUBE-EXT-", echoNodePort)
	ipt.echoEXT = jumpOf(findSavedFunc(t, natRules, nat, "in KUBE-NODEPORTS for the NodePort on every address", func(r iptRule) bool {
		return r.chain == "KUBE-NODEPORTS" && strings.Contains(r.text, nodePortRule) && !strings.Contains(r.text, "-d 127.0.0.0/8")
	}).text)
	if ext := findSaved(t, natRules, nat, ipt.echoEXT, "-j KUBE-SVC-"); jumpOf(ext.text) != ipt.echoSVC {
		t.Fatalf("%s jumps to %s, not to web/echo's http chain %s:\n%s", ipt.echoEXT, jumpOf(ext.text), ipt.echoSVC, nat)
	}
	for _, p := range e2ePods[1:] {
		key := p.ns + "/" + p.name
		for _, port := range []struct {
			proto, svc string
			target     int
		}{{"tcp", ipt.echoSVC, echoTarget}, {"udp", ipt.dnsSVC, dnsTarget}} {
			dnat := findSaved(t, natRules, nat, "KUBE-SEP-", "-p "+port.proto+" ",
				"-j DNAT --to-destination "+net.JoinHostPort(fam.podIP(p), strconv.Itoa(port.target)))
			findSaved(t, natRules, nat, port.svc, "-j "+dnat.chain)
			ipt.sep[port.proto+" "+key] = dnat
		}
	}
	ipt.noEndpoint = findSaved(t, savedRules(filter), filter, "KUBE-SERVICES", `"web/empty:http has no endpoints"`, "-j REJECT")
	return ipt
}

// iptServiceAttempt is serviceAttempt with iptables' own count of it: the
// nat table sees only a connection's first packet, so the DNAT rule of
// the endpoint that answered counts exactly one more packet, the other
// endpoint's none.
func (c *traceCluster) iptServiceAttempt(t *testing.T, what, proto, dst string, target int) (attemptResult, bool) {
	t.Helper()
	fam := familyOf(dst)
	ipt := c.ipt[fam.nft]
	before := packetCounts(t, c.kp.saveOf(t, fam, "nat", true))
	a, ok := c.serviceAttempt(t, what, proto, dst, target)
	if !ok {
		return a, false
	}
	after := packetCounts(t, c.kp.saveOf(t, fam, "nat", true))
	for _, p := range e2ePods[1:] {
		key := p.ns + "/" + p.name
		r := ipt.sep[proto+" "+key]
		want := int64(0)
		if key == a.answer {
			want = 1
		}
		if d := after[r.text] - before[r.text]; d != want {
			t.Errorf("%s: %s → %s answered by %s, but %s counted %d packets, want %d", what, a.src, dst, a.answer, r.text, d, want)
		}
	}
	t.Logf("%s: %s → %s: +1 packet on %s", what, a.src, dst, ipt.sep[proto+" "+a.answer].text)
	return a, true
}

// forwardedAttempt makes an attempt that no rule of the node takes and
// checks what really happens to it, with the tools of the client, the
// node and the uplink: the client gets no answer (try's error is a
// timeout) and no ICMP error; the node sends no ICMP destination
// unreachable, DNATs nothing (no DNAT rule of nat counts a packet; its
// conntrack entry, which reply reads, has the reply from the address the
// client sent to) and forwards it; the uplink drops it as an address it
// may not forward (Ip InAddrErrors).
func (c *traceCluster) forwardedAttempt(t *testing.T, what, proto, dst string, try, reply func() (string, error)) attemptResult {
	t.Helper()
	nat := packetCounts(t, c.kp.iptablesSave(t, "nat", true))
	client, node, uplink := snmp(t, c.client), snmp(t, c.node), snmp(t, c.uplink)
	src, err := try()
	if !isTimeout(err) {
		t.Errorf("%s: %s → %s: %v, want no answer (a timeout)", what, src, dst, err)
	}
	var seen []string
	for _, ch := range []struct {
		ns      netlab.Namespace
		before  map[string]int64
		counter string
		want    func(int64) bool
		says    string
	}{
		{c.client, client, "Icmp:InDestUnreachs", func(d int64) bool { return d == 0 }, "ICMP destination unreachable errors received by the client (want none)"},
		{c.node, node, "Icmp:OutDestUnreachs", func(d int64) bool { return d == 0 }, "ICMP destination unreachable errors sent by the node (want none: nothing there rejects it)"},
		{c.node, node, "Ip:ForwDatagrams", func(d int64) bool { return d >= 1 }, "datagrams the node forwarded (want at least one: out through its default route)"},
		{c.uplink, uplink, "Ip:InAddrErrors", func(d int64) bool { return d >= 1 }, "datagrams the uplink dropped as not its own (want at least one)"},
	} {
		d := snmp(t, ch.ns)[ch.counter] - ch.before[ch.counter]
		if !ch.want(d) {
			t.Errorf("%s: %s → %s: %d %s (%s)", what, src, dst, d, ch.says, ch.counter)
		}
		seen = append(seen, fmt.Sprintf("%s %s %+d", ch.ns.Name, ch.counter, d))
	}
	after := packetCounts(t, c.kp.iptablesSave(t, "nat", true))
	for text, n := range after {
		if jumpOf(text) == "DNAT" && n != nat[text] {
			t.Errorf("%s: %s → %s: %s counted %d packets: the node DNAT'd it", what, src, dst, text, n-nat[text])
		}
	}
	if r, err := reply(); err != nil {
		t.Errorf("%s: %v", what, err)
	} else if r != dst {
		t.Errorf("%s: %s → %s: the node's conntrack has the reply from %s: translated", what, src, dst, r)
	}
	t.Logf("%s: %s → %s: %v; %s", what, src, dst, err, strings.Join(seen, ", "))
	return attemptResult{what, proto, src, dst, ""}
}

// iptNoEndpointAttempt is refusedAttempt with iptables' count of it: the
// REJECT of web/empty counts one packet per ICMP error the node sent and
// the client received (one over IPv4; over IPv6 a connect can meet two,
// see counted). The REJECT sits in filter KUBE-SERVICES, which every sync
// rewrites: a sync during the attempt is named as such (countedWindow)
// rather than taken for a wrong count.
func (c *traceCluster) iptNoEndpointAttempt(t *testing.T, fam traceFamily, dst string) attemptResult {
	t.Helper()
	r := c.ipt[fam.nft].noEndpoint
	synced := c.kp.countedWindow(t)
	before := packetCounts(t, c.kp.saveOf(t, fam, "filter", true))[r.text]
	a := c.counted(t, fam, func() attemptResult { return c.refusedAttempt(t, fam.label+"no endpoint", dst) })
	d := packetCounts(t, c.kp.saveOf(t, fam, "filter", true))[r.text] - before
	switch {
	case synced():
		t.Errorf("%s: kube-proxy synced during %s → %s, which resets the counter of %s: the count cannot be checked", a.what, a.src, dst, r.text)
	case d != a.errors || d < 1:
		t.Errorf("%s: %s → %s refused, but %s counted %d packets, want one per %s error the client received (%d)", a.what, a.src, dst, r.text, d, fam.icmp, a.errors)
	}
	return a.attemptResult
}

// checkIPTServiceFlow checks the flow of a connection kube-proxy's DNAT
// took: ok, the DNAT rule of the KUBE-SEP-* chain of the endpoint that
// answered, reached through the chains of path (the base chain first),
// and the facts checkServiceFlowFacts wants.
func (c *traceCluster) checkIPTServiceFlow(t *testing.T, tr *livetest.Tracing, fam traceFamily, a attemptResult, path []string, target int) {
	t.Helper()
	f := tr.FlowOf(t, a.proto, a.src, a.dst)
	if f == nil {
		return
	}
	t.Logf("%s %s: events %s; %s", a.what, a.src, livetest.EventList(f.Events), f.Explanation)
	sep := c.ipt[fam.nft].sep[a.proto+" "+a.answer]
	path = append(slices.Clip(path), sep.chain)
	if r := f.Rule; r == nil || r.NFTables() || r.Table != "nat" || r.Chain != sep.chain || r.Text != sep.text ||
		!slices.Equal(r.Path, path) || r.Uncertain != "" {
		t.Errorf("%s %s: rule %+v, want nat %q via %v", a.what, a.src, r, sep.text, path)
	}
	checkServiceFlowFacts(t, f, a, target)
}

// checkIPTNoEndpointFlow checks web/empty's flow: service-no-endpoint by
// its REJECT in filter KUBE-SERVICES, reached from FORWARD (a pod's
// connection to a ClusterIP the node routes on).
func (c *traceCluster) checkIPTNoEndpointFlow(t *testing.T, tr *livetest.Tracing, fam traceFamily, a attemptResult) {
	t.Helper()
	f := tr.FlowOf(t, a.proto, a.src, a.dst)
	if f == nil {
		return
	}
	t.Logf("%s: events %s; %s", a.what, livetest.EventList(f.Events), f.Explanation)
	rule, path := c.ipt[fam.nft].noEndpoint, []string{"FORWARD", "KUBE-SERVICES"}
	if r := f.Rule; r == nil || r.NFTables() || r.Table != "filter" || r.Chain != rule.chain || r.Text != rule.text ||
		!slices.Equal(r.Path, path) || r.Uncertain != "" {
		t.Errorf("%s: rule %+v, want filter %q via %v", a.what, r, rule.text, path)
	}
	checkRejectFlowFacts(t, f, a, trace.VerdictServiceNoEndpoint, "web/empty",
		"Service web/empty", `"web/empty:http has no endpoints"`)
}

// checkNoRejection: an attempt nothing on the node rejected has at most
// one flow, and that one ok (no clusterip-reject, ipvs-filter-reject or
// any other verdict).
func checkNoRejection(t *testing.T, tr *livetest.Tracing, a attemptResult) {
	t.Helper()
	fs := tr.FlowsOf(a.proto, a.src, a.dst)
	if len(fs) > 1 {
		t.Errorf("%s: %d flows for %s %s → %s, want at most one: %s", a.what, len(fs), a.proto, a.src, a.dst, livetest.FlowList(fs))
	}
	for _, f := range fs {
		t.Logf("%s: flow %s; events %s; %s", a.what, f.Verdict, livetest.EventList(f.Events), f.Explanation)
		if f.Verdict != trace.VerdictOK {
			t.Errorf("%s: verdict %s, want ok (or no flow): nothing on the node rejected it: %s", a.what, f.Verdict, f.Explanation)
		}
	}
	if len(fs) == 0 {
		t.Logf("%s: no flow", a.what)
	}
}

func snmp(t *testing.T, ns netlab.Namespace) map[string]int64 {
	t.Helper()
	m, err := ns.SNMP()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// isTimeout: the attempt got no answer before its deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
