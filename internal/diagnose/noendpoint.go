package diagnose

import (
	"regexp"
	"strconv"
	"strings"
	"sync"

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

// noEndpointRules remembers what each rule says, by the rule: a rule is
// shared by every flow attributed to it and never changes, and reading its
// text is dearer than the rest of the diagnosis. A full memo starts over.
var noEndpointRules = struct {
	sync.Mutex
	said map[*trace.Rule]noEndpointSaid
}{said: map[*trace.Rule]noEndpointSaid{}}

type noEndpointSaid struct {
	rule noEndpointRule
	ok   bool
}

const noEndpointRulesKept = 4096

// noEndpointRuleOf is parseNoEndpointRule of r, once per rule.
func noEndpointRuleOf(r *trace.Rule) (noEndpointRule, bool) {
	if r == nil {
		return noEndpointRule{}, false
	}
	m := &noEndpointRules
	m.Lock()
	said, known := m.said[r]
	m.Unlock()
	if known {
		return said.rule, said.ok
	}
	ne, ok := parseNoEndpointRule(r)
	m.Lock()
	if len(m.said) >= noEndpointRulesKept {
		clear(m.said)
	}
	m.said[r] = noEndpointSaid{rule: ne, ok: ok}
	m.Unlock()
	return ne, ok
}

// parseNoEndpointRule reads r, which is not nil.
func parseNoEndpointRule(r *trace.Rule) (noEndpointRule, bool) {
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

// appendService writes the Service the rule names, and its port's name.
func (ne noEndpointRule) appendService(b []byte) []byte {
	b = appendKey(b, ne.svc.Namespace, ne.svc.Name)
	if ne.svc.Port != "" {
		b = append(append(append(b, " (port "...), ne.svc.Port...), ')')
	}
	return b
}

// serviceNoEndpoint: kube-proxy's iptables mode refuses a Service port that
// has no endpoint in the filter table, where nothing was DNAT'd: a Service
// with no ready endpoint at all is REJECTed (the client sees "connection
// refused"), one whose Local traffic policy leaves this node without an
// endpoint is DROPped (the client times out). A Service without endpoints
// is refused at the rate its clients retry, so the explanation is written
// straight into one buffer.
func (d *diagnosis) serviceNoEndpoint() (Result, bool) {
	if !d.has(trace.KindReject, trace.KindDrop) {
		return Result{}, false
	}
	ne, ok := noEndpointRuleOf(d.f.Rule)
	if !ok {
		return Result{}, false
	}
	// Each piece is a sentence of its own; calls, not a list of funcs,
	// keep d from escaping to the heap.
	p := newProse()
	p.begin()
	p.b = d.appendNoEndpointWhat(p.b, ne)
	p.end()
	p.add(d.appendRuleEvidence)
	p.begin()
	p.b = d.appendNoEndpointComment(p.b, ne)
	p.end()
	p.begin()
	p.b = d.appendNoEndpointCrossCheck(p.b, ne)
	p.end()
	p.begin()
	p.b = d.appendNoEndpointFix(p.b, ne)
	p.end()
	return Result{trace.VerdictServiceNoEndpoint, p.done()}, true
}

func (d *diagnosis) appendNoEndpointComment(b []byte, ne noEndpointRule) []byte {
	if r := d.f.Rule; r.NFTables() {
		b = append(append(append(append(b, "kube-proxy's element "...), r.Element.Key...), " of map "...), r.Element.Map...)
		return strconv.AppendQuote(append(b, " names it: comment "...), ne.comment)
	}
	return strconv.AppendQuote(append(b, "kube-proxy's comment on it: "...), ne.comment)
}

// appendNoEndpointWhat says what happened to the connection, and what its
// client saw.
func (d *diagnosis) appendNoEndpointWhat(b []byte, ne noEndpointRule) []byte {
	if ne.local {
		b = ne.appendService(append(b, "no local endpoint: Service "...))
		b = append(append(append(b, " has a Local traffic policy and node "...), d.nodeName()...), " runs none of its ready endpoints"...)
	} else {
		b = append(ne.appendService(append(b, "no endpoints: Service "...)), " has no ready endpoint"...)
	}
	if r := d.f.Rule; r.NFTables() {
		b = append(append(append(b, ", so kube-proxy (nftables mode) lists it in "...), r.Element.Map...), ", whose element caught the connection from "...)
	} else {
		b = append(b, ", so kube-proxy's filter rule for it caught the connection from "...)
	}
	b = append(append(append(append(b, d.f.Orig.Src...), " to "...), d.f.Orig.Dst...), " and "...)
	switch ev := d.event(trace.KindReject); {
	case !ne.reject:
		return append(b, "dropped it silently: the client times out"...)
	case ev != nil:
		return append(append(append(b, "rejected it with "...), orDefault(ev.Reason, "an ICMP error")...), `: the client sees "connection refused"`...)
	}
	return append(b, "rejected it with an ICMP error the kernel did not report, and dropped it"...)
}

// appendNoEndpointCrossCheck compares the Service the rule names with the
// one the metadata says the client addressed. When they differ both are
// named: which one is stale only the cluster can tell.
func (d *diagnosis) appendNoEndpointCrossCheck(b []byte, ne noEndpointRule) []byte {
	sv := d.f.Service
	if sv == nil {
		return append(append(append(b, "The Service is named by the rule's comment alone: no pod and Service metadata says what "...), d.f.Orig.Dst...), " is"...)
	}
	if sv.Namespace == ne.svc.Namespace && sv.Name == ne.svc.Name {
		return b
	}
	b = append(append(append(b, "But the metadata says "...), d.f.Orig.Dst...), " is Service "...)
	b = appendKey(b, sv.Namespace, sv.Name)
	b = appendKey(append(b, ", not "...), ne.svc.Namespace, ne.svc.Name)
	return append(b, ": kube-proxy's rules and the API server disagree (one is stale, e.g. kube-proxy has not synced since the address changed hands); check both Services"...)
}

func (d *diagnosis) nodeName() string { return orDefault(d.env.NodeName(), "this node") }

// appendNoEndpointFix: kube-proxy writes "has no endpoints" when no
// endpoint of the Service is ready, and "has no local endpoints" in
// KUBE-SERVICES for internalTrafficPolicy Local, in KUBE-EXTERNAL-SERVICES
// for externalTrafficPolicy Local.
func (d *diagnosis) appendNoEndpointFix(b []byte, ne noEndpointRule) []byte {
	ns, name := ne.svc.Namespace, ne.svc.Name
	list := func(b []byte) []byte {
		b = append(append(append(b, "`kubectl get endpointslices -n "...), ns...), " -l kubernetes.io/service-name="...)
		return append(append(b, name...), " -o wide`"...)
	}
	switch {
	case !ne.local:
		b = appendKey(append(b, "Fix: the selector of Service "...), ns, name)
		b = append(list(append(b, " matches no ready pod. "...)), " lists its endpoints and whether they are ready; check that the selector (`kubectl describe service -n "...)
		b = append(append(append(append(b, ns...), ' '), name...), "`) matches the pods' labels and that those pods pass their readiness probes"...)
		return b
	case d.ruleIn("KUBE-EXTERNAL-SERVICES") || d.f.Rule.NFTables() && d.f.Rule.Element.Map == noEndpointNodePort:
		b = list(append(b, "Fix: with externalTrafficPolicy: Local, external IPs, LoadBalancer IPs and NodePorts answer only on nodes with a ready endpoint ("...))
		b = append(b, " shows each endpoint's node). Send external traffic only to such nodes (the load balancer's health check on healthCheckNodePort does that), run an endpoint on node "...)
		return append(append(b, d.nodeName()...), ", or use externalTrafficPolicy: Cluster"...)
	default:
		b = list(append(b, "Fix: with internalTrafficPolicy: Local, the ClusterIP answers only on nodes with a ready endpoint ("...))
		return append(b, " shows each endpoint's node). Run an endpoint on every node whose clients use it (a DaemonSet), or use internalTrafficPolicy: Cluster"...)
	}
}
