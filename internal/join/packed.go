package join

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
)

// A busy node keeps hundreds of thousands of flows open in the joiner, so
// an open flow keeps its tuples and events packed in bytes: no netip.Addr
// or time.Location pointers, an IPv4 key or reply in 13 bytes and an IPv4
// NAT decision in about 31 instead of event.Event's 280, so that the usual
// IPv4 flows (a DNAT and its SNAT, a reject and its drop) fit a 112-byte
// pending. Packing is exact: an event that would not read back as it was
// is kept whole instead.

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

// The packed form of one event: kind, hook, via, a mask of what follows,
// then only the fields that are set (a namespace as its index among the
// joiner's first namespaces), the time, and each tuple behind a tag.
const (
	packedHeader = 5 // kind, hook, via, mask (2 bytes)

	// Flags of the event itself.
	flagHasReason = 1 << 0
	flagNoCT      = 1 << 1
	flagTimeZero  = 1 << 2
	// flagWhole: the event did not pack exactly; a varint follows, its
	// index in the flow's whole events, and nothing else.
	flagWhole = 1 << 3
	// Fields that follow, in this order, when set.
	hasNFHook   = 1 << 4 // one byte
	hasCTInfo   = 1 << 5 // one byte
	hasICMP     = 1 << 6 // type and code
	hasNetnsIdx = 1 << 7 // one byte: an index in eventPacker.netns
	hasNetns    = 1 << 8 // the rest: uvarints
	hasCTStatus = 1 << 9
	hasCTMark   = 1 << 10
	hasReason   = 1 << 11
	hasFlags    = 1 << 12
	hasCTZone   = 1 << 13

	tagZero  = 0 // event.Tuple{}
	tagKey   = 1 // the flow's key
	tagV4    = 2 // two IPv4 addresses: 4 + 4 + ports + proto
	tagAny   = 3 // fams, 16 + 16, ports, proto
	tagReply = 4 // a byte follows: which of the flow's replies, oldest 0
	// tagV4One: one IPv4 address and port, both ends of a NAT range.
	tagV4One = 5
)

// maxNetns is how many namespaces the packer numbers; events of others
// carry theirs in full.
const maxNetns = 64

// flowContext is what a flow's events are packed against: its key, its
// reply, the replies it had before, oldest first, and its events kept
// whole (both only ever added to, so an index into them stays good).
type flowContext struct {
	key, reply ptuple
	old        []ptuple
	whole      []event.Event
}

// replyAt is the flow's reply number i, oldest 0.
func (c flowContext) replyAt(i int) (ptuple, bool) {
	switch {
	case i < len(c.old):
		return c.old[i], true
	case i == len(c.old) && c.reply.valid():
		return c.reply, true
	}
	return ptuple{}, false
}

// eventPacker packs events against one time base, the first event's
// time (times are kept as nanoseconds from it), and numbers the
// namespaces it sees.
type eventPacker struct {
	base  time.Time
	netns []uint32
}

// netnsIndex numbers ns, ok false once maxNetns are numbered.
func (ep *eventPacker) netnsIndex(ns uint32) (byte, bool) {
	for i, n := range ep.netns {
		if n == ns {
			return byte(i), true
		}
	}
	if len(ep.netns) == maxNetns {
		return 0, false
	}
	ep.netns = append(ep.netns, ns)
	return byte(len(ep.netns) - 1), true
}

// appendEvent packs ev onto b, the tuples equal to the flow's key or
// latest reply as a tag. ok is false when ev would not read back exactly
// (b is then unchanged).
func (ep *eventPacker) appendEvent(b []byte, ev event.Event, c flowContext) ([]byte, bool) {
	if ep.base.IsZero() {
		ep.base = ev.Time
	}
	if !ep.packsExactly(ev) {
		return b, false
	}
	var mask uint16
	set := func(bit uint16, on bool) {
		if on {
			mask |= bit
		}
	}
	set(flagHasReason, ev.HasReason)
	set(flagNoCT, ev.NoCT)
	set(flagTimeZero, ev.Time.IsZero())
	set(hasNFHook, ev.NFHook != 0)
	set(hasCTInfo, ev.CTInfo != 0)
	set(hasICMP, ev.ICMPType != 0 || ev.ICMPCode != 0)
	var nsIdx byte
	if ev.Netns != 0 {
		var interned bool
		nsIdx, interned = ep.netnsIndex(ev.Netns)
		set(hasNetnsIdx, interned)
		set(hasNetns, !interned)
	}
	set(hasCTStatus, ev.CTStatus != 0)
	set(hasCTMark, ev.CTMark != 0)
	set(hasReason, ev.Reason != 0)
	set(hasFlags, ev.To.Flags != 0)
	set(hasCTZone, ev.CTZone != 0)
	b = append(b, byte(ev.Kind), byte(ev.Hook), byte(ev.Via))
	b = binary.LittleEndian.AppendUint16(b, mask)
	if mask&hasNFHook != 0 {
		b = append(b, ev.NFHook)
	}
	if mask&hasCTInfo != 0 {
		b = append(b, ev.CTInfo)
	}
	if mask&hasICMP != 0 {
		b = append(b, ev.ICMPType, ev.ICMPCode)
	}
	if mask&hasNetnsIdx != 0 {
		b = append(b, nsIdx)
	}
	for _, f := range [...]struct {
		bit uint16
		v   uint32
	}{{hasNetns, ev.Netns}, {hasCTStatus, ev.CTStatus}, {hasCTMark, ev.CTMark}, {hasReason, ev.Reason}, {hasFlags, ev.To.Flags}, {hasCTZone, uint32(ev.CTZone)}} {
		if mask&f.bit != 0 {
			b = binary.AppendUvarint(b, uint64(f.v))
		}
	}
	if !ev.Time.IsZero() {
		b = binary.AppendVarint(b, int64(ev.Time.Sub(ep.base)))
	}
	b = appendTuple(b, ev.Packet, c)
	b = appendTuple(b, ev.Orig, c)
	b = appendTuple(b, ev.Reply, c)
	return appendTuple(b, event.Tuple{Src: ev.To.MinAddr, Dst: ev.To.MaxAddr, SrcPort: ev.To.MinPort, DstPort: ev.To.MaxPort}, c), true
}

// packsExactly reports whether ev reads back from its packed form as it
// is. The form keeps every field whole but two: an address's zone (the
// kernel reports none), and the time, kept as a distance from the base,
// which gives back neither a distance beyond a Duration's range nor what
// the base's Add cannot (another location, another monotonic reading).
// FuzzPackedEvent reads back what this lets through.
func (ep *eventPacker) packsExactly(ev event.Event) bool {
	if ev.Time.IsZero() {
		if ev.Time != (time.Time{}) {
			return false
		}
	} else if ep.base.Add(ev.Time.Sub(ep.base)) != ev.Time {
		return false
	}
	for _, a := range [...]netip.Addr{ev.Packet.Src, ev.Packet.Dst, ev.Orig.Src, ev.Orig.Dst, ev.Reply.Src, ev.Reply.Dst, ev.To.MinAddr, ev.To.MaxAddr} {
		if a.Zone() != "" {
			return false
		}
	}
	return true
}

// appendWhole marks an event kept whole, at index i of the flow's whole
// events.
func appendWhole(b []byte, i int) []byte {
	b = append(b, 0, 0, 0)
	b = binary.LittleEndian.AppendUint16(b, flagWhole)
	return binary.AppendUvarint(b, uint64(i))
}

func appendTuple(b []byte, t event.Tuple, c flowContext) []byte {
	if t == (event.Tuple{}) {
		return append(b, tagZero)
	}
	pt := packTuple(t)
	switch {
	case pt == c.key:
		return append(b, tagKey)
	case t.Src == t.Dst && t.SrcPort == t.DstPort && t.Proto == 0 && t.Src.Is4():
		a := t.Src.As4()
		b = append(b, tagV4One)
		b = append(b, a[:]...)
		return binary.BigEndian.AppendUint16(b, t.SrcPort)
	case c.reply.valid() && len(c.old) <= 0xff && pt == c.reply:
		return append(b, tagReply, byte(len(c.old)))
	case t.Src.Is4() && t.Dst.Is4():
		s, d := t.Src.As4(), t.Dst.As4()
		b = append(b, tagV4)
		b = append(b, s[:]...)
		b = append(b, d[:]...)
	default:
		b = append(b, tagAny, pt.fams)
		b = append(b, pt.src[:]...)
		b = append(b, pt.dst[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, t.SrcPort)
	b = binary.BigEndian.AppendUint16(b, t.DstPort)
	return append(b, t.Proto)
}

// readEvent reads one packed event from b, or the whole event its record
// refers to; ok is false when b is not a packed event.
func (ep *eventPacker) readEvent(b []byte, c flowContext) (ev event.Event, rest []byte, ok bool) {
	if len(b) < packedHeader {
		return ev, nil, false
	}
	ev.Kind, ev.Hook, ev.Via = event.Kind(b[0]), event.Hook(b[1]), event.Via(b[2])
	mask := binary.LittleEndian.Uint16(b[3:])
	b = b[packedHeader:]
	if mask&flagWhole != 0 {
		i, n := binary.Uvarint(b)
		if n <= 0 || i >= uint64(len(c.whole)) {
			return ev, nil, false
		}
		return c.whole[i], b[n:], true
	}
	ev.HasReason, ev.NoCT = mask&flagHasReason != 0, mask&flagNoCT != 0
	for _, f := range [...]struct {
		bit uint16
		v   *uint8
	}{{hasNFHook, &ev.NFHook}, {hasCTInfo, &ev.CTInfo}, {hasICMP, &ev.ICMPType}, {hasICMP, &ev.ICMPCode}} {
		if mask&f.bit != 0 {
			if len(b) < 1 {
				return ev, nil, false
			}
			*f.v, b = b[0], b[1:]
		}
	}
	if mask&hasNetnsIdx != 0 {
		if len(b) < 1 || int(b[0]) >= len(ep.netns) {
			return ev, nil, false
		}
		ev.Netns, b = ep.netns[b[0]], b[1:]
	}
	var zone uint32
	for _, f := range [...]struct {
		bit uint16
		v   *uint32
	}{{hasNetns, &ev.Netns}, {hasCTStatus, &ev.CTStatus}, {hasCTMark, &ev.CTMark}, {hasReason, &ev.Reason}, {hasFlags, &ev.To.Flags}, {hasCTZone, &zone}} {
		if mask&f.bit != 0 {
			v, n := binary.Uvarint(b)
			if n <= 0 || v > 1<<32-1 {
				return ev, nil, false
			}
			*f.v, b = uint32(v), b[n:]
		}
	}
	if zone > 0xffff {
		return ev, nil, false
	}
	ev.CTZone = uint16(zone)
	if mask&flagTimeZero == 0 {
		d, n := binary.Varint(b)
		if n <= 0 {
			return ev, nil, false
		}
		ev.Time, b = ep.base.Add(time.Duration(d)), b[n:]
	}
	var to event.Tuple
	for _, t := range []*event.Tuple{&ev.Packet, &ev.Orig, &ev.Reply, &to} {
		if b, ok = readTuple(b, t, c); !ok {
			return ev, nil, false
		}
	}
	ev.To.MinAddr, ev.To.MaxAddr, ev.To.MinPort, ev.To.MaxPort = to.Src, to.Dst, to.SrcPort, to.DstPort
	return ev, b, true
}

func readTuple(b []byte, t *event.Tuple, c flowContext) ([]byte, bool) {
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
		*t = c.key.tuple()
		return b, true
	case tagReply:
		if len(b) < 1 {
			return nil, false
		}
		r, ok := c.replyAt(int(b[0]))
		if !ok {
			return nil, false
		}
		*t = r.tuple()
		return b[1:], true
	case tagV4One:
		if len(b) < 6 {
			return nil, false
		}
		t.Src = netip.AddrFrom4([4]byte(b[:4]))
		t.Dst, t.SrcPort, t.DstPort, t.Proto = t.Src, binary.BigEndian.Uint16(b[4:]), binary.BigEndian.Uint16(b[4:]), 0
		return b[6:], true
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

// pendingInline is how many bytes an open flow holds in itself: its key
// and reply, and its events. 88 makes a pending 112 bytes, a size class
// of the allocator, and holds two IPv4 tuples and one NAT decision, or a
// reject and its drop.
const pendingInline = 88

// pending is an open flow: its events become the trace format only when
// it finishes.
//
// It holds what cannot be read again from its events, packed: its key,
// its reply (the joiner indexes it under those and the reply reversed)
// and its events, which hold its NAT decisions and their answer.
type pending struct {
	deadline time.Duration // since the joiner's epoch
	rare     *rarePending
	used     uint8 // bytes of inline in use, unless spilled
	// wide: the key and reply are held as ptuple (38 bytes each) rather
	// than as IPv4 (13 each).
	wide     bool
	hasReply bool
	// replaced is set once a newer connection of the same tuple took the
	// key: this connection's conntrack entry is among the tuple's
	// destroyed ones.
	replaced bool
	// moved: an event came after the flow was queued, so its deadline
	// is later than the one it was queued at (dueQueue).
	moved bool
	// held: the flow was kept open past its linger since its last
	// event, its SYN not yet answered (holdUnanswered).
	held bool
	// inline is the key's slot, the reply's, then the events; once they
	// outgrow it they move to rare.spill.
	inline [pendingInline]byte
}

// rarePending is what few open flows need.
type rarePending struct {
	// oldReplies are replies the flow was indexed under before its latest.
	oldReplies []ptuple
	// whole are the flow's events that did not pack exactly, which its
	// log refers to by index.
	whole []event.Event
	// spill holds the flow's bytes once inline is too small for them.
	spill []byte
}

const (
	slotV4   = 13 // 4 + 4 + ports + proto
	slotWide = 38 // 16 + 16 + ports + proto + fams
)

func isV4(t ptuple) bool { return t.fams == 4|4<<4 }

func newPending(key ptuple) *pending {
	p := &pending{}
	p.start(key)
	return p
}

// start makes p, zero, the state of a new flow keyed by key.
func (p *pending) start(key ptuple) {
	p.wide = !isV4(key)
	n := 2 * p.slot()
	putSlot(p.inline[:n], key, p.wide)
	p.used = uint8(n)
}

func (p *pending) slot() int {
	if p.wide {
		return slotWide
	}
	return slotV4
}

func (p *pending) bytes() []byte {
	if p.rare != nil && p.rare.spill != nil {
		return p.rare.spill
	}
	return p.inline[:p.used]
}

// setBytes makes b, an append to bytes(), the flow's bytes.
func (p *pending) setBytes(b []byte) {
	if len(b) <= len(p.inline) && len(b) > 0 && &b[0] == &p.inline[0] {
		p.used = uint8(len(b))
		return
	}
	p.rareState().spill = b
}

func (p *pending) key() ptuple { return getSlot(p.bytes(), p.wide) }

func (p *pending) reply() ptuple {
	if !p.hasReply {
		return ptuple{}
	}
	return getSlot(p.bytes()[p.slot():], p.wide)
}

// setReply makes r the flow's reply, its former one an old reply.
func (p *pending) setReply(r ptuple) {
	if old := p.reply(); old.valid() {
		rs := p.rareState()
		rs.oldReplies = append(rs.oldReplies, old)
	}
	if !p.wide && !isV4(r) {
		p.widen()
	}
	putSlot(p.bytes()[p.slot():], r, p.wide)
	p.hasReply = true
}

// widen holds the key and reply as ptuple: a reply not of IPv4 came.
func (p *pending) widen() {
	key, reply, log := p.key(), p.reply(), p.log()
	b := make([]byte, 2*slotWide, 2*slotWide+len(log))
	putSlot(b, key, true)
	putSlot(b[slotWide:], reply, true)
	b = append(b, log...)
	p.wide = true
	if len(b) <= len(p.inline) {
		p.used = uint8(copy(p.inline[:], b))
		if p.rare != nil {
			p.rare.spill = nil
		}
		return
	}
	p.rareState().spill = b
}

// log is the flow's events, packed.
func (p *pending) log() []byte { return p.bytes()[2*p.slot():] }

func (p *pending) rareState() *rarePending {
	if p.rare == nil {
		p.rare = &rarePending{}
	}
	return p.rare
}

func (p *pending) oldReplies() []ptuple {
	if p.rare == nil {
		return nil
	}
	return p.rare.oldReplies
}

// context is what p's events are packed against.
func (p *pending) context() flowContext {
	c := flowContext{key: p.key(), reply: p.reply()}
	if p.rare != nil {
		c.old, c.whole = p.rare.oldReplies, p.rare.whole
	}
	return c
}

func putSlot(b []byte, t ptuple, wide bool) {
	if !wide {
		copy(b, t.src[12:])
		copy(b[4:], t.dst[12:])
		binary.BigEndian.PutUint16(b[8:], t.sport)
		binary.BigEndian.PutUint16(b[10:], t.dport)
		b[12] = t.proto
		return
	}
	copy(b, t.src[:])
	copy(b[16:], t.dst[:])
	binary.BigEndian.PutUint16(b[32:], t.sport)
	binary.BigEndian.PutUint16(b[34:], t.dport)
	b[36], b[37] = t.proto, t.fams
}

func getSlot(b []byte, wide bool) ptuple {
	var t ptuple
	if !wide {
		t.src[10], t.src[11], t.dst[10], t.dst[11] = 0xff, 0xff, 0xff, 0xff
		copy(t.src[12:], b[:4])
		copy(t.dst[12:], b[4:8])
		t.sport, t.dport, t.proto, t.fams = binary.BigEndian.Uint16(b[8:]), binary.BigEndian.Uint16(b[10:]), b[12], 4|4<<4
		return t
	}
	copy(t.src[:], b[:16])
	copy(t.dst[:], b[16:32])
	t.sport, t.dport, t.proto, t.fams = binary.BigEndian.Uint16(b[32:]), binary.BigEndian.Uint16(b[34:]), b[36], b[37]
	return t
}

// addEvent appends ev to p's events.
func (j *Joiner) addEvent(p *pending, ev event.Event) {
	b, ok := j.packer.appendEvent(p.bytes(), ev, p.context())
	if !ok {
		r := p.rareState()
		r.whole = append(r.whole, ev)
		b = appendWhole(b, len(r.whole)-1)
	}
	p.setBytes(b)
}

// eachEvent calls fn with p's events in the order they came, until fn
// returns false.
func (j *Joiner) eachEvent(p *pending, fn func(event.Event) bool) {
	c := p.context()
	b := p.log()
	for len(b) > 0 {
		ev, rest, ok := j.packer.readEvent(b, c)
		if !ok {
			return // never: the log is written by addEvent alone
		}
		if !fn(ev) {
			return
		}
		b = rest
	}
}
