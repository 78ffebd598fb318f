package diagnose

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
)

// noEndpointComment matches the comment kube-proxy's iptables mode puts on
// the filter rules of a Service port without endpoints (proxier.go,
// syncProxyRules): "NS/NAME:PORT has no endpoints" on a REJECT, "NS/NAME:PORT
// has no local endpoints" on a DROP. PORT is the Service port's name and is
// left out, with its colon, when the port has none. iptables-save quotes
// the comment; kube-proxy's own restore input does too.
var noEndpointComment = regexp.MustCompile(`--comment "?([^\s"/]+)/([^\s":]+)(?::([^\s"]+))? has no (local )?endpoints"?`)

// noEndpointRule is what one of those rules says.
type noEndpointRule struct {
	svc     trace.ServiceRef // named by the comment
	comment string
	local   bool // "has no local endpoints": a Local traffic policy
	reject  bool // -j REJECT; otherwise -j DROP
}

func parseNoEndpointRule(r *trace.Rule) (noEndpointRule, bool) {
	if r == nil {
		return noEndpointRule{}, false
	}
	if r.NFTables() {
		return parseNFTNoEndpoint(r)
	}
	m := noEndpointComment.FindStringSubmatch(r.Text)
	if m == nil {
		return noEndpointRule{}, false
	}
	reject := hasTarget(r.Text, "REJECT")
	if !reject && !hasTarget(r.Text, "DROP") {
		return noEndpointRule{}, false
	}
	return noEndpointRule{
		svc:     trace.ServiceRef{Namespace: m[1], Name: m[2], Port: m[3]},
		comment: strings.Trim(strings.TrimPrefix(m[0], "--comment "), `"`),
		local:   m[4] != "",
		reject:  reject,
	}, true
}

// hasTarget reports whether an iptables-save rule jumps to target.
func hasTarget(text, target string) bool {
	f := strings.Fields(text)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" && f[i+1] == target {
			return true
		}
	}
	return false
}

func (ne noEndpointRule) service() string {
	s := ne.svc.Namespace + "/" + ne.svc.Name
	if ne.svc.Port != "" {
		s += " (port " + ne.svc.Port + ")"
	}
	return s
}

// serviceNoEndpoint: kube-proxy's iptables mode refuses a Service port that
// has no endpoint in the filter table, where nothing was DNAT'd: a Service
// with no ready endpoint at all is REJECTed (the client sees "connection
// refused"), one whose Local traffic policy leaves this node without an
// endpoint is DROPped (the client times out).
func (d *diagnosis) serviceNoEndpoint() (Result, bool) {
	if !d.has(trace.KindReject, trace.KindDrop) {
		return Result{}, false
	}
	ne, ok := parseNoEndpointRule(d.f.Rule)
	if !ok {
		return Result{}, false
	}
	return Result{trace.VerdictServiceNoEndpoint, sentences(
		d.noEndpointWhat(ne),
		d.ruleEvidence(),
		d.noEndpointComment(ne),
		d.noEndpointCrossCheck(ne),
		d.noEndpointFix(ne),
	)}, true
}

func (d *diagnosis) noEndpointComment(ne noEndpointRule) string {
	if r := d.f.Rule; r.NFTables() {
		return fmt.Sprintf("kube-proxy's element %s of map %s names it: comment %q", r.Element.Key, r.Element.Map, ne.comment)
	}
	return fmt.Sprintf("kube-proxy's comment on it: %q", ne.comment)
}

// noEndpointWhat says what happened to the connection, and what its client
// saw.
func (d *diagnosis) noEndpointWhat(ne noEndpointRule) string {
	why := fmt.Sprintf("no endpoints: Service %s has no ready endpoint", ne.service())
	if ne.local {
		why = fmt.Sprintf("no local endpoint: Service %s has a Local traffic policy and node %s runs none of its ready endpoints", ne.service(), d.nodeName())
	}
	did := "dropped it silently: the client times out"
	if ne.reject {
		did = "rejected it with an ICMP error the kernel did not report, and dropped it"
		if ev := d.event(trace.KindReject); ev != nil {
			did = fmt.Sprintf("rejected it with %s: the client sees \"connection refused\"", orDefault(ev.Reason, "an ICMP error"))
		}
	}
	if d.f.Rule.NFTables() {
		return fmt.Sprintf("%s, so kube-proxy (nftables mode) lists it in %s, whose element caught the connection from %s to %s and %s",
			why, d.f.Rule.Element.Map, d.f.Orig.Src, d.f.Orig.Dst, did)
	}
	return fmt.Sprintf("%s, so kube-proxy's filter rule for it caught the connection from %s to %s and %s",
		why, d.f.Orig.Src, d.f.Orig.Dst, did)
}

// noEndpointCrossCheck compares the Service the rule names with the one
// the metadata says the client addressed. When they differ both are
// named: which one is stale only the cluster can tell.
func (d *diagnosis) noEndpointCrossCheck(ne noEndpointRule) string {
	sv := d.f.Service
	if sv == nil {
		return "The Service is named by the rule's comment alone: no pod and Service metadata says what " + d.f.Orig.Dst + " is"
	}
	if sv.Namespace == ne.svc.Namespace && sv.Name == ne.svc.Name {
		return ""
	}
	return fmt.Sprintf("But the metadata says %s is Service %s/%s, not %s/%s: kube-proxy's rules and the API server disagree (one is stale, e.g. kube-proxy has not synced since the address changed hands); check both Services",
		d.f.Orig.Dst, sv.Namespace, sv.Name, ne.svc.Namespace, ne.svc.Name)
}

func (d *diagnosis) nodeName() string { return orDefault(d.env.NodeName(), "this node") }

// noEndpointFix: kube-proxy writes "has no endpoints" when no endpoint of
// the Service is ready, and "has no local endpoints" in KUBE-SERVICES for
// internalTrafficPolicy Local, in KUBE-EXTERNAL-SERVICES for
// externalTrafficPolicy Local.
func (d *diagnosis) noEndpointFix(ne noEndpointRule) string {
	ns, name := ne.svc.Namespace, ne.svc.Name
	list := fmt.Sprintf("`kubectl get endpointslices -n %s -l kubernetes.io/service-name=%s -o wide`", ns, name)
	switch {
	case !ne.local:
		return fmt.Sprintf("Fix: the selector of Service %s/%s matches no ready pod. %s lists its endpoints and whether they are ready; check that the selector (`kubectl describe service -n %s %s`) matches the pods' labels and that those pods pass their readiness probes",
			ns, name, list, ns, name)
	case d.ruleIn("KUBE-EXTERNAL-SERVICES") || d.f.Rule.NFTables() && d.f.Rule.Element.Map == noEndpointNodePort:
		return fmt.Sprintf("Fix: with externalTrafficPolicy: Local, external IPs, LoadBalancer IPs and NodePorts answer only on nodes with a ready endpoint (%s shows each endpoint's node). Send external traffic only to such nodes (the load balancer's health check on healthCheckNodePort does that), run an endpoint on node %s, or use externalTrafficPolicy: Cluster",
			list, d.nodeName())
	default:
		return fmt.Sprintf("Fix: with internalTrafficPolicy: Local, the ClusterIP answers only on nodes with a ready endpoint (%s shows each endpoint's node). Run an endpoint on every node whose clients use it (a DaemonSet), or use internalTrafficPolicy: Cluster",
			list)
	}
}
