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

// e2ePods are the pods: their namespace, name, app label, address, and
// the network namespace and node-side veth of each.
var e2ePods = []struct{ ns, name, app, ip, netns, veth string }{
	{"shop", "client", "client", e2eClientIP, "client", "veth-c"},
	{"web", "echo-a", "echo", e2eEchoA, "echo-a", "veth-a"},
	{"web", "echo-b", "echo", e2eEchoB, "echo-b", "veth-b"},
}

// podByIP is the "ns/name" of a pod address of the test.
func podByIP(ip string) string {
	for _, p := range e2ePods {
		if p.ip == ip {
			return p.ns + "/" + p.name
		}
	}
	return ""
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

	// iptables mode: what iptables-save printed (see readIPTablesRules).
	ipt *iptRules
	// ipvs mode: the IPVS table and KUBE-IPVS-FILTER (see readIPVSState).
	ipvs *ipvsState

	// nftables mode: what `nft -a list table ip kube-proxy` printed.
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
	t.Logf("web/echo tcp: chain %s handle %d: %s", c.echoDNAT.chain, c.echoDNAT.handle, c.echoDNAT.text)
	t.Logf("web/echo udp: chain %s handle %d: %s", c.dnsDNAT.chain, c.dnsDNAT.handle, c.dnsDNAT.text)
	for _, tier := range livetest.Tiers {
		t.Run(tier.Name, func(t *testing.T) {
			tier.SkipWithoutLinks(t)
			testTraceTier(t, c, tier)
		})
	}
	// kube-proxy flushes and refills a Service's chains when it changes:
	// the identities the checks used must still be the node's.
	if now := c.kp.listTable(t); now != c.listing {
		t.Errorf("kube-proxy's table changed during the test; the rules checked were read before:\nbefore:\n%s\nnow:\n%s", c.listing, now)
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
	// (1) and (2): numgen picks an endpoint per connection.
	ok := c.serviceAttempts(t, c.serviceAttempt)

	// (3) ping to the ClusterIP: cluster-ips-check rejects it.
	before := icmpDestUnreachs(t, c.client)
	typ, code, err := pingOnce(c.client, e2eClientIP, echoIP, uint16(40000+len(tier.Name)))
	if err != nil {
		t.Errorf("ping %s: %v", echoIP, err)
	} else if typ != 3 || code != 3 {
		t.Errorf("ping %s: answered with ICMP type %d code %d, want port unreachable (3/3)", echoIP, typ, code)
	}
	if d := icmpDestUnreachs(t, c.client) - before; d < 1 {
		t.Errorf("ping %s: the client counted %d ICMP destination unreachable errors, want one", echoIP, d)
	}
	ping := attemptResult{"ping", "icmp", e2eClientIP, echoIP, ""}
	t.Logf("ping %s: ICMP type %d code %d", echoIP, typ, code)

	// (4) a port no Service has on the ClusterIP, (5) the Service without
	// endpoints: both refused.
	wrong := c.refusedAttempt(t, "wrong port", net.JoinHostPort(echoIP, strconv.Itoa(wrongPort)))
	noEP := c.refusedAttempt(t, "no endpoint", net.JoinHostPort(emptyIP, strconv.Itoa(echoPort)))
	tr.Stop(t)

	// The tracer's flows.
	for _, a := range ok["clusterip"] {
		c.checkServiceFlow(t, tr, a, c.echoDNAT, "service-ips", fmt.Sprintf("%s . tcp . %d", echoIP, echoPort), nil, echoTarget)
	}
	for _, a := range ok["nodeport"] {
		c.checkServiceFlow(t, tr, a, c.echoDNAT, "service-nodeports", fmt.Sprintf("tcp . %d", echoNodePort), []string{c.echoExternalChain}, echoTarget)
	}
	for _, a := range ok["udp"] {
		c.checkServiceFlow(t, tr, a, c.dnsDNAT, "service-ips", fmt.Sprintf("%s . udp . %d", echoIP, dnsPort), nil, dnsTarget)
	}
	// What the ClusterIP does accept is kube-proxy's own: the keys of its
	// maps for that address.
	accepts := fmt.Sprintf("it accepts only tcp:%d, udp:%d", echoPort, dnsPort)
	c.checkRejectFlow(t, tr, ping, c.clusterIPsReject, trace.VerdictClusterIPReject, nil, "web/echo", "ICMP (ping)", "cluster-ips-check", accepts)
	c.checkRejectFlow(t, tr, wrong, c.clusterIPsReject, trace.VerdictClusterIPReject, nil, "web/echo",
		fmt.Sprintf("tcp port %d", wrongPort), "Service web/echo", "cluster-ips-check", accepts)
	c.checkRejectFlow(t, tr, noEP, c.rejectChain, trace.VerdictServiceNoEndpoint,
		&trace.RuleElement{Map: "no-endpoint-services", Key: fmt.Sprintf("%s . tcp . %d", emptyIP, echoPort), Comment: "web/empty:http"},
		"web/empty", "Service web/empty", "no-endpoint-services")

	// No false alarm: whatever else the node did (kube-proxy's own API
	// connections through the relay) is ok, and the refused attempts are
	// the only flows with another verdict.
	checkNoFalseAlarm(t, tr, ping, wrong, noEP)
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
	src, answer, err := ask(c.client, e2eClientIP, dst)
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
	return refusedFrom(t, what, c.client, e2eClientIP, dst)
}

// refusedFrom connects from ns's address from to dst, which must be
// refused: ECONNREFUSED, and the client counted an ICMP destination
// unreachable.
func refusedFrom(t *testing.T, what string, ns netlab.Namespace, from, dst string) attemptResult {
	t.Helper()
	before := icmpDestUnreachs(t, ns)
	src, answer, err := fetchTCP(ns, from, dst)
	if !isRefused(err) {
		t.Errorf("%s: connect %s from %s: %v (read %q), want connection refused", what, dst, src, err, answer)
	}
	if d := icmpDestUnreachs(t, ns) - before; d < 1 {
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
	if r == nil || !r.NFTables() || r.Family != "ip" || r.Table != "kube-proxy" || r.Chain != rule.chain ||
		r.Handle != rule.handle || r.Text != rule.text || r.EntryChain != "nat-prerouting" || r.Uncertain != "" ||
		!slices.Contains(r.Path, "services") {
		t.Errorf("%s %s: rule %+v, want ip kube-proxy chain %s handle %d %q from nat-prerouting through services", a.what, a.src, r, rule.chain, rule.handle, rule.text)
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
	ep := fmt.Sprintf("%s (pod %s)", net.JoinHostPort(ipOfPod(a.answer), strconv.Itoa(target)), a.answer)
	if !strings.Contains(f.Explanation, ep) {
		t.Errorf("%s %s: explanation does not name %s: %s", a.what, a.src, ep, f.Explanation)
	}
	if !slices.ContainsFunc(f.Events, func(e trace.Event) bool { return e.Kind == trace.KindDNAT }) {
		t.Errorf("%s %s: no dnat event in %s", a.what, a.src, livetest.EventList(f.Events))
	}
}

// checkRejectFlow checks the one flow of a refused attempt: the rule that
// refused it (from filter-forward), its element if one named the Service,
// the verdict and the facts its explanation must give.
func (c *traceCluster) checkRejectFlow(t *testing.T, tr *livetest.Tracing, a attemptResult, rule nftRule, verdict string, elem *trace.RuleElement, service string, facts ...string) {
	t.Helper()
	f := tr.FlowOf(t, a.proto, a.src, a.dst)
	if f == nil {
		return
	}
	t.Logf("%s: events %s; %s", a.what, livetest.EventList(f.Events), f.Explanation)
	r := f.Rule
	if r == nil || !r.NFTables() || r.Family != "ip" || r.Table != "kube-proxy" || r.Chain != rule.chain ||
		r.Handle != rule.handle || r.Text != rule.text || r.EntryChain != "filter-forward" || r.Uncertain != "" {
		t.Errorf("%s: rule %+v, want ip kube-proxy chain %s handle %d %q from filter-forward", a.what, r, rule.chain, rule.handle, rule.text)
	}
	if elem != nil && (r == nil || r.Element == nil || *r.Element != *elem) {
		t.Errorf("%s: element %+v, want %+v", a.what, ruleElement(r), *elem)
	}
	checkRejectFlowFacts(t, f, a, verdict, service, facts...)
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

func ipOfPod(key string) string {
	for _, p := range e2ePods {
		if p.ns+"/"+p.name == key {
			return p.ip
		}
	}
	return ""
}

// listTable is `nft -a list table ip kube-proxy` in the node.
func (kp *KubeProxy) listTable(t *testing.T) string {
	t.Helper()
	out, err := kp.Exec("nft", "-a", "list", "table", "ip", "kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startTraceCluster starts the control plane with the tracer's RBAC, the
// Node, pods, Services and EndpointSlices, then kube-proxy in mode (so its
// first sync writes them all), the pod namespaces and their servers, the
// uplink, the metadata index, and reads the identities of the rules to
// expect from the node's own listing: `nft -a list table ip kube-proxy`,
// iptables-save, or in ipvs mode `ipvsadm -Ln` and iptables-save.
func startTraceCluster(t *testing.T, mode Mode) *traceCluster {
	t.Helper()
	cp := cphelper.StartWith(t, cphelper.Options{ServiceCIDR: FixtureServiceCIDR})
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	// Generous: under TCG on a loaded machine kube-proxy's first ipvs-mode
	// sync alone took over a minute (its iptables-restore 5 s).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := cphelper.ApplyFile(ctx, admin, rbacManifest(t)); err != nil {
		t.Fatalf("apply deploy/rbac.yaml: %v", err)
	}
	if err := EnsureNode(ctx, admin, DefaultNodeName, DefaultNodeIP, DefaultPodCIDR); err != nil {
		t.Fatal(err)
	}
	if err := createTraceObjects(ctx, admin); err != nil {
		t.Fatal(err)
	}
	kp := Start(t, cp, Options{Mode: mode})
	node := netlab.Namespace{Name: kp.Netns}

	// The pods' namespaces, linked to the node.
	lab, err := netlab.New(fmt.Sprintf("trkpe2e%d", os.Getpid()%10000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("remove pod namespaces: %v", err)
		}
	})
	pods := map[string]netlab.Namespace{}
	for _, p := range e2ePods {
		ns, err := lab.Namespace(p.netns)
		if err != nil {
			t.Fatal(err)
		}
		pods[p.netns] = ns
		podLink(t, ns, node, p.veth, p.ip)
	}
	// The uplink: the harness's kp1 (the peer of the node's kp0) moves to
	// a namespace of its own with the gateway's address. Its forwarding is
	// switched off explicitly (a new namespace takes the host's IPv4
	// setting), so it drops what the node routes to it, without an ICMP
	// error (see uplinkGW).
	uplink, err := lab.Namespace("uplink")
	if err != nil {
		t.Fatal(err)
	}
	if err := uplink.Sysctl("net.ipv4.ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	nsRun(t, node, "ip", "link", "set", "kp1", "netns", uplink.Name)
	nsRun(t, uplink, "ip", "addr", "add", uplinkGW+"/24", "dev", "kp1")
	nsRun(t, uplink, "ip", "link", "set", "kp1", "up")
	if err := node.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	nsRun(t, node, "ip", "route", "add", "default", "via", uplinkGW, "dev", "kp0")
	for _, p := range e2ePods[1:] {
		who := p.ns + "/" + p.name
		serveTCP(t, pods[p.netns], net.JoinHostPort(p.ip, strconv.Itoa(echoTarget)), who)
		serveUDP(t, pods[p.netns], net.JoinHostPort(p.ip, strconv.Itoa(dnsTarget)), who)
	}

	// kube-proxy's rules for all of it.
	if _, err := kp.WaitSynced(ctx, traceSynced(mode)...); err != nil {
		t.Fatal(err)
	}

	// The tracer's metadata, as `tracer trace --kubeconfig` opens it:
	// internal/meta's informers with the tracer's ServiceAccount token.
	mctx, mcancel := context.WithCancel(context.Background())
	t.Cleanup(mcancel)
	idx, err := meta.NewFromKubeconfig(mctx, cp.KubeconfigFor(cp.TracerToken()), DefaultNodeName)
	if err != nil {
		t.Fatalf("metadata index: %v", err)
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		_, found := idx.PodByIP(netip.MustParseAddr(e2eEchoB), time.Now())
		_, svc, hasSvc := idx.ServiceByAddr(netip.MustParseAddr(emptyIP), echoPort, "tcp", false)
		if idx.Synced() && found && hasSvc && svc.Name == "http" {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("metadata index not synced after 30 s (synced %v, warnings %q)", idx.Synced(), idx.Warnings())
		}
	}

	c := &traceCluster{kp: kp, node: node, client: pods["client"], uplink: uplink,
		md: livetest.Config{NodeName: DefaultNodeName, Metadata: enrich.NewIndexMetadata(idx), MetadataSnapshot: idx.Snapshot, MetadataWarnings: idx.Warnings}}
	switch mode {
	case IPTables:
		c.readIPTablesRules(t)
	case IPVS:
		c.readIPVSState(t)
	default:
		c.readRules(t)
	}
	return c
}

// traceSynced are what the node's ruleset (Ruleset: nft list ruleset or
// iptables-save) shows once kube-proxy has written all of the test's
// Services: both endpoints of both of web/echo's ports, its NodePort and
// web/empty's rejection.
func traceSynced(mode Mode) []string {
	if mode == IPVS {
		return ipvsTraceSynced()
	}
	if mode == IPTables {
		return []string{
			fmt.Sprintf("-j DNAT --to-destination %s:%d", e2eEchoA, echoTarget),
			fmt.Sprintf("-j DNAT --to-destination %s:%d", e2eEchoB, echoTarget),
			fmt.Sprintf("-j DNAT --to-destination %s:%d", e2eEchoA, dnsTarget),
			fmt.Sprintf("-j DNAT --to-destination %s:%d", e2eEchoB, dnsTarget),
			fmt.Sprintf("--dport %d -j KUBE-EXT-", echoNodePort),
			`"web/empty:http has no endpoints"`,
		}
	}
	return []string{
		fmt.Sprintf("%s . %d, 1 : %s . %d }", e2eEchoA, echoTarget, e2eEchoB, echoTarget),
		fmt.Sprintf("%s . %d, 1 : %s . %d }", e2eEchoA, dnsTarget, e2eEchoB, dnsTarget),
		fmt.Sprintf("tcp . %d : goto external-", echoNodePort),
		`comment "web/empty:http" : goto reject-chain`,
		"ip daddr 172.30.0.0/16 drop",
	}
}

// readRules reads the rules the checks expect from the node's own
// `nft -a list table ip kube-proxy`: names, handles and texts are
// kube-proxy's, never written down here.
func (c *traceCluster) readRules(t *testing.T) {
	t.Helper()
	c.listing = c.kp.listTable(t)
	rules, err := listedRules(c.listing)
	if err != nil {
		t.Fatal(err)
	}
	c.rules = rules
	chainOf := func(prefix, suffix string) string {
		var names []string
		for _, r := range rules {
			if strings.HasPrefix(r.chain, prefix) && strings.HasSuffix(r.chain, suffix) && !slices.Contains(names, r.chain) {
				names = append(names, r.chain)
			}
		}
		if len(names) != 1 {
			t.Fatalf("%d chains %s*%s in ip kube-proxy, want one: %v\n%s", len(names), prefix, suffix, names, c.listing)
		}
		return names[0]
	}
	is := func(name string) func(string) bool { return func(ch string) bool { return ch == name } }
	c.echoTCPChain = chainOf("service-", "-web/echo/tcp/http")
	c.echoUDPChain = chainOf("service-", "-web/echo/udp/dns")
	c.echoExternalChain = chainOf("external-", "-web/echo/tcp/http")
	c.echoDNAT = findRule(t, rules, c.listing, is(c.echoTCPChain), "meta l4proto tcp dnat ip to numgen random mod 2 map")
	c.dnsDNAT = findRule(t, rules, c.listing, is(c.echoUDPChain), "meta l4proto udp dnat ip to numgen random mod 2 map")
	c.clusterIPsReject = findRule(t, rules, c.listing, is("cluster-ips-check"), "ip daddr @cluster-ips reject")
	c.rejectChain = findRule(t, rules, c.listing, is("reject-chain"), "reject")
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
// addresses in status, web/echo and web/empty, and web/echo's EndpointSlice.
func createTraceObjects(ctx context.Context, c kubernetes.Interface) error {
	for _, ns := range []string{"shop", "web"} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	created := map[string]*corev1.Pod{}
	for _, p := range e2ePods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{NodeName: DefaultNodeName, Containers: []corev1.Container{{
				Name: "c", Image: "registry.invalid/app:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: echoTarget, Protocol: corev1.ProtocolTCP}},
			}}},
		}
		pod, err := c.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create pod %s/%s: %w", p.ns, p.name, err)
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.HostIP, pod.Status.HostIPs = DefaultNodeIP, []corev1.HostIP{{IP: DefaultNodeIP}}
		pod.Status.PodIP, pod.Status.PodIPs = p.ip, []corev1.PodIP{{IP: p.ip}}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", Image: "registry.invalid/app:1", Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
		if pod, err = c.CoreV1().Pods(p.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("write pod %s/%s status: %w", p.ns, p.name, err)
		}
		created[p.name] = pod
	}
	echo := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "echo"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: echoIP, ClusterIPs: []string{echoIP},
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
			Type: corev1.ServiceTypeClusterIP, ClusterIP: emptyIP, ClusterIPs: []string{emptyIP},
			Selector: map[string]string{"app": "empty"},
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: echoPort, TargetPort: intstr.FromInt32(echoTarget)}},
		},
	}
	for _, svc := range []*corev1.Service{echo, empty} {
		if _, err := c.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "echo-x1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "echo", discoveryv1.LabelManagedBy: "tracer-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](echoTarget)},
			{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](dnsTarget)},
		},
	}
	for _, name := range []string{"echo-a", "echo-b"} {
		p := created[name]
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(DefaultNodeName),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		})
	}
	if _, err := c.DiscoveryV1().EndpointSlices("web").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpointslice web/%s: %w", slice.Name, err)
	}
	return nil
}

// traceConfig is the cluster's metadata as `tracer trace --kubeconfig`
// passes it, on the given tier.
func (c *traceCluster) traceConfig(only []event.Via) livetest.Config {
	cfg := c.md
	cfg.Only = only
	return cfg
}

// serviceAttempts connects to the ClusterIP and the NodePort until both
// endpoints have answered, so the check covers the kernel's choice itself,
// and asks the ClusterIP's dns port three times over UDP. attempt is the
// mode's own connection and truth check.
func (c *traceCluster) serviceAttempts(t *testing.T, attempt func(t *testing.T, what, proto, dst string, target int) (attemptResult, bool)) map[string][]attemptResult {
	clusterIP := net.JoinHostPort(echoIP, strconv.Itoa(echoPort))
	nodePort := net.JoinHostPort(DefaultNodeIP, strconv.Itoa(echoNodePort))
	ok := map[string][]attemptResult{}
	for _, a := range []struct{ key, dst string }{{"clusterip", clusterIP}, {"nodeport", nodePort}} {
		ok[a.key] = untilBothAnswered(t, a.key, func() (attemptResult, bool) {
			return attempt(t, a.key, "tcp", a.dst, echoTarget)
		})
	}
	dnsAddr := net.JoinHostPort(echoIP, strconv.Itoa(dnsPort))
	for i := 0; i < 3; i++ {
		if a, good := attempt(t, "udp", "udp", dnsAddr, dnsTarget); good {
			ok["udp"] = append(ok["udp"], a)
		}
	}
	return ok
}
