package trace

import (
	"encoding/binary"
	"net/netip"

	"github.com/tracer-dev/tracer/internal/event"
)

// EventOf is a kernel decision in the trace format: the encoder at the
// pipeline's edge (the writer, the UI, raw event lines), where the
// decision's typed fields become text.
func EventOf(e event.Event, names event.ReasonNamer) Event {
	return (*Encoder)(nil).Event(e, names)
}

// TupleOf is the tuple in the trace format: "IP:PORT" endpoints, bare
// IPs for ICMP.
func TupleOf(t event.Tuple) *Tuple { return (*Encoder)(nil).Tuple(t) }

// Encoder is EventOf and TupleOf reusing the text of the endpoints it
// wrote last: a flow names its client's endpoint in most of its tuples,
// and a node's flows name the same Services and pods over and over, so
// most endpoints are written once instead of once a tuple. A nil Encoder
// writes every endpoint afresh. Not safe for concurrent use.
type Encoder struct {
	recent [1 << encoderBits]encodedEndpoint
	// texts holds the endpoints' text: a flow's client endpoint is new
	// text for nearly every flow.
	texts Arena
}

// maxEndpointText is the longest endpoint text: an IPv6 address with a
// zone in brackets, and a port.
const maxEndpointText = len("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255%") + 16 + len("]:65535")

const encoderBits = 8

// encodedEndpoint is ap's text; bare: its address alone, as an ICMP
// tuple, which has no ports, writes it.
type encodedEndpoint struct {
	ap   netip.AddrPort
	bare bool
	s    string
}

// Event is EventOf.
func (enc *Encoder) Event(e event.Event, names event.ReasonNamer) Event {
	return enc.EventIn(e, names, nil)
}

// EventIn is Event whose tuples are kept in tuples, storage the caller
// allocated with the event (nil: Event allocates it when there are any).
func (enc *Encoder) EventIn(e event.Event, names event.ReasonNamer, tuples *[3]Tuple) Event {
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
	// The event's tuples share one allocation: a NAT decision has two, an
	// answered packet's up to three.
	tuple := func(t event.Tuple, i int) *Tuple {
		if tuples == nil {
			tuples = new([3]Tuple)
		}
		tuples[i] = enc.tuple(t)
		return &tuples[i]
	}
	if e.Packet.Valid() {
		r.Packet = tuple(e.Packet, 0)
	}
	if e.Orig.Valid() {
		r.Orig = tuple(e.Orig, 1)
	}
	if e.Reply.Valid() {
		r.Reply = tuple(e.Reply, 2)
	}
	if e.NFHook != event.NFHookNone {
		r.NFHook = event.NFHookName(e.NFHook)
	}
	switch e.Kind {
	case event.KindDNAT, event.KindSNAT:
		r.To = enc.natRange(e.To)
		r.CTStatus = event.CTStatusNames(e.CTStatus)
		r.CTMark = e.CTMark
		r.CTZone = e.CTZone
	case event.KindIPVS:
		r.To = enc.endpoint(e.To.MinAddr, e.To.MinPort)
		r.Virtual = enc.endpoint(e.Orig.Dst, e.Orig.DstPort)
		r.Forward = event.IPVSForward(e.Reason)
	case event.KindIPVSNoDest:
		r.Virtual = enc.endpoint(e.Orig.Dst, e.Orig.DstPort)
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

// Tuple is TupleOf. It inlines, so a caller that copies the result
// (a flow's Orig) keeps it off the heap.
func (enc *Encoder) Tuple(t event.Tuple) *Tuple {
	v := enc.tuple(t)
	return &v
}

func (enc *Encoder) tuple(t event.Tuple) Tuple {
	if t.Proto == 1 || t.Proto == 58 {
		// ICMP has no ports: conntrack keys it by echo id.
		return Tuple{Src: enc.addr(t.Src), Dst: enc.addr(t.Dst)}
	}
	return Tuple{Src: enc.endpoint(t.Src, t.SrcPort), Dst: enc.endpoint(t.Dst, t.DstPort)}
}

func (enc *Encoder) endpoint(a netip.Addr, port uint16) string {
	if !a.IsValid() {
		return ""
	}
	return enc.text(netip.AddrPortFrom(a, port), false)
}

// addr is an ICMP tuple's address.
func (enc *Encoder) addr(a netip.Addr) string {
	if !a.IsValid() {
		return a.String()
	}
	return enc.text(netip.AddrPortFrom(a, 0), true)
}

// text writes ap, or bare its address alone, reusing the text its slot
// holds when that is ap's.
func (enc *Encoder) text(ap netip.AddrPort, bare bool) string {
	if enc == nil {
		if bare {
			return ap.Addr().String()
		}
		return ap.String()
	}
	slot := &enc.recent[endpointSlot(ap)]
	if slot.s == "" || slot.ap != ap || slot.bare != bare {
		s := enc.texts.Append(maxEndpointText, func(b []byte) []byte {
			if bare {
				return ap.Addr().AppendTo(b)
			}
			return ap.AppendTo(b)
		})
		*slot = encodedEndpoint{ap: ap, bare: bare, s: s}
	}
	return slot.s
}

// natRange is r as Range.String writes it; a NAT to one address and port,
// as Services' DNATs are, reads as that endpoint does.
func (enc *Encoder) natRange(r event.Range) string {
	single := r.MinPort != 0 && r.MaxPort == r.MinPort && (!r.MaxAddr.IsValid() || r.MaxAddr == r.MinAddr)
	switch {
	case enc == nil:
		return r.String()
	case single:
		return enc.endpoint(r.MinAddr, r.MinPort)
	}
	return enc.texts.Append(2*maxEndpointText, r.AppendTo)
}

// endpointSlot mixes the address's last 8 bytes (all of an IPv4 one) and
// the port.
func endpointSlot(ap netip.AddrPort) int {
	b := ap.Addr().As16()
	h := binary.LittleEndian.Uint64(b[8:])*0x9e3779b97f4a7c15 ^ uint64(ap.Port())*0xbf58476d1ce4e5b9
	return int(h >> (64 - encoderBits))
}
