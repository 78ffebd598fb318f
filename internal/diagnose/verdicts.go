package diagnose

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// ipvsNoEndpoint: an IPVS virtual server with no real server answered the
// client with ICMP port unreachable (ip_vs_leave), seed 004's ETP=Local
// before Kubernetes 1.24.
func (d *diagnosis) ipvsNoEndpoint() (Result, bool) {
	leave := d.event(trace.KindIPVSNoDest)
	vs, haveVS := d.env.IPVSService(d.f.Proto, d.dst())
	emptyVS := haveVS && len(vs.Reals) == 0 && d.has(trace.KindReject)
	if leave == nil && !emptyVS {
		return Result{}, false
	}
	virtual := d.f.Orig.Dst
	if leave != nil && leave.Virtual != "" {
		virtual = leave.Virtual
	}
	how := "ICMP port unreachable"
	if d.dst().Addr().Is6() {
		how = "ICMPv6 port unreachable"
	}
	if r := d.event(trace.KindReject); r != nil && r.Reason != "" {
		how = r.Reason
	}
	etp := ""
	if sv, ok := d.service(); ok && strings.EqualFold(sv.ETP, "Local") {
		etp = fmt.Sprintf("Service %s/%s has externalTrafficPolicy=Local and node %s runs none of its endpoints; kube-proxy before 1.24 leaves such a virtual server without real servers (since 1.24 it lists every endpoint instead)",
			sv.Namespace, sv.Name, d.env.NodeName())
	}
	return Result{trace.VerdictIPVSNoEndpoint, sentences(
		fmt.Sprintf("no endpoint: IPVS virtual server %s %s has no real server, so IPVS dropped %s's packet and answered with %s (ip_vs_leave)",
			d.f.Proto, d.targetAt(virtual), d.f.Orig.Src, how),
		etp,
		"Fix: run an endpoint on this node, send the traffic only to nodes that have one (the LB's health check on healthCheckNodePort does this), or use externalTrafficPolicy=Cluster",
	)}, true
}

func (d *diagnosis) targetAt(virtual string) string {
	if sv := d.f.Service; sv != nil {
		return fmt.Sprintf("%s (Service %s/%s)", virtual, sv.Namespace, sv.Name)
	}
	return virtual
}

func (d *diagnosis) service() (trace.Service, bool) {
	if d.f.Service == nil {
		return trace.Service{}, false
	}
	return d.env.Service(*d.f.Service)
}

// ipvsFilterReject: kube-proxy's KUBE-IPVS-FILTER (IPVS mode, 1.26+) rejects
// new connections to an address on kube-ipvs0 that is not a service
// ip,port: ping to a ClusterIP (seed 003), an LB IP port that belongs to
// something outside the cluster (seed 004).
func (d *diagnosis) ipvsFilterReject() (Result, bool) {
	if !d.has(trace.KindReject, trace.KindDrop, trace.KindReset) {
		return Result{}, false
	}
	dst := d.dst()
	byRule := d.ruleIn("KUBE-IPVS-FILTER")
	if d.f.Rule != nil && !byRule {
		return Result{}, false // another rule decided: not this incident
	}
	if !byRule && !(d.has(trace.KindReject) && d.env.OnKubeIPVS(dst.Addr())) {
		return Result{}, false
	}
	ports := d.env.ServicePortsOn(dst.Addr())
	p := newProse()
	p.begin()
	p.b = append(p.b, "rejected by KUBE-IPVS-FILTER: "...)
	if d.isPing() {
		p.b = append(p.b, "ICMP (ping)"...)
	} else {
		p.b = strconv.AppendUint(append(append(p.b, d.f.Proto...), " port "...), uint64(dst.Port()), 10)
	}
	p.b = d.appendTarget(append(p.b, " to "...))
	p.b = dst.Addr().AppendTo(append(p.b, " is refused because "...))
	p.b = append(append(p.b, " is bound to kube-ipvs0 (ipset "...), ipvsIPsSet(dst.Addr())...)
	p.b = append(p.b, ") while kube-proxy's ipsets accept "...)
	if len(ports) == 0 {
		p.b = append(p.b, "no service port"...)
	} else {
		p.b = append(p.b, "only "...)
		for i, port := range ports {
			if i > 0 {
				p.b = append(p.b, ", "...)
			}
			p.b = append(p.b, port...)
		}
	}
	p.b = append(p.b, " there, so the filter (kube-proxy IPVS mode ≥ 1.26) REJECTs new connections with "...)
	p.b = append(p.b, d.rejectReason()...)
	p.end()
	p.begin()
	if d.f.Rule != nil {
		p.b = d.appendRuleEvidence(p.b)
	} else {
		p.b = append(p.b, "The rule was not attributed (no rules snapshot), but the address is on kube-ipvs0 and the packet was rejected"...)
	}
	p.end()
	p.sentence(d.filterFix())
	return Result{trace.VerdictIPVSFilterReject, p.done()}, true
}

// ipvsIPsSet is kube-proxy's ipset of kube-ipvs0 addresses for a's family:
// its IPv6 sets take the prefix KUBE-6- (pkg/proxy/ipvs/ipset.go).
func ipvsIPsSet(a netip.Addr) string {
	if a.Unmap().Is6() {
		return "KUBE-6-IPVS-IPS"
	}
	return "KUBE-IPVS-IPS"
}

// filterFix says what to do about the filter's REJECT.
func (d *diagnosis) filterFix() string {
	if d.isPing() {
		return "A ClusterIP is virtual: in IPVS mode only its service ports answer, and ping never will. Test the Service with a connection to its port instead"
	}
	if sv, ok := d.service(); ok && len(sv.LBIPs) > 0 {
		return fmt.Sprintf("The LoadBalancer IP of Service %s/%s is bound to kube-ipvs0 on every node, so in-cluster traffic to it never reaches the cloud load balancer and only the ports of this Service answer. Fix: have the cloud controller publish a hostname in the Service status, or set ipMode: Proxy (Kubernetes ≥ 1.30)", sv.Namespace, sv.Name)
	}
	return "Only the Service's own ports are reachable on a kube-ipvs0 address; connect to one of them"
}

// isPortmapRule reports whether the flow's rule is a CNI portmap hostPort DNAT.
func (d *diagnosis) isPortmapRule() bool {
	r := d.f.Rule
	if r == nil {
		return false
	}
	if pm, _ := portmapNFT(r); pm {
		return true
	}
	return strings.HasPrefix(r.Chain, "CNI-DN-") || d.ruleIn("CNI-HOSTPORT-DNAT")
}

// hostportHijack: a hostPort DNAT (portmap) took a flow addressed to a
// Service VIP, a NodePort, an LB IP, or a port a host listener owns (seeds
// 000 and 002).
func (d *diagnosis) hostportHijack() (Result, bool) {
	if !d.has(trace.KindDNAT) || !d.isPortmapRule() {
		return Result{}, false
	}
	dst := d.dst()
	var bypassed []string
	onIPVS := d.env.OnKubeIPVS(dst.Addr())
	if sv := d.f.Service; sv != nil {
		bypassed = append(bypassed, "Service "+sv.Namespace+"/"+sv.Name)
	} else if onIPVS {
		bypassed = append(bypassed, "the Service VIP "+dst.Addr().String())
	}
	l, listener := d.env.Listener(d.f.Proto, dst)
	if listener {
		who := l.Address
		if pod, ok := d.env.HostNetworkPod(d.f.Proto, dst.Port()); ok {
			who += " (hostNetwork pod " + pod.Key() + ")"
		} else if l.Process != "" {
			who += " (" + l.Process + ")"
		}
		bypassed = append(bypassed, "the host listener on "+who)
	}
	_, localOnly := portmapNFT(d.f.Rule)
	nftNoLocality := d.f.Rule.NFTables() && !localOnly
	if local, err := d.env.IsLocal(dst.Addr()); nftNoLocality && d.f.Service == nil && err == nil && !local {
		// With no locality check a hostPort takes traffic to anywhere.
		bypassed = append(bypassed, "the destination "+dst.String()+" itself, which is not an address of this node")
	}
	if len(bypassed) == 0 {
		return Result{}, false // a hostPort used as intended
	}
	owner := "a hostPort pod"
	if r := d.f.Rule; r.Owner != nil && r.Owner.Pod != nil {
		owner = "pod " + r.Owner.Pod.Key()
	}
	p := newProse()
	p.begin()
	p.b = d.appendTarget(append(p.b, "hijacked: "...))
	p.b = appendPod(d.wentTo().AppendTo(append(p.b, " was DNAT'd to "...)), d.f.DstPod)
	p.b = append(append(p.b, " by the hostPort rule of "...), owner...)
	p.b = append(append(p.b, " in chain "...), d.f.Rule.Chain...)
	p.b = append(p.b, ", bypassing "...)
	for i, what := range bypassed {
		if i > 0 {
			p.b = append(p.b, " and "...)
		}
		p.b = append(p.b, what...)
	}
	p.end()
	p.begin()
	p.b = append(append(p.b, "Why: "...), d.hijackWhy(onIPVS, localOnly)...)
	if order := d.nftHookOrder(); order != "" {
		p.b = append(append(p.b, "; "...), order...)
	}
	p.end()
	p.add(d.appendRuleEvidence)
	p.sentence("No socket holds a hostPort, so ss, netstat, lsof and ipvsadm show nothing")
	p.begin()
	p.b = d.appendHijackFix(p.b, dst.Port(), owner, listener)
	p.end()
	return Result{trace.VerdictHostportHijack, p.done()}, true
}

// hijackWhy says which locality check let the hostPort rule take the
// packet, per rule source and portmap version.
func (d *diagnosis) hijackWhy(onIPVS, localOnly bool) string {
	if d.f.Rule.NFTables() {
		if !localOnly {
			return "portmap's nftables backend before v1.9 (v1.6.1 to v1.8.x) jumps from its prerouting chain to hostports with no locality check, so it captures every packet to that port whatever the destination: traffic to ClusterIPs routed through this node and to addresses outside the cluster included, which is worse than the iptables backend"
		}
		why := "portmap's nftables backend (v1.9 and later) jumps to hostports_all for `fib daddr type local`, which matches every address local to the node"
		if onIPVS {
			why += "; kube-ipvs0 makes every ClusterIP and LB IP local, and the DNAT runs before IPVS sees the packet"
		}
		return why
	}
	if onIPVS {
		return "kube-ipvs0 makes every ClusterIP and LB IP local, so portmap's `-m addrtype --dst-type LOCAL` jump to CNI-HOSTPORT-DNAT matches them, and its DNAT runs before IPVS sees the packet"
	}
	return "portmap's `-m addrtype --dst-type LOCAL` jump to CNI-HOSTPORT-DNAT matches every address local to the node"
}

// nftHookOrder says why portmap's nftables DNAT came before kube-proxy's
// for a Service's address: both base chains hook nat prerouting at
// priority dstnat, the kernel runs equal priorities newest first
// (nf_hook_entries_grow inserts a hook ahead of those with the same
// priority), and NAT keeps a connection's first DNAT. kube-proxy's table
// is usually the older one, so its Service rules never see the packet.
func (d *diagnosis) nftHookOrder() string {
	if !d.f.Rule.NFTables() || d.f.Service == nil {
		return ""
	}
	return "kube-proxy's nat-prerouting and portmap's prerouting chain both hook prerouting at priority dstnat; of base chains with the same priority the one registered last runs first, and a connection keeps the first DNAT it gets, so portmap's rule took it before kube-proxy's Service rules could"
}

func (d *diagnosis) appendHijackFix(b []byte, port uint16, owner string, listener bool) []byte {
	b = strconv.AppendUint(append(b, "Fix: remove hostPort "...), uint64(port), 10)
	b = append(append(b, " from "...), owner...)
	b = append(b, " or move it to a port no Service, NodePort or host listener uses"...)
	if _, localOnly := portmapNFT(d.f.Rule); d.f.Rule.NFTables() && !localOnly {
		b = append(b, "; and upgrade portmap to v1.9 or later, whose nftables backend captures only the node's own addresses"...)
	}
	if listener {
		b = append(b, "; a hostNetwork listener and a hostPort on the same port conflict: pick one"...)
	}
	return b
}

// returnPathMismatch: DNAT without SNAT to a backend that replies around
// this node (seed 004, ETP=Local since 1.24): on the DNAT node the entry
// stays unreplied; on the client, the reply from the wrong five-tuple is
// reset or dropped.
func (d *diagnosis) returnPathMismatch() (Result, bool) {
	if r, ok := d.clientSideMismatch(); ok {
		return r, true
	}
	if !d.has(trace.KindDNAT, trace.KindIPVS) || d.has(trace.KindSNAT) {
		return Result{}, false
	}
	if !d.f.Conntrack.Unreplied() || d.f.Proto != "tcp" {
		return Result{}, false
	}
	remote := d.f.DstPod != nil && d.env.PodNode(*d.f.DstPod) != "" && d.env.PodNode(*d.f.DstPod) != d.env.NodeName()
	if !remote {
		return Result{}, false
	}
	node := d.env.PodNode(*d.f.DstPod)
	return Result{trace.VerdictReturnPathMismatch, sentences(
		fmt.Sprintf("return path: %s from %s was DNAT'd to %s on node %s without SNAT, so that pod answers %s directly from %s instead of through this node",
			d.target(), d.f.Orig.Src, d.where(d.wentTo().String(), d.f.DstPod), node, d.f.Orig.Src, d.wentTo()),
		"The client has no connection to that address: it resets or drops the answer", d.conntrackEvidence()+" on this node",
		d.ruleEvidence(), d.etpNote(),
		"Fix: route the traffic only to nodes with a local endpoint (the LB health check on healthCheckNodePort), or use externalTrafficPolicy=Cluster so the node SNATs",
	)}, true
}

func (d *diagnosis) etpNote() string {
	if sv, ok := d.service(); ok && strings.EqualFold(sv.ETP, "Local") {
		return fmt.Sprintf("Service %s/%s has externalTrafficPolicy=Local and node %s has no local endpoint: since Kubernetes 1.24 kube-proxy then forwards to every endpoint without SNAT", sv.Namespace, sv.Name, d.env.NodeName())
	}
	return ""
}

// clientSideMismatch: a stack reset or drop of a packet that answers one of
// the client's connections from an address it never connected to. The
// joiner records the client's connection as the flow's reply-less orig
// and the stray packet in the event.
func (d *diagnosis) clientSideMismatch() (Result, bool) {
	ev := d.event(trace.KindReset)
	if ev == nil || ev.By != trace.ResetByStack {
		ev = d.event(trace.KindDrop)
	}
	if ev == nil || ev.Packet == nil || d.f.Reply == nil {
		return Result{}, false
	}
	// The stray answer comes from somewhere the client did not address,
	// to the client's own address and port.
	if ev.Packet.Dst != d.f.Orig.Src || ev.Packet.Src == d.f.Orig.Dst || ev.Packet.Src == d.f.Reply.Src {
		return Result{}, false
	}
	what := "reset"
	if ev.Kind == trace.KindDrop {
		what = "dropped (" + ev.Reason + ")"
	}
	return Result{trace.VerdictReturnPathMismatch, sentences(
		fmt.Sprintf("return path: %s connected to %s, but the answer came from %s, a different five-tuple, so the client's stack %s it",
			d.f.Orig.Src, d.target(), ev.Packet.Src, what),
		"Something DNAT'd the connection without SNAT and the backend replied directly instead of through the node that translated it",
		d.conntrackEvidence(),
	)}, true
}

// unansweredNeighbour is the address the kernel dropped a packet of the
// flow for because no neighbour answered for it (kfree_skb's
// NEIGH_FAILED): ARP or neighbour discovery went unanswered for 3 s, and
// the kernel answered the sender with host-unreachable itself.
func (d *diagnosis) unansweredNeighbour() (string, bool) {
	for i := range d.f.Events {
		e := &d.f.Events[i]
		if e.Kind == trace.KindDrop && e.Reason == "NEIGH_FAILED" && e.Packet != nil {
			if ap := trace.ParseEndpoint(e.Packet.Dst); ap.IsValid() {
				return ap.Addr().String(), true
			}
		}
	}
	return "", false
}

// neighbourGaveUp is, without that drop (a tier without kfree_skb), the
// rejected packet's destination and how long after the flow's first event
// the kernel sent its host-unreachable: an unreachable route answers at
// once, a neighbour nobody answers after its 3 s of solicitations.
func (d *diagnosis) neighbourGaveUp(ev *trace.Event) (addr string, after time.Duration, ok bool) {
	if ev.Reason != "icmp-host-unreachable" && ev.Reason != "icmp6-addr-unreachable" || ev.Packet == nil || len(d.f.Events) == 0 {
		return "", 0, false
	}
	after = ev.Time.Sub(d.f.Events[0].Time)
	ap := trace.ParseEndpoint(ev.Packet.Dst)
	if after < neighbourTimeout || !ap.IsValid() {
		return "", 0, false
	}
	return ap.Addr().String(), after, true
}

// neighbourTimeout is a little under the 3 s both families' neighbour
// resolution takes to fail by default (3 solicitations a second apart).
const neighbourTimeout = 2500 * time.Millisecond

// appendNeighbourFailed says no host answered at addr, and when the flow
// was translated there, that its target is down or gone.
func (d *diagnosis) appendNeighbourFailed(b []byte, addr string) []byte {
	b = append(b, "nothing answered ARP or neighbour discovery for "...)
	b = append(b, addr...)
	if r := d.f.Reply; r != nil && r.Src != d.f.Orig.Dst && trace.ParseEndpoint(r.Src).Addr().String() == addr {
		b = append(b, ", the address the connection was DNAT'd to ("...)
		b = append(b, r.Src...)
		b = append(b, "): the endpoint is down or gone, or its address is stale"...)
		return b
	}
	return append(b, ": no host there is up"...)
}

// generic: any other REJECT, stack RST or drop, with the rule or reason.
func (d *diagnosis) generic() (Result, bool) {
	if ev := d.event(trace.KindReject); ev != nil {
		p := d.openedBy("rejected: ", " was answered with ")
		p.b = append(p.b, orDefault(ev.Reason, "an ICMP error")...)
		p.end()
		p.begin()
		n := len(p.b)
		if p.b = d.appendRuleEvidence(p.b); len(p.b) == n {
			if addr, ok := d.unansweredNeighbour(); ok {
				p.b = d.appendNeighbourFailed(append(p.b, "the kernel sent it itself: "...), addr)
			} else if addr, after, ok := d.neighbourGaveUp(ev); ok {
				p.b = append(p.b, "the kernel sent it itself "...)
				p.b = append(p.b, after.Round(10*time.Millisecond).String()...)
				p.b = append(p.b, " after the connection's first packet, the time it takes to give up on a neighbour: most likely "...)
				p.b = d.appendNeighbourFailed(p.b, addr)
			} else {
				p.b = append(p.b, "no netfilter rule explains it: the kernel itself sent the error (no listener, no route, or IPVS)"...)
			}
		}
		p.end()
		return Result{trace.VerdictRejected, p.done()}, true
	}
	if ev := d.event(trace.KindReset); ev != nil {
		if ev.By == trace.ResetByNetfilter {
			return Result{trace.VerdictRejected, d.withRule(d.openedBy("rejected: ", " was refused with a TCP reset by a REJECT --reject-with tcp-reset rule"))}, true
		}
		return Result{trace.VerdictReset, d.stackReset(ev.Reason)}, true
	}
	if ev := d.event(trace.KindDrop); ev != nil {
		if r := d.f.Rule; r != nil && (strings.Contains(r.Text, "-j REJECT") || r.NFTables() && strings.Contains(r.Text, "reject")) {
			// REJECT drops the packet after answering it; the answer itself
			// was not seen (a bridged packet's reset goes straight out).
			return Result{trace.VerdictRejected, d.withRule(d.openedBy("rejected: ", " was refused by a REJECT rule, which dropped the packet"))}, true
		}
		p := d.openedBy("dropped: a packet of ", " was dropped, reason ")
		p.b = append(p.b, orDefault(ev.Reason, "unknown (this kernel gives none)")...)
		// Whoever checks conntrack next may find nothing: say why.
		return Result{trace.VerdictDropped, d.withRule(p, d.appendUnconfirmed)}, true
	}
	return Result{}, false
}

// openedBy opens an explanation with a sentence that says, between lead
// and then, what the client addressed and from where; the sentence is
// left open.
func (d *diagnosis) openedBy(lead, then string) *prose {
	p := newProse()
	p.begin()
	p.b = d.appendTarget(append(p.b, lead...))
	p.b = append(append(append(p.b, " from "...), d.f.Orig.Src...), then...)
	return p
}

// withRule closes p's open sentence, adds the rule's evidence and then
// each of more (a sentence each, none when it writes nothing), and returns
// the text.
func (d *diagnosis) withRule(p *prose, more ...func([]byte) []byte) string {
	p.end()
	p.add(d.appendRuleEvidence)
	for _, write := range more {
		p.add(write)
	}
	return p.done()
}

// stackReset explains the TCP stack's reset of the flow, and why from
// the kernel's RST reason: most often nothing listened there.
func (d *diagnosis) stackReset(reason string) string {
	p := newProse()
	p.begin()
	p.b = d.appendTarget(append(p.b, "reset: the TCP stack answered "...))
	p.b = append(append(p.b, " from "...), d.f.Orig.Src...)
	p.b = append(p.b, " with a reset"...)
	if reason == "NO_SOCKET" || reason == "" {
		p.b = d.wentTo().AppendTo(append(p.b, ": no socket listens on "...))
	}
	if reason != "" {
		p.b = append(append(append(p.b, " (kernel reason "...), reason...), ')')
	}
	p.end()
	return p.done()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ok: translated or passed as the Service intends.
func (d *diagnosis) ok() Result {
	p := newProse()
	p.begin()
	switch {
	case d.has(trace.KindIPVS):
		ev := d.event(trace.KindIPVS)
		p.b = d.appendTarget(append(p.b, "ok: IPVS sent "...))
		p.b = append(append(p.b, " from "...), d.f.Orig.Src...)
		p.b = appendPod(append(append(p.b, " to real server "...), ev.To...), d.f.DstPod)
		p.b = append(append(append(p.b, " ("...), orDefault(ev.Forward, "masq")...), ')')
	case d.has(trace.KindDNAT):
		p.b = d.appendTarget(append(p.b, "ok: "...))
		p.b = append(append(p.b, " from "...), d.f.Orig.Src...)
		p.b = append(p.b, " was DNAT'd to "...)
		p.b = appendPod(d.wentTo().AppendTo(p.b), d.f.DstPod)
		if d.isPortmapRule() {
			p.end()
			p.begin()
			p.b = append(p.b, "a hostPort used as intended: nothing else owns that address and port"...)
		}
	case d.has(trace.KindSNAT):
		ev := d.event(trace.KindSNAT)
		p.b = append(append(p.b, "ok: "...), d.f.Orig.Src...)
		p.b = d.appendTarget(append(p.b, " to "...))
		p.b = append(append(p.b, " leaves with source "...), ev.To...)
		p.b = append(p.b, " (SNAT/MASQUERADE)"...)
	default:
		p.b = append(append(p.b, "ok: "...), d.f.Orig.Src...)
		p.b = d.appendTarget(append(p.b, " to "...))
		p.b = append(p.b, " passed untranslated"...)
	}
	p.end()
	p.add(d.appendRuleEvidence)
	p.add(d.appendConntrackEvidence)
	return Result{trace.VerdictOK, p.done()}
}
