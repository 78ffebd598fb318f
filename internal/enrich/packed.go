package enrich

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
)

// A busy node keeps hundreds of thousands of flows open in the joiner, so
// an open flow keeps its tuples and events packed: no netip.Addr or
// time.Location pointers (the collector does not scan them) and an IPv4
// event in about 55 bytes instead of event.Event's 280. Packing is exact:
// an event that would not read back as it was is kept whole instead.

// ptuple is a packed event.Tuple: 40 bytes instead of 56. Tuples from the
// kernel carry no IPv6 zone, which is the one thing it does not keep.
type ptuple struct {
	src, dst     [16]byte
	sport, dport uint16
	proto        uint8
	// fams is the source's family in the low 4 bits and the
	// destination's in the high ones: 0 none, 4, 6.
	fams uint8
}

func famOf(a netip.Addr) uint8 {
	switch {
	case a.Is4():
		return 4
	case a.IsValid():
		return 6
	}
	return 0
}

func addrOf(b [16]byte, fam uint8) netip.Addr {
	switch fam {
	case 4:
		return netip.AddrFrom4([4]byte(b[12:]))
	case 6:
		return netip.AddrFrom16(b)
	}
	return netip.Addr{}
}

func packTuple(t event.Tuple) ptuple {
	return ptuple{src: t.Src.As16(), dst: t.Dst.As16(), sport: t.SrcPort, dport: t.DstPort, proto: t.Proto,
		fams: famOf(t.Src) | famOf(t.Dst)<<4}
}

func (t ptuple) tuple() event.Tuple {
	return event.Tuple{Src: addrOf(t.src, t.fams&0xf), Dst: addrOf(t.dst, t.fams>>4), SrcPort: t.sport, DstPort: t.dport, Proto: t.proto}
}

func (t ptuple) valid() bool { return t.fams&0xf != 0 }

func (t ptuple) reverse() ptuple {
	return ptuple{src: t.dst, dst: t.src, sport: t.dport, dport: t.sport, proto: t.proto, fams: t.fams>>4 | t.fams<<4}
}

// The packed form of one event: a header, the time, the numbers as
// varints, then each tuple behind a tag.
const (
	packedHeader = 8 // kind, hook, via, nfhook, ctinfo, icmp type, icmp code, flags

	flagHasReason = 1 << 0
	flagNoCT      = 1 << 1
	flagTimeZero  = 1 << 2
	// flagWhole: the event did not pack exactly; a varint follows, its
	// index in the flow's whole events.
	flagWhole = 1 << 3

	tagZero = 0 // event.Tuple{}
	tagKey  = 1 // the flow's key
	tagV4   = 2 // two IPv4 addresses: 4 + 4 + ports + proto
	tagAny  = 3 // fams, 16 + 16, ports, proto
)

// eventPacker packs events against one time base: times are kept as
// nanoseconds from it.
type eventPacker struct {
	base time.Time
	set  bool
}

// appendEvent packs ev onto b, the tuples equal to key as a tag. ok is
// false when ev would not read back exactly (b is then unchanged).
func (ep *eventPacker) appendEvent(b []byte, ev event.Event, key ptuple) ([]byte, bool) {
	if !ep.set && !ev.Time.IsZero() {
		ep.base, ep.set = ev.Time, true
	}
	start := len(b)
	var flags byte
	if ev.HasReason {
		flags |= flagHasReason
	}
	if ev.NoCT {
		flags |= flagNoCT
	}
	if ev.Time.IsZero() {
		flags |= flagTimeZero
	}
	b = append(b, byte(ev.Kind), byte(ev.Hook), byte(ev.Via), ev.NFHook, ev.CTInfo, ev.ICMPType, ev.ICMPCode, flags)
	if !ev.Time.IsZero() {
		b = binary.AppendVarint(b, int64(ev.Time.Sub(ep.base)))
	}
	for _, n := range [...]uint32{ev.Netns, ev.CTStatus, ev.CTMark, ev.Reason, ev.To.Flags, uint32(ev.CTZone)} {
		b = binary.AppendUvarint(b, uint64(n))
	}
	b = appendTuple(b, ev.Packet, key)
	b = appendTuple(b, ev.Orig, key)
	b = appendTuple(b, ev.Reply, key)
	b = appendTuple(b, event.Tuple{Src: ev.To.MinAddr, Dst: ev.To.MaxAddr, SrcPort: ev.To.MinPort, DstPort: ev.To.MaxPort}, key)
	if got, rest, ok := ep.readEvent(b[start:], key); !ok || len(rest) != 0 || got != ev {
		return b[:start], false
	}
	return b, true
}

// appendWhole marks an event kept whole, at index i of the flow's whole
// events.
func appendWhole(b []byte, i int) []byte {
	b = append(b, 0, 0, 0, 0, 0, 0, 0, flagWhole)
	return binary.AppendUvarint(b, uint64(i))
}

func appendTuple(b []byte, t event.Tuple, key ptuple) []byte {
	switch {
	case t == event.Tuple{}:
		return append(b, tagZero)
	case packTuple(t) == key:
		return append(b, tagKey)
	case t.Src.Is4() && t.Dst.Is4():
		s, d := t.Src.As4(), t.Dst.As4()
		b = append(b, tagV4)
		b = append(b, s[:]...)
		b = append(b, d[:]...)
	default:
		p := packTuple(t)
		b = append(b, tagAny, p.fams)
		b = append(b, p.src[:]...)
		b = append(b, p.dst[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, t.SrcPort)
	b = binary.BigEndian.AppendUint16(b, t.DstPort)
	return append(b, t.Proto)
}

// readEvent reads one packed event from b. A whole event's record reads
// as an event of kind 0 with its index in Reason; ok is false when b is
// not a packed event.
func (ep *eventPacker) readEvent(b []byte, key ptuple) (ev event.Event, rest []byte, ok bool) {
	if len(b) < packedHeader {
		return ev, nil, false
	}
	ev.Kind, ev.Hook, ev.Via = event.Kind(b[0]), event.Hook(b[1]), event.Via(b[2])
	ev.NFHook, ev.CTInfo, ev.ICMPType, ev.ICMPCode = b[3], b[4], b[5], b[6]
	flags := b[7]
	b = b[packedHeader:]
	if flags&flagWhole != 0 {
		i, n := binary.Uvarint(b)
		if n <= 0 {
			return ev, nil, false
		}
		ev.Reason = uint32(i)
		return ev, b[n:], true
	}
	ev.HasReason, ev.NoCT = flags&flagHasReason != 0, flags&flagNoCT != 0
	if flags&flagTimeZero == 0 {
		d, n := binary.Varint(b)
		if n <= 0 {
			return ev, nil, false
		}
		ev.Time, b = ep.base.Add(time.Duration(d)), b[n:]
	}
	var nums [6]uint32
	for i := range nums {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > 1<<32-1 {
			return ev, nil, false
		}
		nums[i], b = uint32(v), b[n:]
	}
	ev.Netns, ev.CTStatus, ev.CTMark, ev.Reason, ev.To.Flags, ev.CTZone = nums[0], nums[1], nums[2], nums[3], nums[4], uint16(nums[5])
	var to event.Tuple
	for _, t := range []*event.Tuple{&ev.Packet, &ev.Orig, &ev.Reply, &to} {
		if b, ok = readTuple(b, t, key); !ok {
			return ev, nil, false
		}
	}
	ev.To.MinAddr, ev.To.MaxAddr, ev.To.MinPort, ev.To.MaxPort = to.Src, to.Dst, to.SrcPort, to.DstPort
	return ev, b, true
}

func readTuple(b []byte, t *event.Tuple, key ptuple) ([]byte, bool) {
	if len(b) < 1 {
		return nil, false
	}
	tag := b[0]
	b = b[1:]
	switch tag {
	case tagZero:
		*t = event.Tuple{}
		return b, true
	case tagKey:
		*t = key.tuple()
		return b, true
	case tagV4:
		if len(b) < 8 {
			return nil, false
		}
		t.Src, t.Dst = netip.AddrFrom4([4]byte(b[:4])), netip.AddrFrom4([4]byte(b[4:8]))
		b = b[8:]
	case tagAny:
		if len(b) < 33 {
			return nil, false
		}
		fams := b[0]
		t.Src, t.Dst = addrOf([16]byte(b[1:17]), fams&0xf), addrOf([16]byte(b[17:33]), fams>>4)
		b = b[33:]
	default:
		return nil, false
	}
	if len(b) < 5 {
		return nil, false
	}
	t.SrcPort, t.DstPort, t.Proto = binary.BigEndian.Uint16(b), binary.BigEndian.Uint16(b[2:]), b[4]
	return b[5:], true
}
