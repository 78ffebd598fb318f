// Package diagnose turns a joined flow into a verdict and a plain-words
// explanation that names its evidence: the rule and chain path, the ipset
// membership that did or did not match, the IPVS virtual server and its real
// servers, the bypassed listener, the conntrack entry. The rules follow
// ../shared/INCIDENTS.md; each verdict's meaning is in SPEC.md.
package diagnose

import (
	"net/netip"
	"slices"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Env is the node and cluster state a diagnosis consults beyond the flow
// itself. The live pipeline backs it with the node watcher and the
// metadata index; replay backs it with the trace header's snapshot.
type Env interface {
	// NodeName is the traced node's name.
	NodeName() string
	// OnKubeIPVS reports whether a is bound to kube-ipvs0 (kube-proxy IPVS
	// mode puts every ClusterIP, externalIP and LB IP there).
	OnKubeIPVS(a netip.Addr) bool
	// ServicePortsOn lists the "proto:port" pairs kube-proxy's ipsets (or,
	// failing those, the Services) accept on address a.
	ServicePortsOn(a netip.Addr) []string
	// IPVSService is the IPVS virtual server for proto and vip, if any.
	IPVSService(proto string, vip netip.AddrPort) (trace.IPVSService, bool)
	// Listener is a listening socket on the node that would have taken a
	// connection to dst, had nothing translated it.
	Listener(proto string, dst netip.AddrPort) (trace.Listener, bool)
	// PodNode is the node a pod runs on, or "".
	PodNode(p trace.PodRef) string
	// IsLocal reports whether a is one of the node's own addresses (a
	// "local" route), which is what portmap's locality checks test.
	IsLocal(a netip.Addr) (bool, error)
	// HostNetworkPod is the hostNetwork pod on this node declaring the
	// port: who owns a host listener.
	HostNetworkPod(proto string, port uint16) (trace.PodRef, bool)
	// Service gives the full Service the flow addressed, if known.
	Service(ref trace.ServiceRef) (trace.Service, bool)
}

// Result is a verdict with its explanation.
type Result struct {
	Verdict     string
	Explanation string
}

// Diagnose gives the flow its verdict. Rules are tried from the most
// specific incident to the generic outcomes; a flow that matches none of
// the incidents is ok when it was only translated.
func Diagnose(f *trace.Flow, env Env) Result { return DiagnoseAddrs(f, AddrsOf(f), env) }

// Addrs are a flow's destination and where it went (its reply's source,
// or the destination when it has none) as netip values: the joiner has
// them from its typed events, a recorded flow's are read from its text.
type Addrs struct{ Dst, Went netip.AddrPort }

// AddrsOf reads a recorded flow's Addrs from its text.
func AddrsOf(f *trace.Flow) Addrs {
	a := Addrs{Dst: trace.ParseEndpoint(f.Orig.Dst)}
	a.Went = a.Dst
	if f.Reply != nil {
		a.Went = trace.ParseEndpoint(f.Reply.Src)
	}
	return a
}

// DiagnoseAddrs is Diagnose of a flow whose Addrs are known.
func DiagnoseAddrs(f *trace.Flow, a Addrs, env Env) Result {
	d := &diagnosis{f: f, env: env, dstAP: a.Dst, wentAP: a.Went}
	for _, rule := range []func() (Result, bool){
		d.conntrackDrop,
		d.ipvsNoEndpoint,
		d.serviceNoEndpoint,
		d.clusterIPReject,
		d.ipvsFilterReject,
		d.hostportHijack,
		d.returnPathMismatch,
		d.answerUntranslated,
		d.generic,
	} {
		if r, ok := rule(); ok {
			return r
		}
	}
	return d.ok()
}

type diagnosis struct {
	f   *trace.Flow
	env Env
	// dstAP and wentAP are the flow's destination and where it went.
	dstAP, wentAP netip.AddrPort
}

func (d *diagnosis) event(kind string) *trace.Event {
	for i := range d.f.Events {
		if d.f.Events[i].Kind == kind {
			return &d.f.Events[i]
		}
	}
	return nil
}

func (d *diagnosis) has(kinds ...string) bool {
	return slices.ContainsFunc(kinds, func(k string) bool { return d.event(k) != nil })
}

// dst is where the client sent the flow.
func (d *diagnosis) dst() netip.AddrPort { return d.dstAP }

// wentTo is where the connection really went: the reply's source.
func (d *diagnosis) wentTo() netip.AddrPort { return d.wentAP }

// isPing reports whether the flow is ICMP of either family: ping6 to a
// ClusterIP is refused for the same reason as ping.
func (d *diagnosis) isPing() bool { return d.f.Proto == "icmp" || d.f.Proto == "icmpv6" }

// rejectReason is the ICMP error the flow's REJECT sent. When the kernel
// did not report it, REJECT's default for the destination's family stands
// in: ip6tables answers icmp6-port-unreachable, not the IPv4 name.
func (d *diagnosis) rejectReason() string {
	if ev := d.event(trace.KindReject); ev != nil && ev.Reason != "" {
		return ev.Reason
	}
	if d.dst().Addr().Unmap().Is6() {
		return "icmp6-port-unreachable"
	}
	return "icmp-port-unreachable"
}

// target names what the client addressed: "10.96.0.20:3306 (Service ns/name)".
func (d *diagnosis) target() string { return string(d.appendTarget(nil)) }

// where names an endpoint with its pod when known.
func (d *diagnosis) where(ap string, pod *trace.PodRef) string {
	if pod == nil {
		return ap
	}
	return string(appendPod([]byte(ap), pod))
}

func (d *diagnosis) ruleIn(chain string) bool {
	r := d.f.Rule
	if r == nil {
		return false
	}
	return r.Chain == chain || r.EntryChain == chain || slices.Contains(r.Path, chain)
}

func (d *diagnosis) ruleEvidence() string { return string(d.appendRuleEvidence(nil)) }

func (d *diagnosis) conntrackEvidence() string { return string(d.appendConntrackEvidence(nil)) }

// sentences joins the non-empty parts with spaces, each trimmed of
// spaces and ending in a full stop: every flow's explanation is made of
// them.
func sentences(parts ...string) string {
	p := newProse()
	for _, s := range parts {
		p.sentence(s)
	}
	return p.done()
}
