package kubeproxy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tracer-dev/tracer/internal/lab"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/rules"
)

// The lab's kube-proxy stand-ins (internal/lab: kubeproxy.go for IPVS
// mode and its no-IPVS substitute, kubeproxynft.go for nftables mode) are
// held against the real kube-proxy v1.37.2 given the same Services: the
// fixture's, read back from the API server, written by the stand-in into
// a namespace of its own (trks-<pid>-node) and by kube-proxy into the
// harness's. Both sides are read by the same commands and normalised by
// the same code (model.go, modelbuild.go) into what the tracer reads;
// every difference fails the test by name unless it is listed, exactly,
// with its reason.

// standInServices reads every Service and EndpointSlice from the API
// server and returns them as kube-proxy names them (for the chain hashes)
// and as the lab's stand-in takes them. An endpoint is Local when it runs
// on node; only ready endpoints count, as for kube-proxy.
func standInServices(ctx context.Context, c kubernetes.Interface, node string) ([]ServicePortID, []lab.StandInService, error) {
	svcs, err := c.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list services: %w", err)
	}
	slices, err := c.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list endpointslices: %w", err)
	}
	var ids []ServicePortID
	var out []lab.StandInService
	for _, svc := range svcs.Items {
		s, portIDs := standInService(&svc, slicesOf(slices.Items, &svc), node)
		ids = append(ids, portIDs...)
		out = append(out, s)
	}
	return ids, out, nil
}

func slicesOf(all []discoveryv1.EndpointSlice, svc *corev1.Service) []discoveryv1.EndpointSlice {
	var out []discoveryv1.EndpointSlice
	for _, sl := range all {
		if sl.Namespace == svc.Namespace && sl.Labels[discoveryv1.LabelServiceName] == svc.Name {
			out = append(out, sl)
		}
	}
	return out
}

func standInService(svc *corev1.Service, eps []discoveryv1.EndpointSlice, node string) (lab.StandInService, []ServicePortID) {
	s := lab.StandInService{
		Namespace: svc.Namespace, Name: svc.Name, Type: string(svc.Spec.Type), ClusterIP: svc.Spec.ClusterIP,
		ExternalLocal:       svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal,
		HealthCheckNodePort: int(svc.Spec.HealthCheckNodePort),
	}
	if in := svc.Status.LoadBalancer.Ingress; len(in) > 0 {
		s.LoadBalancerIP = in[0].IP
	}
	if ips := svc.Spec.ClusterIPs; len(ips) > 1 {
		s.ClusterIP6 = ips[1]
	}
	var ids []ServicePortID
	for _, p := range svc.Spec.Ports {
		proto := strings.ToLower(string(p.Protocol))
		id := ServicePortID{Namespace: svc.Namespace, Name: svc.Name, Port: p.Name, Proto: proto}
		target := int(p.TargetPort.IntVal)
		for _, sl := range eps {
			if sl.AddressType == discoveryv1.AddressTypeIPv6 {
				continue // the IPv4 endpoints' twins, below
			}
			for _, sp := range sl.Ports {
				if sp.Name != nil && *sp.Name == p.Name && sp.Port != nil {
					target = int(*sp.Port)
				}
			}
			for _, ep := range sl.Endpoints {
				if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
					continue
				}
				for _, a := range ep.Addresses {
					id.Endpoints = append(id.Endpoints, fmt.Sprintf("%s:%d", a, target))
					if len(ids) == 0 { // one endpoint list per Service; ports share it
						s.Endpoints = append(s.Endpoints, lab.StandInEndpoint{IP: a, Local: ep.NodeName != nil && *ep.NodeName == node})
					}
				}
			}
		}
		s.Ports = append(s.Ports, lab.StandInPort{Name: p.Name, Proto: proto, Port: int(p.Port), TargetPort: target, NodePort: int(p.NodePort)})
		ids = append(ids, id)
	}
	addIPv6Endpoints(&s, eps)
	return s, ids
}

// addIPv6Endpoints gives each endpoint of a dual-stack Service the address
// its pod has in the IPv6 EndpointSlices, matched by the pod they name.
func addIPv6Endpoints(s *lab.StandInService, eps []discoveryv1.EndpointSlice) {
	v6 := map[string]string{}
	for _, sl := range eps {
		for _, ep := range sl.Endpoints {
			if sl.AddressType == discoveryv1.AddressTypeIPv6 && ep.TargetRef != nil && len(ep.Addresses) > 0 {
				v6[ep.TargetRef.Namespace+"/"+ep.TargetRef.Name] = ep.Addresses[0]
			}
		}
	}
	for _, sl := range eps {
		for _, ep := range sl.Endpoints {
			if sl.AddressType != discoveryv1.AddressTypeIPv4 || ep.TargetRef == nil || len(ep.Addresses) == 0 {
				continue
			}
			for i := range s.Endpoints {
				if s.Endpoints[i].IP == ep.Addresses[0] {
					s.Endpoints[i].IP6 = v6[ep.TargetRef.Namespace+"/"+ep.TargetRef.Name]
				}
			}
		}
	}
}

// createLoadBalancer adds what the fixture lacks and the stand-ins model:
// ns10/lb10, type LoadBalancer with ingress IP 203.0.113.10 (written to
// its status, as a cloud controller would), ClusterIP 172.30.0.60,
// externalTrafficPolicy Local, tcp 80 "http" -> 8080 (NodePort 30080) and
// udp 53 "dns" -> 5353 (NodePort 30053), with one endpoint on this node
// (10.180.0.10) and one on OtherNode (10.180.1.10). It returns strings
// the ruleset of mode holds once kube-proxy has written it.
func createLoadBalancer(ctx context.Context, c kubernetes.Interface, mode Mode) ([]string, error) {
	const ns, name = "ns10", "lb10"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", ns, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "172.30.0.60", ClusterIPs: []string{"172.30.0.60"},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353), NodePort: 30053},
			},
		},
	}
	created, err := c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create service %s/%s: %w", ns, name, err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
	if _, err := c.CoreV1().Services(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("write load balancer ingress of %s/%s: %w", ns, name, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "tracer-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)},
			{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](5353)},
		},
	}
	for _, ep := range [][2]string{{"10.180.0.10", DefaultNodeName}, {"10.180.1.10", OtherNode}} {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ep[0]},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(ep[1])})
	}
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create endpointslice %s/%s: %w", ns, slice.Name, err)
	}
	switch mode {
	case NFTables:
		return []string{"203.0.113.10 . tcp . 80 : goto external-", "udp . 30053 : goto external-", "dnat to 10.180.0.10:5353"}, nil
	case IPTables:
		return []string{`"ns10/lb10:http loadbalancer IP"`, `"ns10/lb10:dns loadbalancer IP"`, "10.180.0.10:5353"}, nil
	}
	return nil, nil
}

// standInNetns is a fresh namespace for the stand-in, removed when the
// test ends.
func standInNetns(t *testing.T) netlab.Namespace {
	t.Helper()
	l, err := netlab.New(fmt.Sprintf("trks-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("remove stand-in namespace: %v", err)
		}
	})
	ns, err := l.Namespace("node")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func standInNode() lab.StandInNode {
	return lab.StandInNode{Name: DefaultNodeName, IP: DefaultNodeIP, ClusterCIDR: DefaultClusterCIDR, ServiceCIDR: FixtureServiceCIDR}
}

// checkModels fails t naming every difference between real and got that
// known does not list, and every listed one that did not occur.
func checkModels(t *testing.T, real, got *Model, known []KnownDifference) {
	t.Helper()
	diffs := Diff(real, got)
	unexplained, unused := Unexplained(diffs, known)
	t.Logf("model: kube-proxy %d facts and %d chains, stand-in %d facts and %d chains; %d differences, %d of them listed as intended",
		len(real.Facts), len(real.Chains), len(got.Facts), len(got.Chains), len(diffs), len(diffs)-len(unexplained))
	for _, d := range unexplained {
		t.Errorf("stand-in differs from kube-proxy v1.37.2: %s", d)
	}
	for _, k := range unused {
		t.Errorf("listed difference did not occur (correct the list): %s (reason given: %s)", k.Difference, k.Reason)
	}
}

func execIn(t *testing.T, ns netlab.Namespace, args ...string) string {
	t.Helper()
	out, err := ns.Run(args[0], args[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func kpExec(t *testing.T, kp *KubeProxy, args ...string) string {
	t.Helper()
	out, err := kp.Exec(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// skipInVM skips a comparison that needs nothing of the guest's kernel
// in a tests/vm guest: both sides are userspace programs writing rules
// (and read by the same commands) on the same kernel, which the build
// host runs already, and each control plane takes 20-90 s to start under
// TCG. The guest's time goes to the IPVS comparison, which only it runs.
func skipInVM(t *testing.T) {
	t.Helper()
	if os.Getenv("TRACER_VM") != "" {
		t.Skip("compares userspace output that does not depend on the kernel, and the build host runs it: not repeated under TCG")
	}
}

// TestStandInNFTablesMatchesKubeProxy: the lab's nftables-mode stand-in
// against kube-proxy v1.37.2 --proxy-mode=nftables, both tables (ip and
// ip6 kube-proxy) whole: base chains' hooks and priorities, every
// chain's rules in order, chain names with their hashes, sets and maps
// with their types, elements with their comments and verdicts. No
// difference is intended.
func TestStandInNFTablesMatchesKubeProxy(t *testing.T) {
	skipShort(t)
	skipInVM(t)
	SkipUnlessPrivileged(t)
	checkHostUnchanged(t, NFTables)
	kp, admin := startFixture(t, NFTables)
	ctx, cancel := context.WithTimeout(context.Background(), SyncTimeout())
	defer cancel()
	lb, err := createLoadBalancer(ctx, admin, NFTables)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kp.WaitSynced(ctx, append(FixtureSynced, lb...)...); err != nil {
		t.Fatal(err)
	}
	real, err := NFTablesModel([]byte(kpExec(t, kp, "nft", "-j", "list", "ruleset")), []byte(kpExec(t, kp, "nft", "-a", "list", "ruleset")))
	if err != nil {
		t.Fatal(err)
	}
	_, svcs, err := standInServices(ctx, admin, DefaultNodeName)
	if err != nil {
		t.Fatal(err)
	}
	ns := standInNetns(t)
	t0 := time.Now()
	if err := lab.WriteKubeProxyStandIn(ns, lab.StandInNFTables, standInNode(), svcs); err != nil {
		t.Fatal(err)
	}
	t.Logf("stand-in wrote %d Services in %s", len(svcs), time.Since(t0).Round(time.Millisecond))
	got, err := NFTablesModel([]byte(execIn(t, ns, "nft", "-j", "list", "ruleset")), []byte(execIn(t, ns, "nft", "-a", "list", "ruleset")))
	if err != nil {
		t.Fatal(err)
	}
	checkModels(t, real, got, nil)
}

// TestStandInNFTablesMatchesKubeProxyDualStack is the same comparison on
// the dual-stack cluster of TestPrivTraceKubeProxyNFTDualStack: kube-proxy
// v1.37.2's IPv4 and IPv6 proxiers against the lab's, both tables whole,
// with RequireDualStack Services whose EndpointSlices have both address
// types. No difference is intended.
func TestStandInNFTablesMatchesKubeProxyDualStack(t *testing.T) {
	skipShort(t)
	skipInVM(t)
	SkipUnlessPrivileged(t)
	checkHostUnchanged(t, NFTables)
	families := []traceFamily{ipv4, ipv6}
	cp, admin := startTraceControlPlane(t, families)
	ctx, cancel := context.WithTimeout(context.Background(), SyncTimeout())
	defer cancel()
	opts := Options{Mode: NFTables, DualStack: true}
	if err := EnsureNodeOf(ctx, admin, opts); err != nil {
		t.Fatal(err)
	}
	if err := createTraceObjects(ctx, admin, families); err != nil {
		t.Fatal(err)
	}
	kp := Start(t, cp, opts)
	if _, err := kp.WaitSynced(ctx, traceSynced(NFTables, families)...); err != nil {
		t.Fatal(err)
	}
	real, err := NFTablesModel([]byte(kpExec(t, kp, "nft", "-j", "list", "ruleset")), []byte(kpExec(t, kp, "nft", "-a", "list", "ruleset")))
	if err != nil {
		t.Fatal(err)
	}
	_, svcs, err := standInServices(ctx, admin, DefaultNodeName)
	if err != nil {
		t.Fatal(err)
	}
	sn := lab.StandInNode{Name: DefaultNodeName, IP: DefaultNodeIP, ClusterCIDR: DefaultClusterCIDR, ServiceCIDR: ipv4.serviceCIDR,
		IP6: DefaultNodeIP6, ClusterCIDR6: DefaultClusterCIDR6, ServiceCIDR6: ipv6.serviceCIDR}
	ns := standInNetns(t)
	if err := lab.WriteKubeProxyStandIn(ns, lab.StandInNFTables, sn, svcs); err != nil {
		t.Fatal(err)
	}
	got, err := NFTablesModel([]byte(execIn(t, ns, "nft", "-j", "list", "ruleset")), []byte(execIn(t, ns, "nft", "-a", "list", "ruleset")))
	if err != nil {
		t.Fatal(err)
	}
	checkModels(t, real, got, nil)
}

// serviceChain says whether a chain is one of iptables mode's per-Service
// or per-endpoint chains.
func serviceChain(chain string) bool {
	for _, p := range []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"} {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// substituteView is the part of the state the stand-in's no-IPVS
// substitute claims to share with iptables mode: the per-Service and
// per-endpoint chains and the jumps into them from nat KUBE-SERVICES and
// KUBE-NODEPORTS.
var substituteView = IPTablesView{
	Chain: func(table, chain string) bool { return table == "nat" && serviceChain(chain) },
	Jump: func(r *rules.Rule) bool {
		return r.Table == "nat" && (r.Chain == "KUBE-SERVICES" || r.Chain == "KUBE-NODEPORTS") && serviceChain(r.Target.Chain)
	},
}

// TestStandInSubstituteMatchesIPTablesMode: without IPVS the lab's
// IPVS-mode stand-in stands in for the virtual servers with iptables
// mode's KUBE-SVC/KUBE-SEP chains; that part is held against kube-proxy
// v1.37.2 --proxy-mode=iptables (substituteView). The rest of the
// stand-in is IPVS mode's, not iptables mode's, and is not compared here.
// The stand-in refuses a Service without endpoints on a kernel without
// IPVS (no virtual server without real servers to stand in for), so
// ns6/svc6 is not given to it; iptables mode writes no chain of this view
// for it either (its REJECT is in filter KUBE-SERVICES).
func TestStandInSubstituteMatchesIPTablesMode(t *testing.T) {
	skipShort(t)
	skipInVM(t)
	SkipUnlessPrivileged(t)
	if _, err := exec.LookPath("ipset"); err != nil {
		t.Skipf("the IPVS-mode stand-in writes ipsets: needs the ipset command: %v", err)
	}
	checkHostUnchanged(t, IPTables)
	kp, admin := startFixture(t, IPTables)
	ctx, cancel := context.WithTimeout(context.Background(), SyncTimeout())
	defer cancel()
	lb, err := createLoadBalancer(ctx, admin, IPTables)
	if err != nil {
		t.Fatal(err)
	}
	out, err := kp.WaitSynced(ctx, append(FixtureSyncedIPTables, lb...)...)
	if err != nil {
		t.Fatal(err)
	}
	ids, svcs, err := standInServices(ctx, admin, DefaultNodeName)
	if err != nil {
		t.Fatal(err)
	}
	idents := NewIdents(ids)
	real, err := IPTablesModel(out, idents, substituteView)
	if err != nil {
		t.Fatal(err)
	}
	svcs = slices.DeleteFunc(svcs, func(s lab.StandInService) bool { return len(s.Endpoints) == 0 })
	ns := standInNetns(t)
	t0 := time.Now()
	if err := lab.WriteKubeProxyStandIn(ns, lab.StandInIPVS, standInNode(), svcs); err != nil {
		t.Fatal(err)
	}
	t.Logf("stand-in wrote %d Services in %s", len(svcs), time.Since(t0).Round(time.Millisecond))
	got, err := IPTablesModel(execIn(t, ns, "iptables-save"), idents, substituteView)
	if err != nil {
		t.Fatal(err)
	}
	checkModels(t, real, got, substituteDifferences)
}

// substituteDifferences are where the substitute follows IPVS mode, which
// it stands in for, rather than iptables mode, whose chain shapes it
// borrows.
var substituteDifferences = slices.Concat(
	clusterMasqDifferences(
		[4]string{"default/kubernetes:https", "172.30.0.1", "tcp", "443"},
		[4]string{"ns4/svc4:p80", "172.30.0.44", "tcp", "80"},
		[4]string{"ns7/svc7:p80", "172.30.0.47", "tcp", "80"},
		[4]string{"ns8/svc8:p53", "172.30.0.48", "udp", "53"},
		[4]string{"ns10/lb10:http", "172.30.0.60", "tcp", "80"},
		[4]string{"ns10/lb10:dns", "172.30.0.60", "udp", "53"},
	),
	// ns7/svc7: Local, no endpoint on this node.
	externalDifferences(externalPort{"ns7/svc7:p80", "tcp", "30007", "", "", "KUBE-SVC", 3}),
	// ns10/lb10: Local, one endpoint on this node.
	externalDifferences(externalPort{"ns10/lb10:http", "tcp", "30080", "203.0.113.10", "80", "KUBE-SVL", 4}),
	externalDifferences(externalPort{"ns10/lb10:dns", "udp", "30053", "203.0.113.10", "53", "KUBE-SVL", 4}),
)

// externalPort is a Service port reached from outside: its NodePort, its
// load balancer IP and port ("" for none), the chain the stand-in sends
// them to, and how many rules iptables mode's KUBE-EXT chain has.
type externalPort struct {
	name, proto, nodePort, lbIP, port, standIn string
	extRules                                   int
}

// externalDifferences: IPVS mode has no KUBE-EXT chain. NodePorts are
// masqueraded by KUBE-NODE-PORT's ipset rules (which the stand-in
// writes) and pod or node traffic to a NodePort or load balancer IP is not
// short-circuited to the cluster policy: the external virtual servers of
// an externalTrafficPolicy=Local Service have the node's own endpoints
// (the stand-in's KUBE-SVL), or, without one, since 1.24 every endpoint
// (KUBE-SVC). And IPVS has no virtual server on 127.0.0.0/8, where
// iptables mode accepts NodePorts (route_localnet).
func externalDifferences(e externalPort) []KnownDifference {
	ext := "KUBE-EXT-{" + e.name + "}"
	to := e.standIn + "-{" + e.name + "}"
	match := func(dst, comment, port string) string {
		return fmt.Sprintf(`%s-p %s -m comment --comment "%s" -m %s --dport %s`, dst, e.proto, comment, e.proto, port)
	}
	const why = "IPVS mode: no KUBE-EXT chain, NodePorts masqueraded by KUBE-NODE-PORT's ipset rules, external virtual servers of an externalTrafficPolicy=Local Service with the local endpoints (or all of them since 1.24 when there is none)"
	out := []KnownDifference{
		{fmt.Sprintf("chain nat %s: only in kube-proxy (%d rules)", ext, e.extRules), why},
		{fmt.Sprintf("iptables chain nat %s: only in kube-proxy: policy -", ext), why},
		{fmt.Sprintf(`iptables rule nat KUBE-NODEPORTS -j %s "%s" #2: only in kube-proxy: %s -j %s`, ext, e.name, match("", e.name, e.nodePort), ext), why},
		{fmt.Sprintf(`iptables rule nat KUBE-NODEPORTS -j %s "%s": only in the stand-in: %s -j %s`, to, e.name, match("", e.name, e.nodePort), to), why},
		{fmt.Sprintf(`iptables rule nat KUBE-NODEPORTS -j %s "%s": only in kube-proxy: %s -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j %s`, ext, e.name, match("-d 127.0.0.0/8 ", e.name, e.nodePort), ext),
			"iptables mode accepts NodePorts on 127.0.0.0/8 (route_localnet); IPVS mode has no virtual server on loopback"},
	}
	if e.lbIP != "" {
		lb := e.name + " loadbalancer IP"
		out = append(out,
			KnownDifference{fmt.Sprintf(`iptables rule nat KUBE-SERVICES -j %s "%s": only in kube-proxy: %s -j %s`, ext, lb, match("-d "+e.lbIP+"/32 ", lb, e.port), ext), why},
			KnownDifference{fmt.Sprintf(`iptables rule nat KUBE-SERVICES -j %s "%s": only in the stand-in: %s -j %s`, to, lb, match("-d "+e.lbIP+"/32 ", lb, e.port), to), why})
	}
	return out
}

// clusterMasqDifferences: iptables mode's KUBE-SVC chains start by marking
// ClusterIP traffic from outside the cluster CIDR for masquerade; IPVS
// mode does that once for every ClusterIP, in KUBE-SERVICES' rule on the
// KUBE-CLUSTER-IP ipset, which the stand-in writes. Each is (port name,
// ClusterIP, protocol, port).
func clusterMasqDifferences(svcs ...[4]string) []KnownDifference {
	var out []KnownDifference
	for _, s := range svcs {
		out = append(out, KnownDifference{
			Difference: fmt.Sprintf(`chain nat KUBE-SVC-{%s} rule 1: only in kube-proxy: ! -s %s -d %s/32 -p %s -m comment --comment "%s cluster IP" -m %s --dport %s -j KUBE-MARK-MASQ`,
				s[0], DefaultClusterCIDR, s[1], s[2], s[0], s[2], s[3]),
			Reason: "IPVS mode marks ClusterIP traffic from outside the cluster CIDR in KUBE-SERVICES (-m set --match-set KUBE-CLUSTER-IP dst,dst ! -s CIDR -j KUBE-MARK-MASQ), not per Service",
		})
	}
	return out
}

// skipIPVSComparisonElsewhere skips the IPVS comparison in a tests/vm
// guest other than vmKernel's, with the reason: it compares what two
// userspace programs wrote (the IPVS table as ipvsadm prints it
// included), and under TCG it takes about four minutes per guest, while
// the ipvs-mode trace test covers each kernel's IPVS.
func skipIPVSComparisonElsewhere(t *testing.T) {
	t.Helper()
	if k := os.Getenv("TRACER_VM_KERNEL"); k != "" && k != vmKernel {
		t.Skipf("the stand-in's IPVS comparison runs in the %s guest only (about four minutes under TCG, kernel-independent userspace output); this guest runs %s", vmKernel, k)
	}
	if _, err := exec.LookPath("ipvsadm"); err != nil {
		t.Skipf("needs the ipvsadm command: %v", err)
	}
}

// ipvsModel is IPVS mode's whole state in a namespace: every iptables
// chain, every ipset, every IPVS server and kube-ipvs0.
func ipvsModel(t *testing.T, exec func(args ...string) (string, error), id *Idents) *Model {
	t.Helper()
	get := func(args ...string) string {
		out, err := exec(args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	m, err := IPTablesModel(get("iptables-save"), id, IPTablesView{Chain: func(string, string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	IPVSModel(m, get("ipset", "save"), get("ipvsadm", "-Sn"),
		get("ip", "-d", "-o", "link", "show", "kube-ipvs0"), get("ip", "-4", "-o", "addr", "show", "dev", "kube-ipvs0"))
	return m
}

// waitIPVSSynced polls until kube-proxy has a virtual server and a
// KUBE-CLUSTER-IP entry for every ClusterIP port, and its iptables rules:
// within one sync it creates the virtual servers, then fills the ipsets,
// and restores the iptables rules last (KUBE-IPVS-FILTER's among them).
func waitIPVSSynced(ctx context.Context, kp *KubeProxy, svcs []lab.StandInService) error {
	var servers, entries []string
	for _, s := range svcs {
		for _, p := range s.Ports {
			servers = append(servers, fmt.Sprintf("%s:%d", s.ClusterIP, p.Port))
			entries = append(entries, fmt.Sprintf("add KUBE-CLUSTER-IP %s,%s:%d", s.ClusterIP, p.Proto, p.Port))
		}
	}
	var missing []string
	for {
		vs, err1 := kp.Exec("ipvsadm", "-Sn")
		sets, err2 := kp.Exec("ipset", "save")
		save, err3 := kp.Exec("iptables-save")
		missing = append(append(missingOf(vs, servers), missingOf(sets, entries)...), missingOf(save, []string{"-A KUBE-IPVS-FILTER"})...)
		if err1 == nil && err2 == nil && err3 == nil && len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-proxy (ipvs mode) not synced: %w (missing: %q; errors: %v, %v, %v)", ctx.Err(), missing, err1, err2, err3)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probeDummy reports whether ns can have a dummy link (kube-ipvs0's kind).
func probeDummy(ns netlab.Namespace) bool {
	if _, err := ns.Run("ip", "link", "add", "trks-probe", "type", "dummy"); err != nil {
		return false
	}
	_, _ = ns.Run("ip", "link", "del", "trks-probe")
	return true
}

// TestStandInIPVSMatchesIPVSMode: the lab's IPVS-mode stand-in, with real
// IPVS, against kube-proxy v1.37.2 --proxy-mode=ipvs for the fixture
// Services: every iptables chain and rule, every ipset and entry, every
// virtual and real server, kube-ipvs0's kind, state and addresses.
func TestStandInIPVSMatchesIPVSMode(t *testing.T) {
	skipShort(t)
	SkipUnlessPrivileged(t)
	SkipUnlessIPVS(t)
	skipIPVSComparisonElsewhere(t)
	checkHostUnchanged(t, IPVS)
	kp, admin := startFixture(t, IPVS)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	if _, err := createLoadBalancer(ctx, admin, IPVS); err != nil {
		t.Fatal(err)
	}
	ids, svcs, err := standInServices(ctx, admin, DefaultNodeName)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitIPVSSynced(ctx, kp, svcs); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-proxy (ipvs mode) wrote the fixture Services %s after it was started", time.Since(kp.Started()).Round(time.Millisecond))
	idents := NewIdents(ids)
	real := ipvsModel(t, kp.Exec, idents)
	ns := standInNetns(t)
	node := standInNode()
	node.IPVS, node.Dummy = true, probeDummy(ns)
	t0 := time.Now()
	if err := lab.WriteKubeProxyStandIn(ns, lab.StandInIPVS, node, svcs); err != nil {
		t.Fatal(err)
	}
	t.Logf("stand-in wrote %d Services in %s", len(svcs), time.Since(t0).Round(time.Millisecond))
	got := ipvsModel(t, func(args ...string) (string, error) { return ns.Run(args[0], args[1:]...) }, idents)
	checkModels(t, real, got, ipvsDifferences)
}

// ipvsDifferences are where the IPVS-mode stand-in differs from IPVS mode
// on purpose: nowhere, for the fixture (6.12 guest).
var ipvsDifferences []KnownDifference
