package predict

import (
	"net/netip"
	"strings"

	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// ipvs: a connection to a virtual server goes to one of its real servers;
// one without real servers is answered with ICMP port unreachable
// (ip_vs_leave), whatever the protocol.
func (w *walk) ipvs() {
	vs, ok := w.env.IPVSService(w.c.Proto, w.dst)
	if !ok {
		return
	}
	if len(vs.Reals) == 0 {
		ev := w.event(trace.KindIPVSNoDest, "ip_vs_leave")
		ev.Packet, ev.Virtual = w.packet(), vs.Address
		typ, code := portUnreachable(w.fam)
		w.events = append(w.events, ev, w.icmpError("", typ, code))
		w.note("IPVS virtual server %s %s has no real server: ICMP port unreachable (ip_vs_leave)", vs.Proto, vs.Address)
		w.stopped = true
		return
	}
	real, err := netip.ParseAddrPort(vs.Reals[0])
	if err != nil {
		w.doubt("IPVS virtual server %s: real server %q: %v", vs.Address, vs.Reals[0], err)
		w.stopped = true
		return
	}
	ev := w.event(trace.KindIPVS, "ip_vs_conn_new")
	ev.Packet, ev.To, ev.Virtual, ev.Forward = w.packet(), vs.Reals[0], vs.Address, "masq"
	w.events = append(w.events, ev)
	more := ""
	if len(vs.Reals) > 1 {
		more = " (one of " + strings.Join(vs.Reals, ", ") + ", by scheduler " + vs.Scheduler + ")"
	}
	w.note("IPVS virtual server %s %s: to real server %s%s", vs.Proto, vs.Address, real, more)
	w.dst, w.natDone, w.sent = real, true, true
}

func portUnreachable(fam rules.Family) (typ, code uint8) {
	if fam == rules.IPv6 {
		return 1, 4
	}
	return 3, 3
}

// deliverLocally: the packet reached one of the node's own addresses
// untranslated by IPVS. A socket takes it, or the stack answers: a TCP
// reset, or for UDP an ICMP port unreachable.
func (w *walk) deliverLocally() {
	switch w.c.Proto {
	case "icmp", "icmpv6":
		w.note("the node answers the echo request itself")
		return
	}
	if l, ok := w.env.Listener(w.c.Proto, w.dst); ok {
		who := ""
		if l.Process != "" {
			who = " (" + l.Process + ")"
		}
		w.note("delivered to the node's listener on %s %s%s", l.Proto, l.Address, who)
		return
	}
	switch w.c.Proto {
	case "tcp":
		ev := w.event(trace.KindReset, "tcp_send_reset")
		ev.By, ev.Reason, ev.Packet = trace.ResetByStack, "NO_SOCKET", w.packet()
		w.events = append(w.events, ev)
		w.note("no socket listens on tcp %s: the node's TCP stack answers with a reset", w.dst)
	case "udp":
		typ, code := portUnreachable(w.fam)
		w.events = append(w.events, w.icmpError("", typ, code))
		w.note("no socket listens on udp %s: the node answers ICMP port unreachable", w.dst)
	}
}

// replyPath: a connection from outside the cluster sent to a pod on
// another node without source NAT is answered by that pod straight to the
// client, from the pod's address: the client has no connection to it and
// resets or drops the answer (seed 004, externalTrafficPolicy=Local). The
// walk knows the node's rules, not the network: it assumes, as on a
// shared network, that the other node reaches the client without this
// one.
func (w *walk) replyPath() {
	if !w.natDone || w.snat != "" || w.c.Proto != "tcp" || w.srcLocal {
		return
	}
	if _, ok := w.env.PodByIP(w.src.Addr(), w.at); ok {
		return // a pod's answers route back through the cluster's network
	}
	pod, ok := w.env.PodByIP(w.dst.Addr(), w.at)
	if !ok {
		return
	}
	other := w.env.PodNode(pod)
	if other == "" || other == w.env.NodeName() {
		return
	}
	w.replyBypasses = true
	w.note("no source NAT: pod %s on node %s answers %s directly, not through this node", pod.Key(), other, w.src.Addr())
	w.doubt("the answer's way back is another node's routing: the walk assumes node %s reaches %s without this node, as on a shared network", other, w.src.Addr())
}
