package join

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/tracer-dev/tracer/internal/event"
)

func packedTestEvents() []event.Event {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	client, vip, pod := netip.MustParseAddr("10.244.1.10"), netip.MustParseAddr("10.96.0.20"), netip.MustParseAddr("10.244.1.5")
	orig := event.Tuple{Src: client, Dst: vip, SrcPort: 40000, DstPort: 3306, Proto: 6}
	reply := event.Tuple{Src: pod, Dst: client, SrcPort: 3306, DstPort: 40000, Proto: 6}
	dnat := event.Event{Time: at, Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Netns: 4026531840,
		Packet: orig, Orig: orig, Reply: reply, CTStatus: 0x2a, CTInfo: 2, CTMark: 0x4000, CTZone: 3,
		To: event.Range{MinAddr: pod, MaxAddr: pod, MinPort: 3306, MaxPort: 3306, Flags: 3}}
	v6 := event.Tuple{Src: netip.MustParseAddr("fd00::2"), Dst: netip.MustParseAddr("fd96::20"), SrcPort: 1, DstPort: 2, Proto: 17}
	mapped := event.Tuple{Src: netip.MustParseAddr("::ffff:10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 3, DstPort: 4, Proto: 6}
	reject6 := event.Event{Time: at.Add(time.Millisecond), Kind: event.KindReject, Hook: event.HookICMP6Send, Via: event.ViaTracepoint,
		NFHook: event.NFHookNone, Packet: v6, ICMPType: 1, ICMPCode: 4}
	drop := event.Event{Time: at.Add(-time.Hour), Kind: event.KindDrop, Hook: event.HookKfreeSkb, Packet: mapped,
		Reason: 1 << 31, HasReason: true, NoCT: true}
	zero := event.Event{Kind: event.KindReset, Packet: orig}
	half := dnat
	half.To = event.Range{MinAddr: pod, MinPort: 1, MaxPort: 65535}
	return []event.Event{dnat, reject6, drop, zero, half}
}

// TestPackedEventsReadBack: an open flow gives back exactly the events it
// was given, in order, whether they packed or had to be kept whole.
func TestPackedEventsReadBack(t *testing.T) {
	evs := packedTestEvents()
	zoned := evs[1]
	zoned.Packet.Src = zoned.Packet.Src.WithZone("eth0") // the kernel never gives a zone: kept whole
	otherZone := evs[0]
	otherZone.Time = otherZone.Time.In(time.FixedZone("X", 3600)) // another location than the first event's
	kindless := evs[3]                                            // kind 0, reason 0, read as itself, not as the first whole event
	kindless.Kind = 0
	evs = append(evs, zoned, otherZone, kindless)

	var j Joiner
	p := newPending(packTuple(evs[0].Orig))
	for _, ev := range evs {
		j.addEvent(p, ev)
	}
	readsBack(t, &j, p, evs)
	if p.rare == nil || len(p.rare.whole) != 2 {
		t.Errorf("want the zoned event and the other location's kept whole, got rare %+v", p.rare)
	}
}

// TestPackedRepliesChange: events packed against a reply still read back
// once the flow has a newer reply, and once a reply of another family
// widens its tuples.
func TestPackedRepliesChange(t *testing.T) {
	evs := packedTestEvents()
	var j Joiner
	p := newPending(packTuple(evs[0].Orig))
	var want []event.Event
	add := func(ev event.Event) { j.addEvent(p, ev); want = append(want, ev) }
	r1 := evs[0].Reply
	p.setReply(packTuple(r1))
	add(evs[0])
	r2 := r1
	r2.SrcPort = 9999
	p.setReply(packTuple(r2))
	second := evs[0]
	second.Reply, second.Packet = r2, r1
	add(second)
	if p.wide {
		t.Fatal("an IPv4 reply widened the flow")
	}
	r3 := evs[1].Packet // IPv6
	p.setReply(packTuple(r3))
	third := evs[1]
	third.Reply, third.Orig = r3, r2
	add(third)
	if !p.wide || p.reply() != packTuple(r3) || p.key() != packTuple(evs[0].Orig) {
		t.Fatalf("after an IPv6 reply: wide %v, key %+v, reply %+v", p.wide, p.key().tuple(), p.reply().tuple())
	}
	if old := p.oldReplies(); len(old) != 2 || old[0] != packTuple(r1) || old[1] != packTuple(r2) {
		t.Errorf("old replies %+v, want r1 and r2", old)
	}
	readsBack(t, &j, p, want)
}

// TestPackedUsualFlowsInline: the usual IPv4 flows, a DNAT and its
// SNAT, or a reject and its drop, fit in the flow's own bytes an hour
// into a trace, so an open flow costs one allocation.
func TestPackedUsualFlowsInline(t *testing.T) {
	evs := packedTestEvents()
	dnat := evs[0]
	dnat.Time, dnat.CTMark, dnat.CTZone = dnat.Time.Add(time.Hour), 0, 0
	node := netip.MustParseAddr("172.18.0.2")
	snat := dnat
	snat.Kind, snat.NFHook, snat.Time = event.KindSNAT, 4, dnat.Time.Add(time.Millisecond)
	snat.To = event.Range{MinAddr: node, MaxAddr: node, Flags: 1}
	ping := event.Tuple{Src: netip.MustParseAddr("10.244.1.10"), Dst: netip.MustParseAddr("10.96.0.10"), SrcPort: 7, DstPort: 8 << 8, Proto: 1}
	reject := event.Event{Time: dnat.Time, Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint,
		NFHook: event.NFHookNone, Packet: ping, ICMPType: 3, ICMPCode: 3}
	drop := event.Event{Time: dnat.Time, Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint,
		NFHook: event.NFHookNone, Packet: ping, Reason: 12, HasReason: true}

	var j Joiner
	j.addEvent(newPending(packTuple(dnat.Orig)), evs[0]) // the trace's first event, an hour earlier
	for _, flow := range [][]event.Event{{dnat, snat}, {reject, drop}} {
		p := newPending(packTuple(flow[0].Orig))
		if !flow[0].Orig.Valid() {
			p = newPending(packTuple(flow[0].Packet))
		}
		if flow[0].Reply.Valid() {
			p.setReply(packTuple(flow[0].Reply))
		}
		for _, ev := range flow {
			j.addEvent(p, ev)
		}
		if p.rare != nil {
			t.Errorf("%s and %s take %d bytes, beyond the %d inline", flow[0].Kind, flow[1].Kind, len(p.bytes()), len(p.inline))
		}
	}
	if size := unsafe.Sizeof(pending{}); size != 112 {
		t.Errorf("a pending is %d bytes, want 112 (a size class)", size)
	}
}

func TestPackedTupleReverse(t *testing.T) {
	for _, tu := range []event.Tuple{packedTestEvents()[0].Orig, packedTestEvents()[2].Packet, {}} {
		if got := packTuple(tu).reverse().tuple(); got != tu.Reverse() {
			t.Errorf("%+v reversed: got %+v", tu, got)
		}
	}
}

// FuzzPackedEvent: any event the ring buffer decoder can produce, at any
// time, reads back from an open flow exactly.
func FuzzPackedEvent(f *testing.F) {
	f.Add(make([]byte, event.Size), int64(0), int64(5))
	raw := make([]byte, event.Size)
	raw[event.OffKind], raw[event.OffPkt+event.TupleOffFamily] = byte(event.KindDNAT), 10
	binary.BigEndian.PutUint16(raw[event.OffPkt+event.TupleOffSport:], 443)
	f.Add(raw, int64(-1), int64(1<<62))
	f.Fuzz(func(t *testing.T, raw []byte, first, second int64) {
		ev, err := event.Decode(raw, event.Clock{BootWall: time.Unix(0, first)})
		if err != nil {
			return
		}
		var j Joiner
		p := newPending(packTuple(ev.Orig))
		if r := packTuple(ev.Reply); r.valid() {
			p.setReply(r)
		}
		j.addEvent(p, ev)
		later := ev
		later.Time = time.Unix(0, second)
		j.addEvent(p, later)
		var got []event.Event
		j.eachEvent(p, func(e event.Event) bool { got = append(got, e); return true })
		if len(got) != 2 || got[0] != ev || got[1] != later {
			t.Fatalf("read back %+v\nwant %+v and %+v", got, ev, later)
		}
	})
}

// TestPackedManyNamespaces: past the namespaces the packer numbers, an
// event's namespace is kept in full.
func TestPackedManyNamespaces(t *testing.T) {
	var j Joiner
	base := packedTestEvents()[0]
	p := newPending(packTuple(base.Orig))
	var want []event.Event
	for i := range maxNetns + 8 {
		ev := base
		ev.Netns = 4026531840 + uint32(i%(maxNetns+4))
		j.addEvent(p, ev)
		want = append(want, ev)
	}
	i := 0
	j.eachEvent(p, func(ev event.Event) bool {
		if ev != want[i] {
			t.Errorf("event %d: netns %d, want %d", i, ev.Netns, want[i].Netns)
		}
		i++
		return true
	})
	if i != len(want) || p.rare != nil && len(p.rare.whole) > 0 {
		t.Fatalf("read back %d of %d events, %v kept whole", i, len(want), p.rare)
	}
}

// readsBack requires p's events to read back as want, in order.
func readsBack(t *testing.T, j *Joiner, p *pending, want []event.Event) {
	t.Helper()
	var got []event.Event
	j.eachEvent(p, func(ev event.Event) bool { got = append(got, ev); return true })
	if len(got) != len(want) {
		t.Fatalf("read back %d events, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}
