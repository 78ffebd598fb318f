package diagnose

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
)

// kube-proxy nftables mode's names (pkg/proxy/nftables/proxier.go).
const (
	kubeProxyTable     = "kube-proxy"
	clusterIPsCheck    = "cluster-ips-check"
	noEndpointServices = "no-endpoint-services"
	noEndpointNodePort = "no-endpoint-nodeports"
	kubeProxyReject    = "reject-chain"
	portmapTable       = "cni_hostport"
	// portmapLocalChain is where portmap v1.9 and later jump from
	// prerouting only for `fib daddr type local`; v1.6.1 to v1.8.x jump
	// from prerouting straight to hostports, for every destination.
	portmapLocalChain = "hostports_all"
)

// isKubeProxyNFT reports whether the flow's rule is in kube-proxy's
// nftables table and on a path through chain.
func (d *diagnosis) isKubeProxyNFT(chain string) bool {
	r := d.f.Rule
	return r.NFTables() && r.Table == kubeProxyTable && d.ruleIn(chain)
}

// clusterIPReject: kube-proxy's nftables mode rejects what still goes to a
// ClusterIP after DNAT (`cluster-ips-check`): no Service has that port or
// protocol there, so a ping to a ClusterIP (seed 003) or a wrong port is
// refused; traffic to an address of the service CIDR that no Service has
// is dropped. The counterpart of KUBE-IPVS-FILTER.
func (d *diagnosis) clusterIPReject() (Result, bool) {
	if !d.has(trace.KindReject, trace.KindDrop, trace.KindReset) || !d.isKubeProxyNFT(clusterIPsCheck) {
		return Result{}, false
	}
	dst := d.dst()
	what := d.f.Proto + " port " + fmt.Sprint(dst.Port())
	if d.isPing() {
		what = "ICMP (ping)"
	}
	rule := d.f.Rule
	if !strings.Contains(rule.Text, "reject") {
		return Result{trace.VerdictClusterIPReject, sentences(
			fmt.Sprintf("dropped by kube-proxy's cluster-ips-check: %s to %s is in the service CIDR but no Service has address %s, so kube-proxy (nftables mode) drops it and the client times out",
				what, d.target(), dst.Addr()),
			d.ruleEvidence(),
			"Fix: the address belongs to no Service (deleted, or never allocated): look the Service up again (`kubectl get services -A -o wide | grep "+dst.Addr().String()+"`) and use its current ClusterIP or DNS name",
		)}, true
	}
	ports := d.env.ServicePortsOn(dst.Addr())
	accepted := "no Service port"
	if len(ports) > 0 {
		accepted = "only " + strings.Join(ports, ", ")
	}
	how := "an ICMP port unreachable"
	if dst.Addr().Is6() {
		how = "an ICMPv6 port unreachable"
	}
	if ev := d.event(trace.KindReject); ev != nil && ev.Reason != "" {
		how = ev.Reason
	}
	fix := "Fix: connect to one of the Service's own ports; a ClusterIP answers nothing else"
	if d.isPing() {
		fix = "A ClusterIP is virtual: kube-proxy answers only its Service ports, and ping never will. Test the Service with a connection to its port instead"
	}
	return Result{trace.VerdictClusterIPReject, sentences(
		fmt.Sprintf("rejected by kube-proxy's cluster-ips-check: %s to %s reached the filter still addressed to the ClusterIP, which means no Service has that port or protocol there (it accepts %s), so kube-proxy (nftables mode) answered with %s",
			what, d.target(), accepted, how),
		d.ruleEvidence(),
		fix,
	)}, true
}

// nftNoEndpointComment is kube-proxy's comment on a no-endpoint-services
// or no-endpoint-nodeports element: "NS/NAME:PORT" (PORT the port's name,
// left out with its colon when the port has none).
var nftNoEndpointComment = regexp.MustCompile(`^([^\s/]+)/([^\s:]+)(?::(\S+))?$`)

// parseNFTNoEndpoint reads kube-proxy nftables mode's no-endpoint
// decision: the element of no-endpoint-services (or -nodeports) whose
// verdict is `goto reject-chain` (no endpoint at all) or `drop` (a Local
// traffic policy and no local endpoint).
func parseNFTNoEndpoint(r *trace.Rule) (noEndpointRule, bool) {
	if !r.NFTables() || r.Table != kubeProxyTable || r.Element == nil ||
		(r.Element.Map != noEndpointServices && r.Element.Map != noEndpointNodePort) {
		return noEndpointRule{}, false
	}
	m := nftNoEndpointComment.FindStringSubmatch(r.Element.Comment)
	if m == nil {
		return noEndpointRule{}, false
	}
	reject := r.Chain == kubeProxyReject || slices.Contains(r.Path, kubeProxyReject)
	return noEndpointRule{
		svc:     trace.ServiceRef{Namespace: m[1], Name: m[2], Port: m[3]},
		comment: r.Element.Comment,
		local:   !reject,
		reject:  reject,
	}, true
}

// portmapNFT reports whether the rule is one of portmap's nftables
// backend, and whether a locality check guarded it.
func portmapNFT(r *trace.Rule) (isPortmap, localOnly bool) {
	if !r.NFTables() || r.Table != portmapTable {
		return false, false
	}
	return true, slices.Contains(r.Path, portmapLocalChain)
}
