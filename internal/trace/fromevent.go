package trace

import (
	"net/netip"

	"github.com/tracer-dev/tracer/internal/event"
)

// EventOf is a kernel decision in the trace format: the encoder at the
// pipeline's edge (the writer, the UI, raw event lines), where the
// decision's typed fields become text.
func EventOf(e event.Event, names event.ReasonNamer) Event {
	r := Event{
		Kind:  e.Kind.String(),
		Time:  e.Time,
		Hook:  e.Hook.String(),
		Via:   e.Via.String(),
		Netns: e.Netns,
	}
	main := e.Packet
	if !main.Valid() {
		main = e.Orig
	}
	r.Proto = event.ProtoName(main.Proto)
	if e.Packet.Valid() {
		r.Packet = TupleOf(e.Packet)
	}
	if e.Orig.Valid() {
		r.Orig = TupleOf(e.Orig)
	}
	if e.Reply.Valid() {
		r.Reply = TupleOf(e.Reply)
	}
	if e.NFHook != event.NFHookNone {
		r.NFHook = event.NFHookName(e.NFHook)
	}
	switch e.Kind {
	case event.KindDNAT, event.KindSNAT:
		r.To = e.To.String()
		r.CTStatus = event.CTStatusNames(e.CTStatus)
		r.CTMark = e.CTMark
		r.CTZone = e.CTZone
	case event.KindIPVS:
		r.To = endpoint(e.To.MinAddr, e.To.MinPort)
		r.Virtual = endpoint(e.Orig.Dst, e.Orig.DstPort)
		r.Forward = event.IPVSForward(e.Reason)
	case event.KindIPVSNoDest:
		r.Virtual = endpoint(e.Orig.Dst, e.Orig.DstPort)
	case event.KindReject:
		t, c := e.ICMPType, e.ICMPCode
		r.ICMPType, r.ICMPCode = &t, &c
		// The hook says the family of a packet that could not be read.
		r.Reason = event.ICMPName(e.Hook != event.HookICMP6Send, t, c)
	case event.KindReset:
		r.By = ResetByStack
		if e.Hook == event.HookNFSendReset || e.Hook == event.HookNFSendReset6 {
			r.By = ResetByNetfilter
		} else if e.HasReason && names != nil {
			r.Reason = names.ResetReason(e.Reason)
		}
	case event.KindDrop:
		if e.HasReason && names != nil {
			r.Reason = names.DropReason(e.Reason)
		}
		r.NoConntrack = e.NoCT
	}
	return r
}

// TupleOf is the tuple in the trace format: "IP:PORT" endpoints, bare
// IPs for ICMP.
func TupleOf(t event.Tuple) *Tuple {
	if t.Proto == 1 || t.Proto == 58 {
		// ICMP has no ports: conntrack keys it by echo id.
		return &Tuple{Src: t.Src.String(), Dst: t.Dst.String()}
	}
	return &Tuple{Src: endpoint(t.Src, t.SrcPort), Dst: endpoint(t.Dst, t.DstPort)}
}

func endpoint(a netip.Addr, port uint16) string {
	if !a.IsValid() {
		return ""
	}
	return netip.AddrPortFrom(a, port).String()
}
