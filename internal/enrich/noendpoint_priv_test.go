package enrich_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/live/livetest"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// The node of this test: kube-proxy's own filter rules (the rules
// package's fixture, from kubernetes v1.37.2's proxier_test.go) in a
// throwaway namespace "n" routing between a pod-like client "c" and an
// uplink "u".
//
//	c 10.0.0.2 --- 10.0.0.1 n 192.168.0.2 --- 192.168.0.1 u (default route)
const (
	clusterIP  = "172.30.0.46:80" // ns6/svc6:p80, no endpoints: REJECT
	nodePort   = "192.168.0.2:3001"
	noEPs      = "ns6/svc6:p80 has no endpoints"
	noLocalEPs = "ns2/svc2:p80 has no local endpoints"
)

type kubeProxyNode struct {
	c, n, u netlab.Namespace
}

func newKubeProxyNode(t *testing.T) *kubeProxyNode {
	t.Helper()
	lab, nss := newLab(t, fmt.Sprintf("trnoep%d", os.Getpid()%10000), "c", "n", "u")
	k := &kubeProxyNode{c: nss["c"], n: nss["n"], u: nss["u"]}
	must(t, lab.Link(k.c, "eth0", clientAddr+"/24", k.n, "cni0", "10.0.0.1/24"))
	must(t, lab.Link(k.n, "eth0", nodeAddr+"/24", k.u, "eth0", "192.168.0.1/24"))
	run(t, k.c, "ip", "route", "add", "default", "via", "10.0.0.1")
	run(t, k.n, "ip", "route", "add", "default", "via", "192.168.0.1")
	must(t, k.n.Sysctl("net.ipv4.ip_forward", "1"))
	fixture, err := filepath.Abs("../rules/testdata/kube-proxy-iptables-filter.save")
	if err != nil {
		t.Fatal(err)
	}
	run(t, k.n, "iptables-restore", fixture)
	return k
}

// kubeProxyMetadata are the Services of the fixture's rules this test
// connects to, and the client pod.
func kubeProxyMetadata() enrich.Metadata {
	svcs := []trace.Service{
		{Namespace: "ns6", Name: "svc6", Type: "ClusterIP", ClusterIPs: []string{"172.30.0.46"},
			Ports: []trace.ServicePort{{Name: "p80", Proto: "TCP", Port: 80}}},
		{Namespace: "ns2", Name: "svc2", Type: "LoadBalancer", ClusterIPs: []string{"172.30.0.42"}, LBIPs: []string{"1.2.3.4"},
			ETP: "Local", Ports: []trace.ServicePort{{Name: "p80", Proto: "TCP", Port: 80, NodePort: 3001}}},
	}
	return enrich.NewSnapshotMetadata([]trace.Pod{{Namespace: "ns1", Name: "client", IPs: []string{clientAddr}}}, svcs)
}

// savedRule is the one rule of ns's filter table with that comment and
// match, as iptables-save prints it, and its packet counter.
func savedRule(t *testing.T, ns netlab.Namespace, comment, match string) (string, uint64) {
	t.Helper()
	var found []string
	for _, l := range strings.Split(run(t, ns, "iptables-save", "-c", "-t", "filter"), "\n") {
		if strings.Contains(l, `--comment "`+comment+`"`) && strings.Contains(l, match) {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("iptables-save shows %d rules commented %q with %q: %q", len(found), comment, match, found)
	}
	counters, text, _ := strings.Cut(found[0], " ")
	pkts, _, _ := strings.Cut(strings.Trim(counters, "[]"), ":")
	n, err := strconv.ParseUint(pkts, 10, 64)
	if err != nil {
		t.Fatalf("counters of %q: %v", found[0], err)
	}
	return text, n
}

// icmpDestUnreachs is the namespace's count of ICMP destination
// unreachable errors received (/proc/net/snmp, Icmp InDestUnreachs).
func icmpDestUnreachs(t *testing.T, ns netlab.Namespace) uint64 {
	t.Helper()
	snmp, err := ns.SNMP()
	if err != nil {
		t.Fatal(err)
	}
	n, ok := snmp["Icmp:InDestUnreachs"]
	if !ok {
		t.Fatalf("no Icmp InDestUnreachs in %s's /proc/net/snmp", ns.Name)
	}
	return uint64(n)
}

// attempt is one connection and what the node and the client showed of
// it, read with their own tools.
type attempt struct {
	name       string
	from       func(k *kubeProxyNode) netlab.Namespace
	fromAddr   string
	dst        string
	comment    string   // the kube-proxy rule that must decide: its comment
	match      string   // and a match of it
	path       []string // the chain path the kernel took to it
	refused    bool     // REJECT: connection refused; otherwise DROP: timeout
	service    string
	needsDrops bool // the flow rests on the drop event's reason alone
}

var attempts = []attempt{
	{"pod to ClusterIP (FORWARD)", func(k *kubeProxyNode) netlab.Namespace { return k.c }, clientAddr, clusterIP,
		noEPs, "-d 172.30.0.46/32", []string{"FORWARD", "KUBE-SERVICES"}, true, "ns6/svc6", false},
	{"node to ClusterIP (OUTPUT)", func(k *kubeProxyNode) netlab.Namespace { return k.n }, nodeAddr, clusterIP,
		noEPs, "-d 172.30.0.46/32", []string{"OUTPUT", "KUBE-SERVICES"}, true, "ns6/svc6", false},
	{"pod to NodePort of an ETP=Local Service (INPUT)", func(k *kubeProxyNode) netlab.Namespace { return k.c }, clientAddr, nodePort,
		noLocalEPs, "--dport 3001", []string{"INPUT", "KUBE-EXTERNAL-SERVICES"}, false, "ns2/svc2", true},
}

// TestPrivServiceNoEndpoint makes real TCP connections to the Services
// kube-proxy's rules say have no (local) endpoint, checks with the node's
// own tools that the rule refused them (the client's ECONNREFUSED, which
// Linux gives TCP only for an ICMP port unreachable, and the ICMP
// destination unreachable its /proc/net/snmp counted; or its timeout; the
// rule's packet counter in iptables-save -c), and that the live tracer's flow names that
// rule as iptables-save prints it, the chain path, the Service, and the
// verdict service-no-endpoint. The netfilter tier, which sees ICMP errors
// as they leave the node, is run too where the kernel has it.
func TestPrivServiceNoEndpoint(t *testing.T) {
	requirePrivileged(t, "iptables-restore", "iptables-save")
	for _, tier := range livetest.Tiers {
		t.Run(tier.Name, func(t *testing.T) {
			tier.SkipWithoutLinks(t)
			k := newKubeProxyNode(t)
			tr := livetest.Start(t, k.n, livetest.Config{Only: tier.Only, Metadata: kubeProxyMetadata()})
			if v := tr.Via(event.HookICMPSend); tier.Only != nil && v != event.ViaNetfilter {
				t.Skipf("icmp_send cannot attach via the netfilter tier on this kernel (via %s): it needs 6.4+", v)
			}
			srcs := map[string]string{} // attempt name -> the client's endpoint
			for _, a := range attempts {
				if a.needsDrops && (tr.Via(event.HookKfreeSkb) == event.ViaNone || !tr.P.Plan().DropReasons()) {
					t.Logf("%s: not tried, kfree_skb gives no drop reason here (tier %s)", a.name, tier.Name)
					continue
				}
				srcs[a.name] = connect(t, k, a)
			}
			tr.Stop(t)
			for _, a := range attempts {
				if src, ok := srcs[a.name]; ok {
					checkFlow(t, k, tr, a, src)
				}
			}
		})
	}
}

// connect makes the attempt, checks the node refused it the way the rule
// says, and returns the client's endpoint.
func connect(t *testing.T, k *kubeProxyNode, a attempt) string {
	t.Helper()
	_, before := savedRule(t, k.n, a.comment, a.match)
	from := a.from(k)
	unreachBefore := icmpDestUnreachs(t, from)
	local, err := dial(from, a.fromAddr, a.dst, 1500*time.Millisecond)
	switch {
	case a.refused && !errors.Is(err, syscall.ECONNREFUSED):
		t.Errorf("%s: dial %s: %v, want connection refused", a.name, a.dst, err)
	case !a.refused && !isTimeout(err):
		t.Errorf("%s: dial %s: %v, want a timeout (the SYN dropped)", a.name, a.dst, err)
	}
	if _, after := savedRule(t, k.n, a.comment, a.match); after <= before {
		t.Errorf("%s: the rule commented %q counted %d packets before and %d after", a.name, a.comment, before, after)
	}
	if unreach := icmpDestUnreachs(t, from) - unreachBefore; a.refused != (unreach > 0) {
		t.Errorf("%s: the client received %d ICMP destination unreachable errors, refused %v", a.name, unreach, a.refused)
	}
	return local
}

func checkFlow(t *testing.T, k *kubeProxyNode, tr *livetest.Tracing, a attempt, src string) {
	t.Helper()
	f := tr.FlowOf(t, "", src, a.dst)
	if f == nil {
		return
	}
	t.Logf("%s: events %s; %s", a.name, livetest.EventList(f.Events), f.Explanation)
	text, _ := savedRule(t, k.n, a.comment, a.match)
	if f.Verdict != trace.VerdictServiceNoEndpoint {
		t.Errorf("%s: verdict %s, want %s: %s", a.name, f.Verdict, trace.VerdictServiceNoEndpoint, f.Explanation)
	}
	if r := f.Rule; r == nil || r.Table != "filter" || r.Text != text || !slices.Equal(r.Path, a.path) || r.Uncertain != "" {
		t.Errorf("%s: rule %+v, want %q via %v", a.name, f.Rule, text, a.path)
	}
	if sv := f.Service; sv == nil || sv.Namespace+"/"+sv.Name != a.service {
		t.Errorf("%s: service %+v, want %s", a.name, f.Service, a.service)
	}
	for _, fact := range []string{"Service " + a.service, a.comment} {
		if !strings.Contains(f.Explanation, fact) {
			t.Errorf("%s: explanation lacks %q: %s", a.name, fact, f.Explanation)
		}
	}
	kind := trace.KindDrop
	if a.refused {
		kind = trace.KindReject
	}
	if !slices.ContainsFunc(f.Events, func(e trace.Event) bool { return e.Kind == kind }) {
		t.Errorf("%s: no %s event in %+v", a.name, kind, f.Events)
	}
}
