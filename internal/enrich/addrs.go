package enrich

import (
	"net/netip"

	"github.com/tracer-dev/tracer/internal/diagnose"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// flowAddrs is what enrichment reads of a flow's addresses, as netip
// values. The enricher makes it from the typed events and tuples the join
// hands over (joinedAddrs), so a live flow's text is never parsed back; a recorded
// flow's is read once from its text (recordedAddrs). Both read the events
// in time order.
type flowAddrs struct {
	diagnose.Addrs
	src netip.AddrPort
	// decided is the index in the flow's events of the one whose rule the
	// flow is about (decidingEvent), -1 when none, and kind its action.
	decided int
	kind    rules.ActionKind
	// pktSrc and pktDst are the packet the deciding hook saw: the original
	// tuple for NAT, the packet itself for REJECT, reset and drop. to is
	// the deciding event's translation: its first address and port.
	pktSrc, pktDst, to netip.AddrPort
	// dnatTo is the first DNAT's target, whose pod owns the DNAT rule.
	dnatTo netip.AddrPort
}

// recordedAddrs reads a recorded flow's addresses from its text; f's
// events are in time order.
func recordedAddrs(f *trace.Flow) flowAddrs {
	a := flowAddrs{Addrs: diagnose.AddrsOf(f), src: trace.ParseEndpoint(f.Orig.Src)}
	a.decide(f, func(i int) (src, dst netip.AddrPort, ok bool) {
		p := f.Events[i].Packet
		if p == nil {
			return src, dst, false
		}
		return trace.ParseEndpoint(p.Src), trace.ParseEndpoint(p.Dst), true
	}, func(i int) netip.AddrPort {
		r, ok := parseRange(f.Events[i].To)
		if !ok {
			return netip.AddrPort{}
		}
		return netip.AddrPortFrom(r.MinAddr, r.MinPort)
	})
	return a
}

// joinedAddrs is recordedAddrs of a joined flow, read from the typed
// values it was made of instead of its record's text.
func joinedAddrs(jf *join.Flow) flowAddrs {
	f, evs := jf.Record, jf.Events
	src, dst := endpoints(jf.Orig)
	a := flowAddrs{Addrs: diagnose.Addrs{Dst: dst, Went: dst}, src: src}
	if jf.HasReply {
		a.Went, _ = endpoints(jf.Reply)
	}
	a.decide(f, func(i int) (src, dst netip.AddrPort, ok bool) {
		if !evs[i].Packet.Valid() {
			return src, dst, false
		}
		src, dst = endpoints(evs[i].Packet)
		return src, dst, true
	}, func(i int) netip.AddrPort { return rangeStart(&evs[i]) })
	return a
}

// decide fills in what the deciding event and the first DNAT say, with
// packet and to reading event i's packet and translation target.
func (a *flowAddrs) decide(f *trace.Flow, packet func(i int) (src, dst netip.AddrPort, ok bool), to func(i int) netip.AddrPort) {
	a.decided, a.kind = decidingEvent(f)
	if a.decided >= 0 {
		a.pktSrc, a.pktDst = a.src, a.Dst
		if seesPacket(a.kind) {
			if src, dst, ok := packet(a.decided); ok {
				a.pktSrc, a.pktDst = src, dst
			}
		}
		a.to = to(a.decided)
	}
	for i := range f.Events {
		if f.Events[i].Kind == trace.KindDNAT {
			if a.dnatTo = to(i); a.dnatTo.IsValid() {
				break
			}
		}
	}
}

// seesPacket: the hook of a REJECT, reset or drop decided on the packet
// itself, after any DNAT.
func seesPacket(kind rules.ActionKind) bool {
	return kind == rules.ActionReject || kind == rules.ActionReset || kind == rules.ActionDrop
}

// endpoints are t's two ends as its trace text reads: ICMP's without
// ports, an invalid address as the zero AddrPort.
func endpoints(t event.Tuple) (src, dst netip.AddrPort) {
	icmp := t.Proto == 1 || t.Proto == 58
	end := func(a netip.Addr, port uint16) netip.AddrPort {
		if !a.IsValid() {
			return netip.AddrPort{}
		}
		if icmp {
			port = 0
		}
		return netip.AddrPortFrom(a, port)
	}
	return end(t.Src, t.SrcPort), end(t.Dst, t.DstPort)
}

// rangeStart is the first address and port of ev's translation, as its
// trace text reads: only NAT and IPVS events have one.
func rangeStart(ev *event.Event) netip.AddrPort {
	switch ev.Kind {
	case event.KindDNAT, event.KindSNAT, event.KindIPVS:
	default:
		return netip.AddrPort{}
	}
	if !ev.To.MinAddr.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ev.To.MinAddr, ev.To.MinPort)
}
