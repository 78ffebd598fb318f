package event

import (
	"fmt"
	"net/netip"

	"github.com/tracer-dev/tracer/internal/trace"
)

// ReasonNamer names a drop or RST reason number for this kernel (the
// numbers differ between kernels; the loader reads the names from BTF).
type ReasonNamer interface {
	DropReason(uint32) string
	ResetReason(uint32) string
}

// Record is the event in the trace format.
func (e Event) Record(names ReasonNamer) trace.Event {
	r := trace.Event{
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
	r.Proto = ProtoName(main.Proto)
	if e.Packet.Valid() {
		r.Packet = tupleRecord(e.Packet)
	}
	if e.Orig.Valid() {
		r.Orig = tupleRecord(e.Orig)
	}
	if e.Reply.Valid() {
		r.Reply = tupleRecord(e.Reply)
	}
	if e.NFHook != NFHookNone {
		r.NFHook = NFHookName(e.NFHook)
	}
	switch e.Kind {
	case KindDNAT, KindSNAT:
		r.To = e.To.String()
		r.CTStatus = CTStatusNames(e.CTStatus)
		r.CTMark = e.CTMark
		r.CTZone = e.CTZone
	case KindIPVS:
		r.To = endpoint(e.To.MinAddr, e.To.MinPort)
		r.Virtual = endpoint(e.Orig.Dst, e.Orig.DstPort)
		r.Forward = IPVSForward(e.Reason)
	case KindIPVSNoDest:
		r.Virtual = endpoint(e.Orig.Dst, e.Orig.DstPort)
	case KindReject:
		t, c := e.ICMPType, e.ICMPCode
		r.ICMPType, r.ICMPCode = &t, &c
		r.Reason = ICMPName(e.Packet.Src.Is4() || !e.Packet.Valid(), t, c)
	case KindReset:
		r.By = trace.ResetByStack
		if e.Hook == HookNFSendReset {
			r.By = trace.ResetByNetfilter
		} else if e.HasReason && names != nil {
			r.Reason = names.ResetReason(e.Reason)
		}
	case KindDrop:
		if e.HasReason && names != nil {
			r.Reason = names.DropReason(e.Reason)
		}
	}
	return r
}

// TupleRecord is the tuple in the trace format: "IP:PORT" endpoints, bare
// IPs for ICMP.
func TupleRecord(t Tuple) *trace.Tuple { return tupleRecord(t) }

func tupleRecord(t Tuple) *trace.Tuple {
	if t.Proto == 1 || t.Proto == 58 {
		// ICMP has no ports: conntrack keys it by echo id.
		return &trace.Tuple{Src: t.Src.String(), Dst: t.Dst.String()}
	}
	return &trace.Tuple{Src: endpoint(t.Src, t.SrcPort), Dst: endpoint(t.Dst, t.DstPort)}
}

func endpoint(a netip.Addr, port uint16) string {
	if !a.IsValid() {
		return ""
	}
	return netip.AddrPortFrom(a, port).String()
}

// String renders the range as IP[-IP][:PORT[-PORT]].
func (r Range) String() string {
	if !r.MinAddr.IsValid() {
		return ""
	}
	s := r.MinAddr.String()
	if r.MaxAddr.IsValid() && r.MaxAddr != r.MinAddr {
		s += "-" + r.MaxAddr.String()
	}
	if r.MinAddr.Is6() {
		s = "[" + s + "]"
	}
	if r.MinPort != 0 {
		s += fmt.Sprintf(":%d", r.MinPort)
		if r.MaxPort != r.MinPort {
			s += fmt.Sprintf("-%d", r.MaxPort)
		}
	}
	return s
}

// ICMPName names common ICMP error type/code pairs as REJECT spells them.
func ICMPName(v4 bool, typ, code uint8) string {
	if v4 && typ == 3 {
		switch code {
		case 0:
			return "icmp-net-unreachable"
		case 1:
			return "icmp-host-unreachable"
		case 2:
			return "icmp-proto-unreachable"
		case 3:
			return "icmp-port-unreachable"
		case 4:
			return "icmp-frag-needed"
		case 9:
			return "icmp-net-prohibited"
		case 10:
			return "icmp-host-prohibited"
		case 13:
			return "icmp-admin-prohibited"
		}
	}
	if v4 && typ == 11 {
		return "icmp-time-exceeded"
	}
	return fmt.Sprintf("icmp type %d code %d", typ, code)
}
