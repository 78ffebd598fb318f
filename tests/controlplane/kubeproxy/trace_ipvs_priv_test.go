package kubeproxy

import (
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

// TestPrivTraceKubeProxyIPVS is TestPrivTraceKubeProxyNFT with the real
// kube-proxy v1.37.2 in ipvs mode (scheduler rr, strictARP): the same
// cluster, Services, metadata and attempts from the client pod, checked
// against the node's own tools: which server answered, the node's
// conntrack (vs/conntrack=1 keeps IPVS connections there), the IPVS
// table's own counters (`ipvsadm -Ln --stats --exact`: the real server
// that answered gained one connection, the other none) and connection
// entries (`ipvsadm -Lnc`: the client's endpoint, the virtual server and
// the real server), the packet counters of `iptables-save -c`, ECONNREFUSED
// and the ICMP counters of the client and the node. The tracer must report
// ClusterIP and NodePort connections (TCP, UDP) ok with an ipvs event
// naming the virtual server and the real server that answered; the
// Service without endpoints ipvs-no-endpoint (its virtual server has no
// real server, and ip_vs_leave answers port unreachable), named; a ping
// and a wrong port to the ClusterIP ipvs-filter-reject, by the REJECT rule
// of KUBE-IPVS-FILTER as iptables-save prints it. No other flow may have a
// verdict but ok. Tier "best" only: IPVS's hooks have no BPF netfilter
// rung. The host's settings, rulesets, IPVS table and ipsets must be
// unchanged.
func TestPrivTraceKubeProxyIPVS(t *testing.T) {
	skipShort(t)
	skipOtherIPVSGuests(t)
	SkipUnlessPrivileged(t)
	SkipUnlessIPVS(t)
	requireTools(t, "conntrack", "sysctl", "ipvsadm", "ipset", "curl")
	checkHostUnchanged(t, IPVS)
	t0 := time.Now()
	c := startTraceCluster(t, IPVS)
	t.Logf("cluster, kube-proxy rules and metadata ready in %s", time.Since(t0).Round(time.Millisecond))
	t.Logf("KUBE-IPVS-FILTER: %s", c.ipvs.filterReject)
	for _, tier := range livetest.Tiers {
		t.Run(tier.Name, func(t *testing.T) {
			if tier.Only != nil {
				t.Skip("IPVS's decisions (ip_vs_conn_new, ip_vs_leave) have no BPF netfilter rung in internal/loader's ladders: the netfilter tier cannot see what this test is about")
			}
			testIPVSTier(t, c, tier)
		})
	}
	// kube-proxy rewrites its rules when a Service changes: what the
	// checks used must still be the node's.
	if now := ruleLines(c.kp.iptablesSave(t, "filter", false)); now != c.ipvs.filter {
		t.Errorf("kube-proxy's filter table changed during the test; the rules checked were read before:\nbefore:\n%s\nnow:\n%s", c.ipvs.filter, now)
	}
	if err := c.kp.Stop(); err != nil {
		t.Error(err)
	}
}

func testIPVSTier(t *testing.T, c *traceCluster, tier livetest.Tier) {
	c.ipvs.retried = nil
	tr := c.startTierTracing(t, tier)
	ok := c.serviceAttempts(t, ipv4, c.ipvsServiceAttempt)
	pingID := uint16(40000 + len(tier.Name))
	ping := c.ipvsFilterAttempt(t, "ping", func() attemptResult {
		before := icmpDestUnreachs(t, c.client)
		typ, code, err := pingOnce(c.client, e2eClientIP, echoIP, pingID)
		if err != nil {
			t.Errorf("ping %s: %v", echoIP, err)
		} else if typ != 3 || code != 3 {
			t.Errorf("ping %s: answered with ICMP type %d code %d, want port unreachable (3/3)", echoIP, typ, code)
		}
		if d := icmpDestUnreachs(t, c.client) - before; d < 1 {
			t.Errorf("ping %s: the client counted %d ICMP destination unreachable errors, want one", echoIP, d)
		}
		return attemptResult{"ping", "icmp", e2eClientIP, echoIP, ""}
	}, 1, false)
	wrongDst := net.JoinHostPort(echoIP, strconv.Itoa(wrongPort))
	wrong := c.ipvsFilterAttempt(t, "wrong port", func() attemptResult { return c.refusedAttempt(t, "wrong port", wrongDst) }, 1, true)
	// web/empty's port is in KUBE-CLUSTER-IP: the filter lets it through
	// (its REJECT counts nothing) and IPVS itself refuses.
	emptyDst := net.JoinHostPort(emptyIP, strconv.Itoa(echoPort))
	noEP := c.ipvsFilterAttempt(t, "no endpoint", func() attemptResult { return c.refusedAttempt(t, "no endpoint", emptyDst) }, 0, true)
	tr.Stop(t)

	for _, key := range []string{"clusterip", "nodeport", "udp"} {
		for _, a := range ok[key] {
			c.checkIPVSServiceFlow(t, tr, a)
		}
	}
	// What the ClusterIP accepts is kube-proxy's: its KUBE-CLUSTER-IP
	// entries for that address.
	accepts := []string{"accept only", fmt.Sprintf("tcp:%d", echoPort), fmt.Sprintf("udp:%d", dnsPort)}
	c.checkIPVSFilterFlow(t, tr, ping, append(accepts, "ICMP (ping)")...)
	c.checkIPVSFilterFlow(t, tr, wrong, append(accepts, fmt.Sprintf("tcp port %d", wrongPort))...)
	c.checkIPVSNoEndpointFlow(t, tr, noEP)
	checkNoFalseAlarm(t, tr, append([]attemptResult{ping, wrong, noEP}, c.ipvs.retried...)...)
}

// ipvsState is what the node's own tools showed after kube-proxy's sync.
type ipvsState struct {
	// table is `ipvsadm -Ln` then.
	table string
	// filter is the filter table's rules; filterReject KUBE-IPVS-FILTER's
	// REJECT among them.
	filter, filterReject string
	// retried are the refused attempts made again (see ipvsFilterAttempt):
	// their flows are refused too.
	retried []attemptResult
}

// ipvsTraceSynced are what Ruleset (`ipvsadm -Ln` and iptables-save)
// shows once kube-proxy has written all of the test's Services: the
// virtual servers of web/echo's ClusterIP ports and NodePort, web/empty's
// virtual server, the real servers, and KUBE-IPVS-FILTER's REJECT, which
// comes with the iptables rules at the end of the sync.
func ipvsTraceSynced() []string {
	return []string{
		fmt.Sprintf("TCP  %s:%d rr", echoIP, echoPort),
		fmt.Sprintf("UDP  %s:%d rr", echoIP, dnsPort),
		fmt.Sprintf("TCP  %s:%d rr", DefaultNodeIP, echoNodePort),
		fmt.Sprintf("TCP  %s:%d rr", emptyIP, echoPort),
		fmt.Sprintf("-> %s:%d", e2eEchoA, echoTarget), fmt.Sprintf("-> %s:%d", e2eEchoB, echoTarget),
		fmt.Sprintf("-> %s:%d", e2eEchoA, dnsTarget), fmt.Sprintf("-> %s:%d", e2eEchoB, dnsTarget),
		"-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT",
	}
}

// readIPVSState reads the IPVS table and checks its shape against the
// Services: web/echo's virtual servers have both endpoints as real
// servers, web/empty's has none; and reads KUBE-IPVS-FILTER's REJECT.
func (c *traceCluster) readIPVSState(t *testing.T) {
	t.Helper()
	table, err := c.kp.Exec("ipvsadm", "-Ln")
	if err != nil {
		t.Fatal(err)
	}
	stats := c.kp.ipvsStats(t)
	for _, vs := range []struct {
		proto, addr string
		target      int
	}{
		{"tcp", net.JoinHostPort(echoIP, strconv.Itoa(echoPort)), echoTarget},
		{"udp", net.JoinHostPort(echoIP, strconv.Itoa(dnsPort)), dnsTarget},
		{"tcp", net.JoinHostPort(DefaultNodeIP, strconv.Itoa(echoNodePort)), echoTarget},
	} {
		for _, ip := range []string{e2eEchoA, e2eEchoB} {
			if _, ok := stats[realKey(vs.proto, vs.addr, net.JoinHostPort(ip, strconv.Itoa(vs.target)))]; !ok {
				t.Fatalf("virtual server %s %s has no real server %s:%d:\n%s", vs.proto, vs.addr, ip, vs.target, table)
			}
		}
	}
	empty := "tcp " + net.JoinHostPort(emptyIP, strconv.Itoa(echoPort))
	for k := range stats {
		if strings.HasPrefix(k, empty+" -> ") {
			t.Fatalf("web/empty's virtual server has a real server (%s):\n%s", k, table)
		}
	}
	c.checkClusterIPSet(t)
	filter := c.kp.iptablesSave(t, "filter", false)
	reject := findSaved(t, savedRules(filter), filter, "KUBE-IPVS-FILTER", "--match-set KUBE-IPVS-IPS dst", "-j REJECT")
	c.ipvs = &ipvsState{table: table, filter: ruleLines(filter), filterReject: reject.text}
}

// checkClusterIPSet checks that the node's KUBE-CLUSTER-IP ipset, which
// KUBE-IPVS-FILTER lets through, holds exactly web/echo's two ports for
// its ClusterIP: what the tracer's explanation of a rejection must call
// accepted there.
func (c *traceCluster) checkClusterIPSet(t *testing.T) {
	t.Helper()
	out, err := c.kp.Exec("ipset", "save", "KUBE-CLUSTER-IP")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(out, "\n") {
		if e, ok := strings.CutPrefix(line, "add KUBE-CLUSTER-IP "+echoIP+","); ok {
			got = append(got, e)
		}
	}
	slices.Sort(got)
	if want := []string{fmt.Sprintf("tcp:%d", echoPort), fmt.Sprintf("udp:%d", dnsPort)}; !slices.Equal(got, want) {
		t.Fatalf("KUBE-CLUSTER-IP has %v for %s, want %v:\n%s", got, echoIP, want, out)
	}
}

func realKey(proto, virtual, real string) string { return proto + " " + virtual + " -> " + real }

// ipvsStats are the connection counters of `ipvsadm -Ln --stats --exact`
// in the node, by "proto virtual -> real".
func (kp *KubeProxy) ipvsStats(t *testing.T) map[string]int64 {
	t.Helper()
	out, err := kp.Exec("ipvsadm", "-Ln", "--stats", "--exact")
	if err != nil {
		t.Fatal(err)
	}
	n, err := parseIPVSStats(out)
	if err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	return n
}

// parseIPVSStats reads ipvsadm's statistics listing: a virtual server
// line ("TCP  172.30.0.10:80  Conns InPkts ...") and its real servers
// ("  -> 10.180.0.3:8080  Conns ..."), after two header lines.
func parseIPVSStats(out string) (map[string]int64, error) {
	n := map[string]int64{}
	virtual := ""
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP"):
			virtual = strings.ToLower(f[0]) + " " + f[1]
		case len(f) >= 3 && f[0] == "->" && virtual != "":
			conns, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("connection counter of real server line %q: %w", line, err)
			}
			n[virtual+" -> "+f[1]] = conns
		}
	}
	return n, nil
}

// ipvsStatsMoved polls ipvsStats until a real server of virtual has more
// connections than in before, at most 10 s: the kernel's estimator folds
// the per-CPU counters into the ones ipvsadm reads every 2 s
// (ip_vs_est.c), so a connection shows there up to 2 s late.
func (kp *KubeProxy) ipvsStatsMoved(t *testing.T, proto, virtual string, before map[string]int64) map[string]int64 {
	t.Helper()
	prefix := proto + " " + virtual + " -> "
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		now := kp.ipvsStats(t)
		for k, n := range now {
			if strings.HasPrefix(k, prefix) && n > before[k] {
				return now
			}
		}
		if time.Since(start) > 10*time.Second {
			return now
		}
	}
}

// ipvsConnReal is the real server of the node's IPVS connection entry
// (`ipvsadm -Lnc`) from src to virtual.
func (kp *KubeProxy) ipvsConnReal(proto, src, virtual string) (string, error) {
	reals, out, err := kp.ipvsConnReals(proto, src, virtual)
	if err != nil {
		return "", err
	}
	if len(reals) != 1 {
		return "", fmt.Errorf("%d IPVS connection entries %s %s → %s in the node, want one:\n%s", len(reals), proto, src, virtual, out)
	}
	return reals[0], nil
}

// ipvsConnReals are the real servers of the node's IPVS connection
// entries (`ipvsadm -Lnc`) from src to virtual, and the listing.
func (kp *KubeProxy) ipvsConnReals(proto, src, virtual string) ([]string, string, error) {
	out, err := kp.Exec("ipvsadm", "-Lnc")
	if err != nil {
		return nil, "", fmt.Errorf("read the node's IPVS connections: %w", err)
	}
	var reals []string
	for _, line := range strings.Split(out, "\n") {
		// pro expire state source virtual destination
		f := strings.Fields(line)
		if len(f) == 6 && strings.EqualFold(f[0], proto) && f[3] == src && f[4] == virtual {
			reals = append(reals, f[5])
		}
	}
	return reals, out, nil
}

// ipvsServiceAttempt is serviceAttempt with IPVS's own account of it: the
// virtual server's real server that answered gained one connection, the
// other none, and its connection entry names that real server.
func (c *traceCluster) ipvsServiceAttempt(t *testing.T, what, proto, dst string, target int) (attemptResult, bool) {
	t.Helper()
	before := c.kp.ipvsStats(t)
	a, ok := c.serviceAttempt(t, what, proto, dst, target)
	if !ok {
		return a, false
	}
	after := c.kp.ipvsStatsMoved(t, proto, dst, before)
	answered := net.JoinHostPort(ipOfPod(a.answer), strconv.Itoa(target))
	for _, ip := range []string{e2eEchoA, e2eEchoB} {
		real := net.JoinHostPort(ip, strconv.Itoa(target))
		k := realKey(proto, dst, real)
		want := int64(0)
		if real == answered {
			want = 1
		}
		if d := after[k] - before[k]; d != want {
			t.Errorf("%s: %s → %s answered by %s, but IPVS counted %d connections for real server %s, want %d", what, a.src, dst, a.answer, d, real, want)
		}
	}
	if real, err := c.kp.ipvsConnReal(proto, a.src, dst); err != nil {
		t.Errorf("%s: %v", what, err)
	} else if real != answered {
		t.Errorf("%s: %s → %s answered by %s, but IPVS's connection entry has real server %s", what, a.src, dst, a.answer, real)
	}
	return a, true
}

// ipvsFilterAttempt makes a refused attempt and checks the node's count of
// it: it sent an ICMP destination unreachable, and KUBE-IPVS-FILTER's
// REJECT counted rejects more packets (1: it refused; 0: IPVS did).
// kube-proxy's periodic sync (every 30 s in ipvs mode) restores the filter
// table, which resets its counters (a VM run saw the REJECT's count go
// back to 0 between two attempts). So the attempt waits until kube-proxy
// has synced less than 20 s ago, and one during which it synced all the
// same is made again (tcp, each try its own source port) or fails (the
// ping: the tracer keys ICMP flows by address, so a second ping would be
// the same flow).
func (c *traceCluster) ipvsFilterAttempt(t *testing.T, what string, try func() attemptResult, rejects int64, again bool) attemptResult {
	t.Helper()
	return c.kp.rejectAttempt(t, c.node, c.ipvs.filterReject, what, try, rejects, again, func(a attemptResult) {
		c.ipvs.retried = append(c.ipvs.retried, a)
	})
}

// rejectAttempt is ipvsFilterAttempt on the node kp runs in, for the
// filter rule reject; retried gets each attempt that is made again.
func (kp *KubeProxy) rejectAttempt(t *testing.T, node netlab.Namespace, reject, what string, try func() attemptResult, rejects int64, again bool, retried func(attemptResult)) attemptResult {
	t.Helper()
	for i := 1; ; i++ {
		kp.waitRecentSync(t, 20*time.Second)
		syncs := kp.syncCount(t)
		before, sent := packetCounts(t, kp.iptablesSave(t, "filter", true))[reject], snmp(t, node)
		a := try()
		counted := packetCounts(t, kp.iptablesSave(t, "filter", true))[reject] - before
		if now := kp.syncCount(t); now != syncs {
			if again && i < 3 {
				retried(a)
				t.Logf("%s: kube-proxy synced during the attempt (%d syncs, then %d): its counters were reset, again", what, syncs, now)
				continue
			}
			t.Errorf("%s: kube-proxy synced during the attempt (%d syncs, then %d), which resets the REJECT's counter: the count cannot be checked", what, syncs, now)
		} else if counted != rejects {
			t.Errorf("%s: %s → %s: %s counted %d packets, want %d", what, a.src, a.dst, reject, counted, rejects)
		}
		if d := snmp(t, node)["Icmp:OutDestUnreachs"] - sent["Icmp:OutDestUnreachs"]; d < 1 {
			t.Errorf("%s: %s → %s: the node sent %d ICMP destination unreachable errors (Icmp OutDestUnreachs), want one", what, a.src, a.dst, d)
		}
		return a
	}
}

// countedWindow starts a check of counters that a kube-proxy sync resets
// and returns a function that says whether kube-proxy synced since, so
// the check can tell a reset from a wrong count. Every iptables-mode sync,
// partial ones included, rewrites the top-level filter chains
// (KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-NODEPORTS, ...) and so
// zeroes their rules' counters. It does not wait: iptables mode has no
// periodic sync (its runner's maxInterval is FullSyncPeriod, an hour;
// pkg/proxy/iptables/proxier.go), so with the objects unchanged none comes.
// ipvs mode's does, every 30 s (ipvsFilterAttempt waits for it).
func (kp *KubeProxy) countedWindow(t *testing.T) (synced func() bool) {
	t.Helper()
	before := kp.syncCount(t)
	return func() bool { return kp.syncCount(t) != before }
}

// waitRecentSync waits (at most 40 s) until kube-proxy's last IPv4 sync
// finished less than within ago, by its
// sync_proxy_rules_last_timestamp_seconds and the clock it shares with
// the test.
func (kp *KubeProxy) waitRecentSync(t *testing.T, within time.Duration) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		last := kp.metric(t, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`)
		age := time.Since(time.Unix(0, int64(last*1e9)))
		if age < within {
			return
		}
		if time.Since(start) > 40*time.Second {
			t.Fatalf("kube-proxy's last sync is %s old after waiting 40 s: it syncs every 30 s", age.Round(time.Second))
		}
	}
}

// syncCount is how many IPv4 syncs kube-proxy has finished: the count of
// its sync_proxy_rules_duration_seconds histogram.
func (kp *KubeProxy) syncCount(t *testing.T) int64 {
	t.Helper()
	return int64(kp.metric(t, `kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`))
}

// metric is one sample of kube-proxy's metrics endpoint in the node.
func (kp *KubeProxy) metric(t *testing.T, name string) float64 {
	t.Helper()
	out, err := kp.Exec("curl", "-sS", "--max-time", "10", "http://127.0.0.1:10249/metrics")
	if err != nil {
		t.Fatalf("read kube-proxy's metrics: %v", err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("kube-proxy's metric %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("kube-proxy's metrics have no %s:\n%s", name, out)
	return 0
}

// checkIPVSServiceFlow checks the one flow of a connection IPVS took: an
// ipvs event from the virtual server the client addressed to the real
// server that answered, and the facts every Service flow must have.
func (c *traceCluster) checkIPVSServiceFlow(t *testing.T, tr *livetest.Tracing, a attemptResult) {
	t.Helper()
	f := tr.FlowOf(t, a.proto, a.src, a.dst)
	if f == nil {
		return
	}
	t.Logf("%s %s: events %s; %s", a.what, a.src, livetest.EventList(f.Events), f.Explanation)
	target := echoTarget
	if a.proto == "udp" {
		target = dnsTarget
	}
	real := net.JoinHostPort(ipOfPod(a.answer), strconv.Itoa(target))
	i := slices.IndexFunc(f.Events, func(e trace.Event) bool { return e.Kind == trace.KindIPVS })
	if i < 0 {
		t.Errorf("%s %s: no ipvs event in %s", a.what, a.src, livetest.EventList(f.Events))
	} else if e := f.Events[i]; e.Virtual != a.dst || e.To != real || e.Forward != "masq" {
		t.Errorf("%s %s: ipvs event virtual %q to %q (%s), want virtual %s to real server %s (masq)", a.what, a.src, e.Virtual, e.To, e.Forward, a.dst, real)
	}
	checkFlowFacts(t, f, a, real, trace.VerdictOK)
}

// checkFlowFacts: verdict, the client pod, web/echo, the endpoint that
// answered as the destination pod and named in the explanation.
func checkFlowFacts(t *testing.T, f *trace.Flow, a attemptResult, real, verdict string) {
	t.Helper()
	if f.Verdict != verdict {
		t.Errorf("%s %s: verdict %s, want %s: %s", a.what, a.src, f.Verdict, verdict, f.Explanation)
	}
	if f.SrcPod == nil || f.SrcPod.Key() != "shop/client" {
		t.Errorf("%s %s: src_pod %+v, want shop/client", a.what, a.src, f.SrcPod)
	}
	if f.Service.Key() != "web/echo" {
		t.Errorf("%s %s: service %+v, want web/echo", a.what, a.src, f.Service)
	}
	if f.DstPod == nil || f.DstPod.Key() != a.answer {
		t.Errorf("%s %s: dst_pod %+v, but %s answered", a.what, a.src, f.DstPod, a.answer)
	}
	if ep := fmt.Sprintf("%s (pod %s)", real, a.answer); !strings.Contains(f.Explanation, ep) {
		t.Errorf("%s %s: explanation does not name %s: %s", a.what, a.src, ep, f.Explanation)
	}
}

// checkIPVSFilterFlow checks the flow of an attempt KUBE-IPVS-FILTER
// refused: ipvs-filter-reject by its REJECT, reached from INPUT (the
// ClusterIP is local on kube-ipvs0), web/echo named, and what the
// explanation must say.
func (c *traceCluster) checkIPVSFilterFlow(t *testing.T, tr *livetest.Tracing, a attemptResult, facts ...string) {
	t.Helper()
	f := tr.FlowOf(t, a.proto, a.src, a.dst)
	if f == nil {
		return
	}
	t.Logf("%s: events %s; %s", a.what, livetest.EventList(f.Events), f.Explanation)
	path := []string{"INPUT", "KUBE-IPVS-FILTER"}
	if r := f.Rule; r == nil || r.NFTables() || r.Table != "filter" || r.Chain != "KUBE-IPVS-FILTER" || r.Text != c.ipvs.filterReject ||
		!slices.Equal(r.Path, path) || r.Uncertain != "" {
		t.Errorf("%s: rule %+v, want filter %q via %v", a.what, r, c.ipvs.filterReject, path)
	}
	checkRejectFlowFacts(t, f, a, trace.VerdictIPVSFilterReject, "web/echo", append(facts, "KUBE-IPVS-FILTER")...)
}

// checkIPVSNoEndpointFlow checks web/empty's flow: ipvs-no-endpoint, no
// netfilter rule (IPVS refused it), the virtual server and the Service
// named.
func (c *traceCluster) checkIPVSNoEndpointFlow(t *testing.T, tr *livetest.Tracing, a attemptResult) {
	t.Helper()
	f := tr.FlowOf(t, a.proto, a.src, a.dst)
	if f == nil {
		return
	}
	t.Logf("%s: events %s; %s", a.what, livetest.EventList(f.Events), f.Explanation)
	if f.Rule != nil {
		t.Errorf("%s: rule %+v, want none: IPVS refused it, no netfilter rule", a.what, f.Rule)
	}
	if !slices.ContainsFunc(f.Events, func(e trace.Event) bool { return e.Kind == trace.KindIPVSNoDest }) {
		t.Errorf("%s: no ipvs-no-dest event in %s", a.what, livetest.EventList(f.Events))
	}
	checkRejectFlowFacts(t, f, a, trace.VerdictIPVSNoEndpoint, "web/empty", a.dst+" (Service web/empty)", "ip_vs_leave")
}
