package kubeproxy

// TestPrivTraceKubeProxyNFT lives here, beside the harness, rather than in
// internal/enrich with the other privileged tests: it needs the control
// plane and the real kube-proxy (this package's Start, checkHostUnchanged
// and the relay), and keeping it out of internal/enrich keeps that
// package, which every VM kernel runs, free of etcd and kube-apiserver.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/live/livetest"
	"github.com/tracer-dev/tracer/internal/meta"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// The cluster of TestPrivTraceKubeProxyNFT, TestPrivTraceKubeProxyIPTables
// and TestPrivTraceKubeProxyIPVS (the same but for kube-proxy's mode). The node is the harness's
// kube-proxy namespace (198.51.100.10 on kp0, pod CIDR 10.180.0.0/24);
// three pod namespaces hang off it on veths, each a /32 routed through
// the node's 10.180.0.1, and its default route leads to an uplink that
// drops everything it would have to forward:
//
//	shop/client 10.180.0.2 --- veth-c ┐
//	web/echo-a  10.180.0.3 --- veth-a ├ node 198.51.100.10 (kp0) --- (kp1) 198.51.100.1 uplink
//	web/echo-b  10.180.0.4 --- veth-b ┘
//
// Services, in the service CIDR 172.30.0.0/16:
//   - web/echo NodePort, ClusterIP 172.30.0.10: tcp 80 "http" -> 8080
//     (NodePort 30080) and udp 53 "dns" -> 5353 (NodePort 30053),
//     endpoints echo-a and echo-b, whose servers answer with their name;
//   - web/empty ClusterIP 172.30.0.20: tcp 80 "http", no endpoints.
const (
	e2eClientIP  = "10.180.0.2"
	e2eEchoA     = "10.180.0.3"
	e2eEchoB     = "10.180.0.4"
	echoIP       = "172.30.0.10"
	emptyIP      = "172.30.0.20"
	echoPort     = 80
	echoTarget   = 8080
	echoNodePort = 30080
	dnsPort      = 53
	dnsTarget    = 5353
	dnsNodePort  = 30053
	// wrongPort is a port no Service has on echo's ClusterIP.
	wrongPort = 81
	// uplinkGW is the node's default gateway, on kp1 in a namespace of
	// its own (the uplink) that answers ARP and forwards nothing: it
	// stands for a router that has no route for the Service CIDR and
	// drops what it gets, without an ICMP error. The route lets traffic
	// to a ClusterIP that no DNAT took leave the node (nftables mode
	// rejects it in filter-forward before that; iptables mode has no such
	// rule). Without a route the node's routing would refuse it first, as
	// "network unreachable"; without an uplink that answers ARP the node
	// would send its own ICMP host unreachable three seconds later, which
	// is the test's doing, not kube-proxy's.
	uplinkGW = "198.51.100.1"
)

// e2ePod is a pod of the cluster: its namespace, name, app label,
// address, IPv6 address (given in a dual-stack cluster only), and the
// network namespace and node-side veth of each.
type e2ePod struct{ ns, name, app, ip, ip6, netns, veth string }

// e2ePods are the pods.
var e2ePods = []e2ePod{
	{"shop", "client", "client", e2eClientIP, e2eClientIP6, "client", "veth-c"},
	{"web", "echo-a", "echo", e2eEchoA, e2eEchoA6, "echo-a", "veth-a"},
	{"web", "echo-b", "echo", e2eEchoB, e2eEchoB6, "echo-b", "veth-b"},
}

func (p e2ePod) key() string { return p.ns + "/" + p.name }

// podByIP is the "ns/name" of a pod address of the test, of either family.
func podByIP(ip string) string {
	for _, p := range e2ePods {
		if p.ip == ip || p.ip6 == ip {
			return p.key()
		}
	}
	return ""
}

// traceFamily is one IP family of the cluster: the addresses the test
// gives the node, the uplink and the pods in it, the Service range and
// ClusterIPs, and how its attempts and rules are named. ipv4 is the one
// of the single-stack tests; a dual-stack cluster has ipv4 and ipv6.
type traceFamily struct {
	// label starts the name of each attempt of the family: "" for IPv4,
	// so the single-stack tests' attempts keep their names.
	label string
	v6    bool
	// nft is the family of kube-proxy's nftables table (ip, ip6); icmp
	// is a ping's flow proto.
	nft, icmp                                      string
	nodeIP, uplinkGW, serviceCIDR, echoIP, emptyIP string
	// unreachable is the ICMP type and code of the port unreachable error
	// nft's plain `reject` sends in the family.
	unreachable [2]int
}

var ipv4 = traceFamily{nft: "ip", icmp: "icmp", nodeIP: DefaultNodeIP, uplinkGW: uplinkGW, serviceCIDR: FixtureServiceCIDR,
	echoIP: echoIP, emptyIP: emptyIP, unreachable: [2]int{3, 3}}

// podIP is p's address in the family.
func (f traceFamily) podIP(p e2ePod) string {
	if f.v6 {
		return p.ip6
	}
	return p.ip
}

// client is the client pod's address in the family.
func (f traceFamily) client() string { return f.podIP(e2ePods[0]) }

// familyOf is the family of an address or endpoint of the cluster.
func familyOf(addr string) traceFamily {
	if isIPv6(addr) {
		return ipv6
	}
	return ipv4
}

// traceCluster is the running cluster, its namespaces, the tracer's
// metadata index and the identities read from the node's own listing of
// kube-proxy's rules (nft or iptables-save, by mode).
type traceCluster struct {
	kp     *KubeProxy
	node   netlab.Namespace
	client netlab.Namespace
	uplink netlab.Namespace
	md     livetest.Config

	// iptables mode: what each family's iptables-save printed, by its
	// nft family (see readIPTablesRules).
	ipt map[string]*iptRules
	// ipvs mode: the IPVS table and KUBE-IPVS-FILTER (see readIPVSState).
	ipvs *ipvsState

	// families are the cluster's IP families, IPv4 first.
	families []traceFamily
	// nftables mode: the rules of each family's table, by its nft family.
	nft map[string]*nftIdents
}

// nftIdents are what `nft -a list table FAMILY kube-proxy` printed in the
// node after the sync, and the rules the checks expect from it.
type nftIdents struct {
	listing string
	rules   []nftRule
	// Chains kube-proxy named for web/echo's ports (their hash is kube-proxy's).
	echoTCPChain, echoUDPChain, echoExternalChain string
	echoDNAT, dnsDNAT                             nftRule
	clusterIPsReject, rejectChain                 nftRule
}

// TestPrivTraceKubeProxyNFT runs the real kube-proxy v1.37.2 in nftables
// mode on a node namespace with pod namespaces around it, Services and
// EndpointSlices created through the API server, and the live tracer
// (metadata from the same API server through internal/meta, as `tracer
// trace --kubeconfig` does). From the client pod it makes real
// connections, reads what happened with the node's and the client's own
// tools (which server answered, the node's conntrack, ECONNREFUSED, the
// ICMP error the client received), and checks that the tracer reports
// each as one flow: ClusterIP and NodePort connections (TCP, UDP) ok,
// attributed to the Service chain's numgen DNAT with handle and text as
// `nft -a list table ip kube-proxy` prints them, the service-ips or
// service-nodeports element, and the endpoint that really answered; a
// ping and a wrong port to the ClusterIP clusterip-reject by
// cluster-ips-check; the Service without endpoints service-no-endpoint,
// named from the no-endpoint-services element's comment; and no other
// verdict for any flow. Tiers "best" and "netfilter" (BPF netfilter links
// only). The host's conntrack settings and rulesets must be unchanged.
func TestPrivTraceKubeProxyNFT(t *testing.T) {
	skipShort(t)
	SkipUnlessPrivileged(t)
	requireTools(t, "conntrack", "sysctl")
	checkHostUnchanged(t, NFTables)
	t0 := time.Now()
	c := startTraceCluster(t, NFTables)
	t.Logf("cluster, kube-proxy rules and metadata ready in %s", time.Since(t0).Round(time.Millisecond))
	c.runNFTTiers(t)
}

// runNFTTiers runs testTraceTier on each tier, then checks that
// kube-proxy's tables are still those the checks read: it flushes and
// refills a Service's chains when the Service changes.
func (c *traceCluster) runNFTTiers(t *testing.T) {
	for _, fam := range c.families {
		id := c.nft[fam.nft]
		t.Logf("web/echo tcp: %s chain %s handle %d: %s", fam.nft, id.echoDNAT.chain, id.echoDNAT.handle, id.echoDNAT.text)
		t.Logf("web/echo udp: %s chain %s handle %d: %s", fam.nft, id.dnsDNAT.chain, id.dnsDNAT.handle, id.dnsDNAT.text)
	}
	for _, tier := range livetest.Tiers {
		t.Run(tier.Name, func(t *testing.T) {
			tier.SkipWithoutLinks(t)
			testTraceTier(t, c, tier)
		})
	}
	for _, fam := range c.families {
		if now, before := c.kp.listTable(t, fam.nft), c.nft[fam.nft].listing; now != before {
			t.Errorf("kube-proxy's %s table changed during the test; the rules checked were read before:\nbefore:\n%s\nnow:\n%s", fam.nft, before, now)
		}
	}
}

// attemptResult is one connection the client made and what the node and
// the client showed of it.
type attemptResult struct {
	what   string
	proto  string // the flow's proto: tcp, udp, icmp
	src    string // the client's endpoint (bare IP for ICMP)
	dst    string // what the client addressed
	answer string // the server that answered (its pod's ns/name)
}

func testTraceTier(t *testing.T, c *traceCluster, tier livetest.Tier) {
	tr := c.startTierTracing(t, tier)
	var runs []nftAttempts
	for _, fam := range c.families {
		runs = append(runs, c.makeNFTAttempts(t, fam, tier))
	}
	tr.Stop(t)

	// The tracer's flows. No false alarm: whatever else the node did
	// (kube-proxy's own API connections through the relay) is ok, and the
	// refused attempts are the only flows with another verdict.
	var failing []attemptResult
	for _, r := range runs {
		c.checkNFTFlows(t, tr, r)
		failing = append(failing, r.ping.attemptResult, r.wrong.attemptResult, r.noEP.attemptResult)
	}
	checkNoFalseAlarm(t, tr, failing...)
}

// nftAttempts are the attempts of one family in a tier and what the node
// showed of them.
type nftAttempts struct {
	fam               traceFamily
	ok                map[string][]attemptResult
	ping, wrong, noEP refused
}

// refused is an attempt the node refused and the number of ICMP errors
// about it the node sent and the client received (the same number): one
// per packet of it the node rejected.
type refused struct {
	attemptResult
	errors int64
}

// counted makes attempt, which the node must refuse, and counts the
// ICMP destination unreachable errors of the family the node sent and the
// client received meanwhile, which must agree. They are not always one:
// on the build host's 6.18 kernel a TCP connect refused over IPv6 meets
// two. The first ICMPv6 error reaches the client while connect() still
// holds the socket (TcpExt LockDroppedIcmps counts it), the connect does
// not fail on it, and the SYN sent again a second later meets the second;
// over IPv4 (LockDroppedIcmps counts it too) the first one ends the
// connect.
func (c *traceCluster) counted(t *testing.T, fam traceFamily, attempt func() attemptResult) refused {
	t.Helper()
	in, out := destUnreachs(t, c.client, "In", fam.v6), destUnreachs(t, c.node, "Out", fam.v6)
	r := refused{attempt(), 0}
	r.errors = destUnreachs(t, c.client, "In", fam.v6) - in
	if sent := destUnreachs(t, c.node, "Out", fam.v6) - out; sent != r.errors {
		t.Errorf("%s: the node sent %d %s destination unreachable errors, the client received %d", r.what, sent, fam.icmp, r.errors)
	}
	return r
}

// makeNFTAttempts makes a family's attempts from the client: (1) and (2)
// the ClusterIP and the NodePort over TCP until both endpoints answered
// (numgen picks an endpoint per connection) and three UDP questions, (3) a
// ping to the ClusterIP, (4) a port no Service has there, (5) the Service
// without endpoints. cluster-ips-check refuses (3) and (4), reject-chain (5).
func (c *traceCluster) makeNFTAttempts(t *testing.T, fam traceFamily, tier livetest.Tier) nftAttempts {
	t.Helper()
	refuse := func(what, ip string, port int) func() attemptResult {
		return func() attemptResult {
			return c.refusedAttempt(t, fam.label+what, net.JoinHostPort(ip, strconv.Itoa(port)))
		}
	}
	return nftAttempts{
		fam:   fam,
		ok:    c.serviceAttempts(t, fam, c.serviceAttempt),
		ping:  c.counted(t, fam, func() attemptResult { return c.rejectedPing(t, fam, uint16(40000+len(tier.Name))) }),
		wrong: c.counted(t, fam, refuse("wrong port", fam.echoIP, wrongPort)),
		noEP:  c.counted(t, fam, refuse("no endpoint", fam.emptyIP, echoPort)),
	}
}

// rejectedPing pings the family's ClusterIP of web/echo from the client,
// which must receive the family's port unreachable about it (and count
// it); cluster-ips-check rejects it.
func (c *traceCluster) rejectedPing(t *testing.T, fam traceFamily, id uint16) attemptResult {
	t.Helper()
	before := destUnreachs(t, c.client, "In", fam.v6)
	typ, code, err := pingOnce(c.client, fam.client(), fam.echoIP, id)
	if err != nil {
		t.Errorf("ping %s: %v", fam.echoIP, err)
	} else if [2]int{typ, code} != fam.unreachable {
		t.Errorf("ping %s: answered with %s type %d code %d, want port unreachable (%d/%d)", fam.echoIP, fam.icmp, typ, code, fam.unreachable[0], fam.unreachable[1])
	}
	if d := destUnreachs(t, c.client, "In", fam.v6) - before; d < 1 {
		t.Errorf("ping %s: the client counted %d %s destination unreachable errors, want one", fam.echoIP, d, fam.icmp)
	}
	t.Logf("ping %s: %s type %d code %d", fam.echoIP, fam.icmp, typ, code)
	return attemptResult{fam.label + "ping", fam.icmp, fam.client(), fam.echoIP, ""}
}

// checkNFTFlows checks the flows of a family's attempts against the rules
// of its kube-proxy table.
func (c *traceCluster) checkNFTFlows(t *testing.T, tr *livetest.Tracing, r nftAttempts) {
	t.Helper()
	fam, id := r.fam, c.nft[r.fam.nft]
	for _, a := range r.ok["clusterip"] {
		c.checkServiceFlow(t, tr, a, id.echoDNAT, "service-ips", fmt.Sprintf("%s . tcp . %d", fam.echoIP, echoPort), nil, echoTarget)
	}
	for _, a := range r.ok["nodeport"] {
		c.checkServiceFlow(t, tr, a, id.echoDNAT, "service-nodeports", fmt.Sprintf("tcp . %d", echoNodePort), []string{id.echoExternalChain}, echoTarget)
	}
	for _, a := range r.ok["udp"] {
		c.checkServiceFlow(t, tr, a, id.dnsDNAT, "service-ips", fmt.Sprintf("%s . udp . %d", fam.echoIP, dnsPort), nil, dnsTarget)
	}
	// What the ClusterIP does accept is kube-proxy's own: the keys of its
	// maps for that address.
	accepts := fmt.Sprintf("it accepts only tcp:%d, udp:%d", echoPort, dnsPort)
	c.checkRejectFlow(t, tr, r.ping, id.clusterIPsReject, trace.VerdictClusterIPReject, nil, "web/echo", "ICMP (ping)", "cluster-ips-check", accepts)
	c.checkRejectFlow(t, tr, r.wrong, id.clusterIPsReject, trace.VerdictClusterIPReject, nil, "web/echo",
		fmt.Sprintf("tcp port %d", wrongPort), "Service web/echo", "cluster-ips-check", accepts)
	c.checkRejectFlow(t, tr, r.noEP, id.rejectChain, trace.VerdictServiceNoEndpoint,
		&trace.RuleElement{Map: "no-endpoint-services", Key: fmt.Sprintf("%s . tcp . %d", fam.emptyIP, echoPort), Comment: "web/empty:http"},
		"web/empty", "Service web/empty", "no-endpoint-services")
}

// startTierTracing starts the live pipeline on the node for tier. The
// netfilter tier is skipped where NAT or icmp_send cannot be seen through
// BPF netfilter links: it would test nothing of what it is meant to.
func (c *traceCluster) startTierTracing(t *testing.T, tier livetest.Tier) *livetest.Tracing {
	t.Helper()
	tr := livetest.Start(t, c.node, c.traceConfig(tier.Only))
	if tier.Only != nil {
		if v := tr.Via(event.HookNFNat); v != event.ViaNetfilter {
			t.Skipf("NAT cannot be seen via the netfilter tier on this kernel (via %s): it needs 6.4+", v)
		}
		if v := tr.Via(event.HookICMPSend); v != event.ViaNetfilter {
			t.Skipf("icmp_send cannot be seen via the netfilter tier on this kernel (via %s): it needs 6.4+", v)
		}
		if v := tr.Via(event.HookICMP6Send); c.dualStack() && v != event.ViaNetfilter {
			t.Skipf("icmp6_send cannot be seen via the netfilter tier on this kernel (via %s): it needs 6.4+", v)
		}
	}
	for _, hp := range tr.P.Plan() {
		t.Logf("hook %s via %s", hp.Hook, hp.Via)
	}
	return tr
}

// untilBothAnswered makes attempts to a Service with two endpoints until
// both have answered (at least 4, at most 20): kube-proxy picks an
// endpoint per connection, at random, and the check should cover both
// choices. try makes one attempt and checks the node's truth for it; it
// returns false when the attempt failed (already reported).
func untilBothAnswered(t *testing.T, what string, try func() (attemptResult, bool)) []attemptResult {
	t.Helper()
	var done []attemptResult
	seen := map[string]bool{}
	for i := 0; i < 20 && (i < 4 || len(seen) < 2); i++ {
		a, ok := try()
		if !ok {
			continue
		}
		seen[a.answer] = true
		done = append(done, a)
	}
	if len(seen) < 2 {
		t.Errorf("%s: only %v answered %d connections: kube-proxy should spread them over both endpoints", what, seen, len(done))
	}
	return done
}

// serviceAttempt makes one connection (tcp) or question (udp) from the
// client to dst and checks the node's conntrack has the reply from the
// endpoint whose server answered.
func (c *traceCluster) serviceAttempt(t *testing.T, what, proto, dst string, target int) (attemptResult, bool) {
	t.Helper()
	ask := fetchTCP
	if proto == "udp" {
		ask = askUDP
	}
	src, answer, err := ask(c.client, familyOf(dst).client(), dst)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return attemptResult{}, false
	}
	c.checkReply(t, what, proto, src, dst, answer, target)
	return attemptResult{what, proto, src, dst, answer}, true
}

// refusedAttempt connects to dst, which must refuse: ECONNREFUSED, and an
// ICMP destination unreachable counted by the client.
func (c *traceCluster) refusedAttempt(t *testing.T, what, dst string) attemptResult {
	t.Helper()
	return refusedFrom(t, what, c.client, familyOf(dst).client(), dst)
}

// refusedFrom connects from ns's address from to dst, which must be
// refused: ECONNREFUSED, and the client counted an ICMP destination
// unreachable.
func refusedFrom(t *testing.T, what string, ns netlab.Namespace, from, dst string) attemptResult {
	t.Helper()
	before := destUnreachs(t, ns, "In", isIPv6(dst))
	src, answer, err := fetchTCP(ns, from, dst)
	if !isRefused(err) {
		t.Errorf("%s: connect %s from %s: %v (read %q), want connection refused", what, dst, src, err, answer)
	}
	if d := destUnreachs(t, ns, "In", isIPv6(dst)) - before; d < 1 {
		t.Errorf("%s: the client counted %d ICMP destination unreachable errors, want one", what, d)
	}
	t.Logf("%s: %s → %s refused (%v)", what, src, dst, err)
	return attemptResult{what, "tcp", src, dst, ""}
}

// checkNoFalseAlarm: every flow but those of the attempts expected to
// fail has verdict ok.
func checkNoFalseAlarm(t *testing.T, tr *livetest.Tracing, failing ...attemptResult) {
	t.Helper()
	expected := map[string]bool{}
	for _, a := range failing {
		expected[a.proto+" "+a.src+" "+a.dst] = true
	}
	for _, f := range tr.All() {
		if f.Verdict != trace.VerdictOK && !expected[f.Proto+" "+f.Orig.Src+" "+f.Orig.Dst] {
			t.Errorf("false alarm: flow %s %s → %s: verdict %s: %s", f.Proto, f.Orig.Src, f.Orig.Dst, f.Verdict, f.Explanation)
		}
	}
	t.Logf("%d flows in all", len(tr.All()))
}

// checkReply checks the node's truth for a connection the client got an
// answer on: the node's conntrack has the reply coming from the endpoint
// whose server answered (a pod address, the target port).
func (c *traceCluster) checkReply(t *testing.T, what, proto, src, dst, answer string, target int) {
	t.Helper()
	reply, err := conntrackReplySource(c.node, proto, src, dst)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	host, port, _ := net.SplitHostPort(reply)
	if podByIP(host) != answer || port != strconv.Itoa(target) {
		t.Errorf("%s: %s → %s: %s answered, but the node's conntrack has the reply from %s (pod %q)", what, src, dst, answer, reply, podByIP(host))
	}
	t.Logf("%s: %s → %s answered by %s; conntrack reply from %s", what, src, dst, answer, reply)
}

// checkServiceFlow checks the one flow of a connection a Service's DNAT
// took: ok, the Service chain's DNAT rule, the map element that led there,
// and the endpoint that answered named as the destination pod.
func (c *traceCluster) checkServiceFlow(t *testing.T, tr *livetest.Tracing, a attemptResult, rule nftRule, elemMap, elemKey string, via []string, target int) {
	t.Helper()
	f := tr.FlowOf(t, a.proto, a.src, a.dst)
	if f == nil {
		return
	}
	t.Logf("%s %s: events %s; %s", a.what, a.src, livetest.EventList(f.Events), f.Explanation)
	r := f.Rule
	if r == nil || !r.NFTables() || r.Family != rule.family || r.Table != "kube-proxy" || r.Chain != rule.chain ||
		r.Handle != rule.handle || r.Text != rule.text || r.EntryChain != "nat-prerouting" || r.Uncertain != "" ||
		!slices.Contains(r.Path, "services") {
		t.Errorf("%s %s: rule %+v, want %s kube-proxy chain %s handle %d %q from nat-prerouting through services", a.what, a.src, r, rule.family, rule.chain, rule.handle, rule.text)
	}
	for _, ch := range via {
		if r != nil && !slices.Contains(r.Path, ch) {
			t.Errorf("%s %s: path %v does not pass %s", a.what, a.src, r.Path, ch)
		}
	}
	if r != nil && (r.Element == nil || r.Element.Map != elemMap || r.Element.Key != elemKey) {
		t.Errorf("%s %s: element %+v, want %s key %q", a.what, a.src, r.Element, elemMap, elemKey)
	}
	checkServiceFlowFacts(t, f, a, target)
}

// checkServiceFlowFacts checks what a Service connection's flow must say
// in either mode: ok, the endpoint that answered named as the destination
// pod and in the explanation, the client pod, the Service, a dnat event.
func checkServiceFlowFacts(t *testing.T, f *trace.Flow, a attemptResult, target int) {
	t.Helper()
	if f.Verdict != trace.VerdictOK {
		t.Errorf("%s %s: verdict %s, want %s: %s", a.what, a.src, f.Verdict, trace.VerdictOK, f.Explanation)
	}
	if f.DstPod == nil || f.DstPod.Key() != a.answer {
		t.Errorf("%s %s: dst_pod %+v, but %s answered", a.what, a.src, f.DstPod, a.answer)
	}
	if f.SrcPod == nil || f.SrcPod.Key() != "shop/client" {
		t.Errorf("%s %s: src_pod %+v, want shop/client", a.what, a.src, f.SrcPod)
	}
	if f.Service.Key() != "web/echo" {
		t.Errorf("%s %s: service %+v, want web/echo", a.what, a.src, f.Service)
	}
	ep := fmt.Sprintf("%s (pod %s)", net.JoinHostPort(familyOf(a.dst).podIP(podOf(a.answer)), strconv.Itoa(target)), a.answer)
	if !strings.Contains(f.Explanation, ep) {
		t.Errorf("%s %s: explanation does not name %s: %s", a.what, a.src, ep, f.Explanation)
	}
	if !slices.ContainsFunc(f.Events, func(e trace.Event) bool { return e.Kind == trace.KindDNAT }) {
		t.Errorf("%s %s: no dnat event in %s", a.what, a.src, livetest.EventList(f.Events))
	}
}

// checkRejectFlow checks the one flow of a refused attempt: the rule that
// refused it (from filter-forward), its element if one named the Service,
// a reject event for each ICMP error the node sent about it, the verdict
// and the facts its explanation must give.
func (c *traceCluster) checkRejectFlow(t *testing.T, tr *livetest.Tracing, a refused, rule nftRule, verdict string, elem *trace.RuleElement, service string, facts ...string) {
	t.Helper()
	f := tr.FlowOf(t, a.proto, a.src, a.dst)
	if f == nil {
		return
	}
	t.Logf("%s: events %s; %s", a.what, livetest.EventList(f.Events), f.Explanation)
	rejects := slices.DeleteFunc(slices.Clone(f.Events), func(e trace.Event) bool { return e.Kind != trace.KindReject })
	if int64(len(rejects)) != a.errors {
		t.Errorf("%s: %d reject events, but the node sent the client %d ICMP errors about it: %s", a.what, len(rejects), a.errors, livetest.EventList(f.Events))
	}
	r := f.Rule
	if r == nil || !r.NFTables() || r.Family != rule.family || r.Table != "kube-proxy" || r.Chain != rule.chain ||
		r.Handle != rule.handle || r.Text != rule.text || r.EntryChain != "filter-forward" || r.Uncertain != "" {
		t.Errorf("%s: rule %+v, want %s kube-proxy chain %s handle %d %q from filter-forward", a.what, r, rule.family, rule.chain, rule.handle, rule.text)
	}
	if elem != nil && (r == nil || r.Element == nil || *r.Element != *elem) {
		t.Errorf("%s: element %+v, want %+v", a.what, ruleElement(r), *elem)
	}
	checkRejectFlowFacts(t, f, a.attemptResult, verdict, service, facts...)
}

// checkRejectFlowFacts checks what a refused attempt's flow must say in
// either mode: the verdict, the Service, the facts of its explanation, a
// reject event.
func checkRejectFlowFacts(t *testing.T, f *trace.Flow, a attemptResult, verdict, service string, facts ...string) {
	t.Helper()
	if f.Verdict != verdict {
		t.Errorf("%s: verdict %s, want %s: %s", a.what, f.Verdict, verdict, f.Explanation)
	}
	if f.Service.Key() != service {
		t.Errorf("%s: service %+v, want %s", a.what, f.Service, service)
	}
	for _, fact := range facts {
		if !strings.Contains(f.Explanation, fact) {
			t.Errorf("%s: explanation lacks %q: %s", a.what, fact, f.Explanation)
		}
	}
	if !slices.ContainsFunc(f.Events, func(e trace.Event) bool { return e.Kind == trace.KindReject }) {
		t.Errorf("%s: no reject event in %s", a.what, livetest.EventList(f.Events))
	}
}

func ruleElement(r *trace.Rule) *trace.RuleElement {
	if r == nil {
		return nil
	}
	return r.Element
}

// ipOfPod is the IPv4 address of pod key ("ns/name").
func ipOfPod(key string) string { return podOf(key).ip }

// podOf is the pod key ("ns/name"), or the zero e2ePod.
func podOf(key string) e2ePod {
	for _, p := range e2ePods {
		if p.key() == key {
			return p
		}
	}
	return e2ePod{}
}

// listTable is `nft -a list table FAMILY kube-proxy` in the node.
func (kp *KubeProxy) listTable(t *testing.T, family string) string {
	t.Helper()
	out, err := kp.Exec("nft", "-a", "list", "table", family, "kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startTraceCluster starts the IPv4 cluster of the single-stack tests,
// with kube-proxy in mode (see startTraceClusterOf).
func startTraceCluster(t *testing.T, mode Mode) *traceCluster {
	t.Helper()
	return startTraceClusterOf(t, mode, ipv4)
}

// startTraceClusterOf starts the control plane with the Service range of
// each family and the tracer's RBAC, the Node, pods, Services and
// EndpointSlices, then kube-proxy in mode (so its first sync writes them
// all), the pod namespaces and their servers, the uplink, the metadata
// index, and reads the identities of the rules to expect from the node's
// own listing: `nft -a list table FAMILY kube-proxy` for each family,
// iptables-save, or in ipvs mode `ipvsadm -Ln` and iptables-save.
// families is ipv4, or ipv4 and ipv6 for a dual-stack cluster.
func startTraceClusterOf(t *testing.T, mode Mode, families ...traceFamily) *traceCluster {
	t.Helper()
	cp, admin := startTraceControlPlane(t, families)
	// Generous: under TCG on a loaded machine kube-proxy's first ipvs-mode
	// sync alone took over a minute (its iptables-restore 5 s).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts := Options{Mode: mode, DualStack: len(families) > 1}
	if err := EnsureNodeOf(ctx, admin, opts); err != nil {
		t.Fatal(err)
	}
	if err := createTraceObjects(ctx, admin, families); err != nil {
		t.Fatal(err)
	}
	kp := Start(t, cp, opts)
	c := &traceCluster{kp: kp, node: netlab.Namespace{Name: kp.Netns}, families: families}
	c.setupNetwork(t)

	// kube-proxy's rules for all of it.
	if _, err := kp.WaitSynced(ctx, traceSynced(mode, families)...); err != nil {
		t.Fatal(err)
	}
	c.md = waitMetadata(t, cp, families)
	switch mode {
	case IPTables:
		c.ipt = map[string]*iptRules{}
		for _, f := range families {
			c.ipt[f.nft] = c.readIPTablesRules(t, f)
		}
	case IPVS:
		c.readIPVSState(t)
	default:
		c.nft = map[string]*nftIdents{}
		for _, f := range families {
			c.nft[f.nft] = c.readRules(t, f)
		}
	}
	return c
}

// startTraceControlPlane starts the control plane with the Service range
// of each family and applies the tracer's RBAC (deploy/rbac.yaml).
func startTraceControlPlane(t *testing.T, families []traceFamily) (*cphelper.ControlPlane, kubernetes.Interface) {
	t.Helper()
	var cidrs []string
	for _, f := range families {
		cidrs = append(cidrs, f.serviceCIDR)
	}
	cp := cphelper.StartWith(t, cphelper.Options{ServiceCIDR: strings.Join(cidrs, ",")})
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cphelper.ApplyFile(ctx, admin, rbacManifest(t)); err != nil {
		t.Fatalf("apply deploy/rbac.yaml: %v", err)
	}
	return cp, admin
}

func (c *traceCluster) dualStack() bool { return len(c.families) > 1 }

// setupNetwork creates the pods' namespaces, linked to the node, with
// their servers, and the uplink; on a dual-stack cluster each link gets
// its IPv6 addresses and routes too, and the namespaces wait out
// duplicate address detection.
func (c *traceCluster) setupNetwork(t *testing.T) {
	t.Helper()
	lab, err := netlab.New(fmt.Sprintf("trkpe2e%d", os.Getpid()%10000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("remove pod namespaces: %v", err)
		}
	})
	nss := []netlab.Namespace{c.node}
	for _, p := range e2ePods {
		ns, err := lab.Namespace(p.netns)
		if err != nil {
			t.Fatal(err)
		}
		podLink(t, ns, c.node, p.veth, p.ip)
		if c.dualStack() {
			podLink6(t, ns, c.node, p.veth, p.ip6)
		}
		if p.name == "client" {
			c.client = ns
		} else {
			c.serve(t, ns, p)
		}
		nss = append(nss, ns)
	}
	c.setupUplink(t, lab)
	if c.dualStack() {
		if err := netlab.SettleIPv6(10*time.Second, append(nss, c.uplink)...); err != nil {
			t.Fatal(err)
		}
	}
}

// serve starts pod p's TCP and UDP servers, which answer with its name: on
// its IPv4 address, or in a dual-stack cluster on one dual-stack socket
// each ([::]), which takes both of its addresses.
func (c *traceCluster) serve(t *testing.T, ns netlab.Namespace, p e2ePod) {
	t.Helper()
	host := p.ip
	if c.dualStack() {
		host = "::"
	}
	serveTCP(t, ns, net.JoinHostPort(host, strconv.Itoa(echoTarget)), p.key())
	serveUDP(t, ns, net.JoinHostPort(host, strconv.Itoa(dnsTarget)), p.key())
}

// setupUplink moves the harness's kp1 (the peer of the node's kp0) to a
// namespace of its own with the gateway's address of each family and
// routes the node's default of each family through it. Its forwarding is
// switched off explicitly (a new namespace takes the host's IPv4
// setting), so it drops what the node routes to it, without an ICMP
// error (see uplinkGW).
func (c *traceCluster) setupUplink(t *testing.T, lab *netlab.Lab) {
	t.Helper()
	uplink, err := lab.Namespace("uplink")
	if err != nil {
		t.Fatal(err)
	}
	c.uplink = uplink
	nsRun(t, c.node, "ip", "link", "set", "kp1", "netns", uplink.Name)
	for _, f := range c.families {
		if err := uplink.Sysctl(f.forwarding(), "0"); err != nil {
			t.Fatal(err)
		}
		nsRun(t, uplink, f.addrAdd(f.uplinkGW+f.uplinkPrefix(), "kp1")...)
	}
	nsRun(t, uplink, "ip", "link", "set", "kp1", "up")
	for _, f := range c.families {
		if err := c.node.Sysctl(f.forwarding(), "1"); err != nil {
			t.Fatal(err)
		}
		nsRun(t, c.node, f.ip("route", "add", "default", "via", f.uplinkGW, "dev", "kp0")...)
	}
}

// ip is the command line `ip ARGS` for the family (`ip -6` for IPv6).
func (f traceFamily) ip(args ...string) []string {
	if f.v6 {
		return append([]string{"ip", "-6"}, args...)
	}
	return append([]string{"ip"}, args...)
}

// addrAdd adds cidr to dev; an IPv6 one without duplicate address
// detection (nodad), so that it can be used at once: the cluster's
// addresses are unique by design.
func (f traceFamily) addrAdd(cidr, dev string) []string {
	if f.v6 {
		return f.ip("addr", "add", cidr, "dev", dev, "nodad")
	}
	return f.ip("addr", "add", cidr, "dev", dev)
}

// uplinkPrefix is the prefix length of the link between node and uplink.
func (f traceFamily) uplinkPrefix() string {
	if f.v6 {
		return "/64"
	}
	return "/24"
}

// forwarding is the sysctl that makes a namespace forward the family.
func (f traceFamily) forwarding() string {
	if f.v6 {
		return "net.ipv6.conf.all.forwarding"
	}
	return "net.ipv4.ip_forward"
}

// waitMetadata opens the tracer's metadata as `tracer trace --kubeconfig`
// does (internal/meta's informers with the tracer's ServiceAccount
// token) and waits until it knows echo-b and web/empty at their addresses
// of every family.
func waitMetadata(t *testing.T, cp *cphelper.ControlPlane, families []traceFamily) livetest.Config {
	t.Helper()
	mctx, mcancel := context.WithCancel(context.Background())
	t.Cleanup(mcancel)
	idx, err := meta.NewFromKubeconfig(mctx, cp.KubeconfigFor(cp.TracerToken()), DefaultNodeName)
	if err != nil {
		t.Fatalf("metadata index: %v", err)
	}
	known := func(f traceFamily) bool {
		_, found := idx.PodByIP(netip.MustParseAddr(f.podIP(e2ePods[2])), time.Now())
		_, svc, hasSvc := idx.ServiceByAddr(netip.MustParseAddr(f.emptyIP), echoPort, "tcp", false, time.Time{})
		return found && hasSvc && svc.Name == "http"
	}
	for start := time.Now(); !idx.Synced() || !all(families, known); time.Sleep(100 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("metadata index not synced after 30 s (synced %v, warnings %q)", idx.Synced(), idx.Warnings())
		}
	}
	return livetest.Config{NodeName: DefaultNodeName, Metadata: enrich.NewIndexMetadata(idx), MetadataSnapshot: idx.Snapshot, MetadataWarnings: idx.Warnings}
}

// all reports whether f holds for every element of s.
func all[T any](s []T, f func(T) bool) bool {
	return !slices.ContainsFunc(s, func(v T) bool { return !f(v) })
}

// traceSynced are what the node's ruleset (Ruleset: nft list ruleset or
// iptables-save) shows once kube-proxy has written all of the test's
// Services: both endpoints of both of web/echo's ports, its NodePort and
// web/empty's rejection; in nftables mode, in the table of each family
// (ip6 kube-proxy, written in a transaction of its own, holds IPv6
// addresses only), and its unallocated-ClusterIP drop.
func traceSynced(mode Mode, families []traceFamily) []string {
	if mode == IPVS {
		return ipvsTraceSynced()
	}
	if mode == IPTables {
		var want []string
		for _, f := range families {
			for _, p := range e2ePods[1:3] {
				for _, port := range []int{echoTarget, dnsTarget} {
					want = append(want, "-j DNAT --to-destination "+net.JoinHostPort(f.podIP(p), strconv.Itoa(port)))
				}
			}
		}
		// Each family's proxier writes its rules in one iptables-restore:
		// its DNATs above come with its REJECT.
		return append(want, fmt.Sprintf("--dport %d -j KUBE-EXT-", echoNodePort), `"web/empty:http has no endpoints"`)
	}
	var want []string
	for _, f := range families {
		a, b := f.podIP(e2ePods[1]), f.podIP(e2ePods[2])
		want = append(want,
			fmt.Sprintf("%s . %d, 1 : %s . %d }", a, echoTarget, b, echoTarget),
			fmt.Sprintf("%s . %d, 1 : %s . %d }", a, dnsTarget, b, dnsTarget),
			fmt.Sprintf(`%s . tcp . %d comment "web/empty:http" : goto reject-chain`, f.emptyIP, echoPort),
			fmt.Sprintf("%s daddr %s drop", f.nft, f.serviceCIDR),
		)
	}
	return append(want, fmt.Sprintf("tcp . %d : goto external-", echoNodePort))
}

// readRules reads the rules the checks expect from the node's own
// `nft -a list table FAMILY kube-proxy`: names, handles and texts are
// kube-proxy's, never written down here.
func (c *traceCluster) readRules(t *testing.T, fam traceFamily) *nftIdents {
	t.Helper()
	id := &nftIdents{listing: c.kp.listTable(t, fam.nft)}
	rules, err := listedRules(fam.nft, id.listing)
	if err != nil {
		t.Fatal(err)
	}
	id.rules = rules
	chainOf := func(prefix, suffix string) string {
		var names []string
		for _, r := range rules {
			if strings.HasPrefix(r.chain, prefix) && strings.HasSuffix(r.chain, suffix) && !slices.Contains(names, r.chain) {
				names = append(names, r.chain)
			}
		}
		if len(names) != 1 {
			t.Fatalf("%d chains %s*%s in %s kube-proxy, want one: %v\n%s", len(names), prefix, suffix, fam.nft, names, id.listing)
		}
		return names[0]
	}
	is := func(name string) func(string) bool { return func(ch string) bool { return ch == name } }
	id.echoTCPChain = chainOf("service-", "-web/echo/tcp/http")
	id.echoUDPChain = chainOf("service-", "-web/echo/udp/dns")
	id.echoExternalChain = chainOf("external-", "-web/echo/tcp/http")
	id.echoDNAT = findRule(t, rules, id.listing, is(id.echoTCPChain), "meta l4proto tcp dnat "+fam.nft+" to numgen random mod 2 map")
	id.dnsDNAT = findRule(t, rules, id.listing, is(id.echoUDPChain), "meta l4proto udp dnat "+fam.nft+" to numgen random mod 2 map")
	id.clusterIPsReject = findRule(t, rules, id.listing, is("cluster-ips-check"), fam.nft+" daddr @cluster-ips reject")
	id.rejectChain = findRule(t, rules, id.listing, is("reject-chain"), "reject")
	return id
}

func rbacManifest(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("locate deploy/rbac.yaml: runtime.Caller failed")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "rbac.yaml")
}

// createTraceObjects writes what the scheduler, the kubelet and the
// endpointslice controller would: the pods bound to this node with their
// addresses in status, web/echo and web/empty, and web/echo's
// EndpointSlices, for each of the families.
func createTraceObjects(ctx context.Context, c kubernetes.Interface, families []traceFamily) error {
	for _, ns := range []string{"shop", "web"} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	created := map[string]*corev1.Pod{}
	for _, p := range e2ePods {
		pod, err := createTracePod(ctx, c, p, families)
		if err != nil {
			return err
		}
		created[p.name] = pod
	}
	for _, svc := range traceServices(families) {
		if _, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
	}
	for _, f := range families {
		slice := echoSlice(f, created["echo-a"], created["echo-b"])
		if _, err := c.DiscoveryV1().EndpointSlices("web").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create endpointslice web/%s: %w", slice.Name, err)
		}
	}
	return nil
}

// createTracePod creates pod p bound to this node, running and ready, with
// its address of each family in status (podIPs) and the node's (hostIPs).
func createTracePod(ctx context.Context, c kubernetes.Interface, p e2ePod, families []traceFamily) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: map[string]string{"app": p.app}},
		Spec: corev1.PodSpec{NodeName: DefaultNodeName, Containers: []corev1.Container{{
			Name: "c", Image: "registry.invalid/app:1",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: echoTarget, Protocol: corev1.ProtocolTCP}},
		}}},
	}
	pod, err := c.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", p.ns, p.name, err)
	}
	pod.Status.Phase = corev1.PodRunning
	for _, f := range families {
		pod.Status.HostIPs = append(pod.Status.HostIPs, corev1.HostIP{IP: f.nodeIP})
		pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: f.podIP(p)})
	}
	pod.Status.HostIP, pod.Status.PodIP = pod.Status.HostIPs[0].IP, pod.Status.PodIPs[0].IP
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", Image: "registry.invalid/app:1", Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if pod, err = c.CoreV1().Pods(p.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("write pod %s/%s status: %w", p.ns, p.name, err)
	}
	return pod, nil
}

// traceServices are web/echo and web/empty with a ClusterIP of each
// family: with two, RequireDualStack, as a user asks for a Service that
// must have both.
func traceServices(families []traceFamily) []*corev1.Service {
	clusterIPs := func(ip func(traceFamily) string) []string {
		var ips []string
		for _, f := range families {
			ips = append(ips, ip(f))
		}
		return ips
	}
	echo := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "echo"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIPs: clusterIPs(func(f traceFamily) string { return f.echoIP }),
			Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: echoPort, TargetPort: intstr.FromInt32(echoTarget), NodePort: echoNodePort},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: dnsPort, TargetPort: intstr.FromInt32(dnsTarget), NodePort: dnsNodePort},
			},
		},
	}
	empty := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "empty"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIPs: clusterIPs(func(f traceFamily) string { return f.emptyIP }),
			Selector: map[string]string{"app": "empty"},
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: echoPort, TargetPort: intstr.FromInt32(echoTarget)}},
		},
	}
	svcs := []*corev1.Service{echo, empty}
	for _, svc := range svcs {
		svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
		if len(families) > 1 {
			svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
			svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		}
	}
	return svcs
}

// echoSlice is web/echo's EndpointSlice of the family's address type:
// echo-a and echo-b at their addresses of that family.
func echoSlice(f traceFamily, pods ...*corev1.Pod) *discoveryv1.EndpointSlice {
	name, addressType := "echo-x1", discoveryv1.AddressTypeIPv4
	if f.v6 {
		name, addressType = "echo-x6", discoveryv1.AddressTypeIPv6
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: "echo", discoveryv1.LabelManagedBy: "tracer-test"}},
		AddressType: addressType,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](echoTarget)},
			{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](dnsTarget)},
		},
	}
	for _, p := range pods {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{f.podIP(podOf(p.Namespace + "/" + p.Name))},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(DefaultNodeName),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		})
	}
	return slice
}

// traceConfig is the cluster's metadata as `tracer trace --kubeconfig`
// passes it, on the given tier.
func (c *traceCluster) traceConfig(only []event.Via) livetest.Config {
	cfg := c.md
	cfg.Only = only
	return cfg
}

// serviceAttempts connects to the family's ClusterIP of web/echo and to
// the NodePort on the node's address of the family until both endpoints
// have answered, so the check covers the kernel's choice itself, and asks
// the ClusterIP's dns port three times over UDP. attempt is the mode's own
// connection and truth check.
func (c *traceCluster) serviceAttempts(t *testing.T, fam traceFamily, attempt func(t *testing.T, what, proto, dst string, target int) (attemptResult, bool)) map[string][]attemptResult {
	clusterIP := net.JoinHostPort(fam.echoIP, strconv.Itoa(echoPort))
	nodePort := net.JoinHostPort(fam.nodeIP, strconv.Itoa(echoNodePort))
	ok := map[string][]attemptResult{}
	for _, a := range []struct{ key, dst string }{{"clusterip", clusterIP}, {"nodeport", nodePort}} {
		ok[a.key] = untilBothAnswered(t, fam.label+a.key, func() (attemptResult, bool) {
			return attempt(t, fam.label+a.key, "tcp", a.dst, echoTarget)
		})
	}
	dnsAddr := net.JoinHostPort(fam.echoIP, strconv.Itoa(dnsPort))
	for i := 0; i < 3; i++ {
		if a, good := attempt(t, fam.label+"udp", "udp", dnsAddr, dnsTarget); good {
			ok["udp"] = append(ok["udp"], a)
		}
	}
	return ok
}
