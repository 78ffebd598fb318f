package conntrack

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
	"slices"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/hashmix"
)

// table holds the entries the kernel ended, oldest first, indexed by both
// of their tuples: the live ones are always asked of the kernel. It is
// not safe for concurrent use, not even its questions, which index what
// came since the last; the Tracker guards it.
//
// It is sized for floods: a node making 80,000 connections a second ends
// more than 100,000 entries within one flow's linger, and a flow whose
// entry was forgotten goes without it. So the ends are packed in a ring
// (104 bytes each, no pointers for the collector to scan) and indexed by
// an open-addressing table of their sequence numbers (32 bytes an end),
// where a map of nodes cost about 400 bytes an end.
type table struct {
	ring []packedEnd // a power of two long; end s is at s&(len-1)
	idx  endIndex
	mem  *tableMemory // where ring and idx live
	// The ends held are the sequence numbers [oldest, next), those before
	// indexed in idx. Most ends are of connections nobody asks about any
	// more (a TCP entry ends two minutes after its connection's flow was
	// written, in TIME_WAIT): those leave past the retention, or the cap,
	// without being indexed; the first question indexes the rest.
	oldest, indexed, next uint32

	// states are the TCP state names the ends had, by their code in
	// packedEnd.state (0 is "").
	states []string

	maxEntries int
	retention  time.Duration
	// wait is Options.Wait. An end younger than that stays past
	// maxEntries, up to maxWaited ends in all: a flow may still ask for
	// it. Evicted younger, it counts in evictedEarly as well.
	wait      time.Duration
	maxWaited int
	// progress is the join's clock (Tracker.Progress), zero when no join
	// says it: ends are aged against it when it is behind, since a join
	// that reads the kernel's events late asks for their entries late.
	progress time.Time

	evicted, evictedEarly uint64
}

// maxTableEntries bounds a table's cap: the index's slots number four
// times the ring's and keep their home in 30 bits.
const maxTableEntries = 1 << 27

func tableCap(n int) int { return min(max(n, 1), maxTableEntries) }

func newTable(maxEntries int, retention time.Duration) *table {
	t := &table{
		maxEntries: tableCap(maxEntries),
		maxWaited:  tableCap(maxEntries),
		retention:  retention,
		states:     append([]string{""}, tcpStates[:]...),
	}
	t.mem = newTableMemory(t)
	return t
}

// packedTuple is an event.Tuple as the table keeps and compares it.
type packedTuple struct {
	src, dst         [16]byte
	srcPort, dstPort uint16
	proto            uint8
	// form is the two addresses' forms, src's in the low bits: formNone,
	// formV4 or formV6. A tuple with no valid source is not indexed.
	form uint8
}

const (
	formNone = iota
	formV4
	formV6
)

func addrForm(a netip.Addr) uint8 {
	switch {
	case a.Is4():
		return formV4
	case a.IsValid():
		return formV6
	}
	return formNone
}

func addrOf(b [16]byte, form uint8) netip.Addr {
	switch form {
	case formV4:
		return netip.AddrFrom16(b).Unmap()
	case formV6:
		return netip.AddrFrom16(b)
	}
	return netip.Addr{}
}

func packTuple(tu event.Tuple) packedTuple {
	return packedTuple{
		src: tu.Src.As16(), dst: tu.Dst.As16(), srcPort: tu.SrcPort, dstPort: tu.DstPort, proto: tu.Proto,
		form: addrForm(tu.Src) | addrForm(tu.Dst)<<2,
	}
}

func (p *packedTuple) valid() bool { return p.form&3 != formNone }

func (p *packedTuple) unpack() event.Tuple {
	return event.Tuple{
		Src: addrOf(p.src, p.form&3), Dst: addrOf(p.dst, p.form>>2),
		SrcPort: p.srcPort, DstPort: p.dstPort, Proto: p.proto,
	}
}

func (p *packedTuple) hash() uint64 {
	le := binary.LittleEndian
	h := hashmix.Mix(le.Uint64(p.src[:8])^uint64(p.srcPort), le.Uint64(p.src[8:])^uint64(p.proto)<<32)
	h = hashmix.Mix(h^le.Uint64(p.dst[:8]), le.Uint64(p.dst[8:])^uint64(p.dstPort)<<16^uint64(p.form))
	return h
}

// packedEnd is one ended entry in the ring.
type packedEnd struct {
	seen         int64 // Entry.Seen, in Unix nanoseconds
	status, mark uint32
	earlier      uint32 // with endHasEarlier: see endHasEarlier
	zone         uint16
	state        uint8 // index in table.states
	flags        uint8
	orig, reply  packedTuple
}

const (
	endReplied uint8 = 1 << iota
	// endHasEarlier: earlier is the end this one took the original tuple
	// over from. A client that reuses a source port makes a new entry for
	// the same tuple, and a flow of the old connection still asks for its
	// own entry.
	endHasEarlier
)

func (t *table) pack(e Entry) packedEnd {
	p := packedEnd{
		seen: e.Seen.UnixNano(), status: e.Status, mark: e.Mark, zone: e.Zone,
		orig: packTuple(e.Orig), reply: packTuple(e.Reply),
	}
	if e.Replied {
		p.flags |= endReplied
	}
	if i := slices.Index(t.states, e.State); i >= 0 {
		p.state = uint8(i)
	} else if len(t.states) <= 0xff {
		p.state = uint8(len(t.states))
		t.states = append(t.states, e.State)
	}
	return p
}

func (t *table) unpack(p *packedEnd) Entry {
	return Entry{
		Orig: p.orig.unpack(), Reply: p.reply.unpack(),
		Status: p.status, Mark: p.mark, Zone: p.zone, State: t.states[p.state],
		Replied: p.flags&endReplied != 0, Destroyed: true,
		Seen: time.Unix(0, p.seen),
	}
}

func (t *table) at(s uint32) *packedEnd { return &t.ring[s&uint32(len(t.ring)-1)] }

func (t *table) len() int { return int(t.next - t.oldest) }

// held reports whether end s is still in the table.
func (t *table) held(s uint32) bool { return s-t.oldest < t.next-t.oldest }

// age is how long before at p ended.
func (p *packedEnd) age(at time.Time) time.Duration { return at.Sub(time.Unix(0, p.seen)) }

func (t *table) young(p *packedEnd, now time.Time) bool { return p.age(now) <= t.retention }

// waitedAt is the time against which an end's Wait is over: at, or the
// join's clock when that is behind.
func (t *table) waitedAt(at time.Time) time.Time {
	if !t.progress.IsZero() && t.progress.Before(at) {
		return t.progress
	}
	return at
}

// lookup is the newest ended entry that has tu as either tuple, within
// the retention.
func (t *table) lookup(tu event.Tuple, now time.Time) (Entry, bool) {
	t.catchUp()
	key := packTuple(tu)
	s, ok := t.idx.find(t, &key)
	// An entry past its retention may not have been pruned yet (pruning
	// runs on a timer); it must not be joined any more.
	if !ok || !t.young(t.at(s), now) {
		return Entry{}, false
	}
	return t.unpack(t.at(s)), true
}

// ended records the end of a connection, to be indexed when the table is
// next asked; beyond maxEntries the oldest end goes, unless a flow may
// still ask for it and the table holds fewer than maxWaited.
func (t *table) ended(e Entry) Entry {
	e.Replied = e.Replied || e.Status&StatusSeenReply != 0
	e.Destroyed = true
	waited := t.waitedAt(e.Seen)
	for t.len() >= t.maxEntries {
		if t.at(t.oldest).age(waited) < t.wait {
			if t.len() < t.maxWaited {
				break
			}
			t.evictedEarly++
		}
		t.dropOldest()
		t.evicted++
	}
	if t.len() == len(t.ring) {
		t.resize(min(max(2*len(t.ring), 64), ceilPow2(t.maxWaited)))
	}
	*t.at(t.next) = t.pack(e)
	t.next++
	return e
}

// catchUp indexes the unindexed ends, oldest first. An entry already held
// for an end's original tuple is an earlier connection's (the client
// reused its source port), kept as its history.
func (t *table) catchUp() {
	for ; t.indexed != t.next; t.indexed++ {
		p := t.at(t.indexed)
		if prev, ok := t.idx.find(t, &p.orig); ok && t.at(prev).orig == p.orig {
			p.earlier, p.flags = prev, p.flags|endHasEarlier
		}
		t.index(t.indexed)
	}
}

func (t *table) index(s uint32) {
	p := t.at(s)
	if p.orig.valid() {
		t.idx.put(t, &p.orig, s, false)
	}
	if p.reply.valid() {
		t.idx.put(t, &p.reply, s, true)
	}
}

// dropOldest takes the oldest end out, and out of the index where its
// tuples still lead to it: a newer entry for a reused tuple owns them
// then. A history chain ends where it reaches an end no longer held.
func (t *table) dropOldest() {
	if t.indexed == t.oldest {
		t.indexed++
	} else {
		p := t.at(t.oldest)
		if p.orig.valid() {
			t.idx.remove(t, &p.orig, t.oldest)
		}
		if p.reply.valid() {
			t.idx.remove(t, &p.reply, t.oldest)
		}
	}
	t.oldest++
}

// resize moves the ends to a ring of n and rebuilds the index for it.
func (t *table) resize(n int) {
	ring, ringMem := mapArray[packedEnd](n)
	for s := t.oldest; s != t.next; s++ {
		ring[s&uint32(n-1)] = *t.at(s)
	}
	slots, slotsMem := mapArray[uint64](4 * n)
	t.ring, t.idx = ring, endIndex{slots: slots, mask: uint64(4*n - 1)}
	t.mem.replace(ringMem, slotsMem)
	for s := t.oldest; s != t.indexed; s++ {
		t.index(s)
	}
}

// prune forgets entries older than the retention, and evicts those a
// flood kept past maxEntries that no flow waits for any more. The ends
// are ordered by time, so it stops at the first young one; it gives back
// the memory of a flood once the ends it left are gone.
func (t *table) prune(now time.Time) int {
	pruned := 0
	for t.len() > 0 && !t.young(t.at(t.oldest), now) {
		t.dropOldest()
		pruned++
	}
	waited := t.waitedAt(now)
	for t.len() > t.maxEntries && t.at(t.oldest).age(waited) >= t.wait {
		t.dropOldest()
		t.evicted++
	}
	if len(t.ring) > 64 && t.len() <= len(t.ring)/8 {
		t.resize(max(ceilPow2(2*t.len()), 64))
	}
	return pruned
}

// appendDestroyed appends the ended entries whose original tuple is tu
// to dst, newest first, within the retention: the one lookup finds, then
// the ones it replaced.
func (t *table) appendDestroyed(dst []Entry, tu event.Tuple, now time.Time) []Entry {
	t.catchUp()
	key := packTuple(tu)
	s, ok := t.idx.find(t, &key)
	for ok && t.held(s) {
		p := t.at(s)
		if p.orig != key || !t.young(p, now) {
			break
		}
		dst = append(dst, t.unpack(p))
		s, ok = p.earlier, p.flags&endHasEarlier != 0
	}
	return dst
}

// bySource lists the ended entries within the retention whose original
// tuple leaves from src, newest first, among the newest limit ends (0:
// all). It walks them: it serves the question "which of my connections
// does this stray packet answer?", which Tracker.BySource bounds.
func (t *table) bySource(proto uint8, src netip.AddrPort, now time.Time, limit int) []Entry {
	var out []Entry
	stop := t.oldest
	if limit > 0 && t.len() > limit {
		stop = t.next - uint32(limit)
	}
	// The source is compared packed, so an end from elsewhere costs a
	// few loads, not an unpacking.
	key := packTuple(event.Tuple{Src: src.Addr(), SrcPort: src.Port(), Proto: proto})
	for s := t.next; s != stop; {
		s--
		p := t.at(s)
		if p.orig.srcPort == key.srcPort && p.orig.proto == proto && p.orig.form&3 == key.form&3 && p.orig.src == key.src && t.young(p, now) {
			out = append(out, t.unpack(p))
		}
	}
	return out
}

func ceilPow2(n int) int { return 1 << bits.Len(uint(max(n, 1)-1)) }

// endIndex maps a tuple to the newest indexed end that has it, by linear
// probing. A slot is 0 when empty, else slotUsed | home<<33 | which<<32 |
// seq: home (the low 30 bits of the tuple's hash, its first slot) lets a
// removal shift the slots after it back without hashing again, and
// filters most slots of other tuples without reading their end; which is
// 1 for an end's reply tuple.
type endIndex struct {
	slots []uint64
	mask  uint64
}

const (
	slotUsed  = 1 << 63
	slotWhich = 1 << 32
	homeBits  = 30
)

func slotHome(v uint64) uint64 { return v >> 33 & (1<<homeBits - 1) }

// tupleOf is the tuple slot value v indexes.
func tupleOf(t *table, v uint64) *packedTuple {
	p := t.at(uint32(v))
	if v&slotWhich != 0 {
		return &p.reply
	}
	return &p.orig
}

// probe finds key's slot: its position and whether it is there (else the
// position is the empty slot that ends its run).
func (x *endIndex) probe(t *table, key *packedTuple) (i uint64, home uint64, found bool) {
	home = key.hash() & (1<<homeBits - 1)
	i = home & x.mask
	for range x.slots {
		v := x.slots[i]
		if v == 0 {
			return i, home, false
		}
		if slotHome(v) == home && *tupleOf(t, v) == *key {
			return i, home, true
		}
		i = (i + 1) & x.mask
	}
	// At most half the slots are ever used, unless an end left without
	// its slots: a bug, not an input, and one that must not spin.
	panic("conntrack: the ended entries' index has no empty slot")
}

func (x *endIndex) find(t *table, key *packedTuple) (uint32, bool) {
	if len(x.slots) == 0 {
		return 0, false
	}
	i, _, found := x.probe(t, key)
	return uint32(x.slots[i]), found
}

// put points key at end s, newer than any it pointed at.
func (x *endIndex) put(t *table, key *packedTuple, s uint32, reply bool) {
	i, home, _ := x.probe(t, key)
	v := slotUsed | home<<33 | uint64(s)
	if reply {
		v |= slotWhich
	}
	x.slots[i] = v
}

// remove unpoints key if it points at end s, shifting back the slots of
// its run that would no longer be found past the hole.
func (x *endIndex) remove(t *table, key *packedTuple, s uint32) {
	i, _, found := x.probe(t, key)
	if !found || uint32(x.slots[i]) != s {
		return
	}
	for j := (i + 1) & x.mask; x.slots[j] != 0; j = (j + 1) & x.mask {
		// The slot at j may move to the hole at i if its home is not
		// between them (cyclically): it was probed past i.
		if (j-slotHome(x.slots[j]))&x.mask >= (j-i)&x.mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = 0
}
