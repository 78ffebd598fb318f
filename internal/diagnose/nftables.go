package diagnose

import (
	"regexp"
	"slices"
	"strconv"
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
	what := func(b []byte) []byte {
		if d.isPing() {
			return append(b, "ICMP (ping)"...)
		}
		return strconv.AppendUint(append(append(b, d.f.Proto...), " port "...), uint64(dst.Port()), 10)
	}
	p := newProse()
	p.begin()
	if !strings.Contains(d.f.Rule.Text, "reject") {
		p.b = d.appendTarget(append(what(append(p.b, "dropped by kube-proxy's cluster-ips-check: "...)), " to "...))
		p.b = dst.Addr().AppendTo(append(p.b, " is in the service CIDR but no Service has address "...))
		p.b = append(p.b, ", so kube-proxy (nftables mode) drops it and the client times out"...)
		p.end()
		p.add(d.appendRuleEvidence)
		p.begin()
		p.b = dst.Addr().AppendTo(append(p.b, "Fix: the address belongs to no Service (deleted, or never allocated): look the Service up again (`kubectl get services -A -o wide | grep "...))
		p.b = append(p.b, "`) and use its current ClusterIP or DNS name"...)
		p.end()
		return Result{trace.VerdictClusterIPReject, p.done()}, true
	}
	p.b = d.appendTarget(append(what(append(p.b, "rejected by kube-proxy's cluster-ips-check: "...)), " to "...))
	p.b = append(p.b, " reached the filter still addressed to the ClusterIP, which means no Service has that port or protocol there (it accepts "...)
	if ports := d.env.ServicePortsOn(dst.Addr()); len(ports) > 0 {
		p.b = append(p.b, "only "...)
		for i, port := range ports {
			if i > 0 {
				p.b = append(p.b, ", "...)
			}
			p.b = append(p.b, port...)
		}
	} else {
		p.b = append(p.b, "no Service port"...)
	}
	p.b = append(p.b, "), so kube-proxy (nftables mode) answered with "...)
	switch ev := d.event(trace.KindReject); {
	case ev != nil && ev.Reason != "":
		p.b = append(p.b, ev.Reason...)
	case dst.Addr().Is6():
		p.b = append(p.b, "an ICMPv6 port unreachable"...)
	default:
		p.b = append(p.b, "an ICMP port unreachable"...)
	}
	p.end()
	p.add(d.appendRuleEvidence)
	if d.isPing() {
		p.sentence("A ClusterIP is virtual: kube-proxy answers only its Service ports, and ping never will. Test the Service with a connection to its port instead")
	} else {
		p.sentence("Fix: connect to one of the Service's own ports; a ClusterIP answers nothing else")
	}
	return Result{trace.VerdictClusterIPReject, p.done()}, true
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
