package join

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"

	"github.com/tracer-dev/tracer/internal/hashmix"
)

// tupleIndex leads each tuple an open flow holds (its key, its reply and
// that reversed, its earlier replies) to the flow; it holds the key and
// the replies, and finds the reversed ones through them.
//
// A busy node keeps hundreds of thousands of flows open, two tuples each,
// so nearly every look is a miss of the CPU's caches, and the index is
// laid out for few of them. It is an open-addressing table of 16-byte
// slots, probed linearly and kept in Robin Hood order (an entry never
// sits further from its home slot than the entries it passed), which
// keeps runs short with the table up to seven eighths full. A tuple and
// its reverse share one home slot (their position is a hash both give
// alike), so the look for a tuple and for the reply it may be the
// reverse of is one run of adjacent slots. A slot keeps the hash, not the
// tuple: an entry is checked against the flow it leads to, so entries
// whose hashes collide (about one pair in 2^63 with a random seed, which
// crafted packets cannot aim for) are only more entries of one run, and
// every answer stays exact.
type tupleIndex struct {
	seed  uint64
	slots []indexSlot // a power of two of them, never full
	used  int
	shift uint8 // 64 - log2(len(slots)): a hash's top bits are its home
	// read keeps releaseAll's first reads from being left out as unused.
	read uint64
}

// indexSlot is one entry: sum is its indexKey; p is nil for an empty
// slot.
type indexSlot struct {
	sum uint64
	p   *pending
}

const (
	indexMinSlots = 1 << 10
	// indexLoad is the most entries per 16 slots.
	indexLoad = 14
)

func newTupleIndex() tupleIndex {
	x := tupleIndex{seed: rand.Uint64() | 1}
	x.resize(indexMinSlots)
	return x
}

// indexKey is where a tuple is filed: the shared sum of it and its
// reverse, the lowest bit saying which of the two it is (0 for both when
// a tuple is its own reverse).
type indexKey uint64

// keyOf is t's key; reverse is that of t reversed.
func (x *tupleIndex) keyOf(t ptuple) (key, reverse indexKey) {
	h, r := x.hash(t), x.hash(t.reverse())
	s := (h + r) &^ 1
	switch {
	case h < r:
		return indexKey(s), indexKey(s | 1)
	case h > r:
		return indexKey(s | 1), indexKey(s)
	}
	return indexKey(s), indexKey(s)
}

// get is the flow that holds t, or nil. A flow's reply reversed (the
// client's packet after its DNAT) is not indexed: it is found under the
// reply, in the same run of slots.
func (x *tupleIndex) get(t ptuple) *pending {
	k, r := x.keyOf(t)
	return x.look(t, k, r)
}

// look is get of t, whose key is k and reverse's r. An entry under t
// itself wins over one under its reverse.
func (x *tupleIndex) look(t ptuple, k, r indexKey) *pending {
	var reversed *pending
	mask := len(x.slots) - 1
	for i, d := x.home(k), 0; ; i, d = (i+1)&mask, d+1 {
		s := &x.slots[i]
		if s.p == nil || x.distance(s, i) < d {
			// The entries of k's home are all behind: one further on
			// would have taken this slot.
			return reversed
		}
		switch {
		case indexKey(s.sum) == k && s.p.holds(t):
			return s.p
		case indexKey(s.sum) == r && reversed == nil && s.p.holds(t):
			reversed = s.p
		}
	}
}

// distance is how far the entry in slot i, s, sits from its home.
func (x *tupleIndex) distance(s *indexSlot, i int) int {
	return (i - x.home(indexKey(s.sum))) & (len(x.slots) - 1)
}

// claim leads t to p unless t already leads to a flow: the first flow to
// see a tuple keeps it.
func (x *tupleIndex) claim(p *pending, t ptuple) {
	k, r := x.keyOf(t)
	if x.look(t, k, r) != nil {
		return
	}
	x.insert(k, p)
}

// claimUnseen is claim of a tuple get has just found no flow for: a new
// connection's key, most often, which saves looking for it twice.
func (x *tupleIndex) claimUnseen(p *pending, t ptuple) {
	k, _ := x.keyOf(t)
	x.insert(k, p)
}

// insert adds the entry k -> p without looking for t first, growing the
// table when that makes it too full. Where it passes an entry nearer its
// home than it is to its own, it takes that slot and moves on with the
// entry it displaced.
func (x *tupleIndex) insert(k indexKey, p *pending) {
	e := indexSlot{sum: uint64(k), p: p}
	mask := len(x.slots) - 1
	for i, d := x.home(k), 0; ; i, d = (i+1)&mask, d+1 {
		s := &x.slots[i]
		if s.p == nil {
			*s = e
			break
		}
		if sd := x.distance(s, i); sd < d {
			*s, e = e, *s
			d = sd
		}
	}
	x.used++
	if x.used*16 > len(x.slots)*indexLoad {
		x.resize(2 * len(x.slots))
	}
}

func (x *tupleIndex) home(k indexKey) int { return int(uint64(k) >> x.shift) }

func (x *tupleIndex) resize(n int) {
	old := x.slots
	x.slots = make([]indexSlot, n)
	x.shift = uint8(64 - bits.TrailingZeros(uint(n)))
	x.used = 0
	for _, s := range old {
		if s.p != nil {
			x.insert(indexKey(s.sum), s.p)
		}
	}
}

// indexEntry is an entry a flow may have: p under the key k.
type indexEntry struct {
	k indexKey
	p *pending
}

// entry is p's entry under t.
func (x *tupleIndex) entry(p *pending, t ptuple) indexEntry {
	k, _ := x.keyOf(t)
	return indexEntry{k: k, p: p}
}

// releaseAll removes the entries es that are there. It first reads the
// home slot of each: those loads do not wait for one another, so their
// cache misses overlap where one release after another would take them
// in turn. An entry p has under the same key for another of its tuples
// may go instead of the one asked for; entries are only ever released
// for all of a flow's tuples at once (unindex), so nothing is lost.
func (x *tupleIndex) releaseAll(es []indexEntry) {
	var sum uint64
	for _, e := range es {
		sum += x.slots[x.home(e.k)].sum
	}
	x.read = sum
	for _, e := range es {
		x.releaseEntry(e)
	}
}

func (x *tupleIndex) releaseEntry(e indexEntry) {
	mask := len(x.slots) - 1
	for i, d := x.home(e.k), 0; ; i, d = (i+1)&mask, d+1 {
		s := &x.slots[i]
		switch {
		case s.p == nil || x.distance(s, i) < d:
			return
		case s.p == e.p && indexKey(s.sum) == e.k:
			x.remove(i)
			return
		}
	}
}

// remove empties slot i and moves the later entries of its run one
// slot back towards their homes, so that no entry is left behind an empty
// slot or out of order (no tombstones).
func (x *tupleIndex) remove(i int) {
	mask := len(x.slots) - 1
	x.used--
	for {
		j := (i + 1) & mask
		if s := &x.slots[j]; s.p == nil || x.distance(s, j) == 0 {
			break
		}
		x.slots[i] = x.slots[j]
		i = j
	}
	x.slots[i] = indexSlot{}
}

// hash mixes the tuple's words with the index's seed (the multiply and
// fold of wyhash): addresses as two 64-bit halves each.
func (x *tupleIndex) hash(t ptuple) uint64 {
	le := binary.LittleEndian
	ports := uint64(t.sport)<<24 | uint64(t.dport)<<8 | uint64(t.proto) | uint64(t.fams)<<40
	h := hashmix.Mix(le.Uint64(t.src[:8])^x.seed, le.Uint64(t.src[8:])^0x9e3779b97f4a7c15)
	h = hashmix.Mix(h^le.Uint64(t.dst[:8]), le.Uint64(t.dst[8:])^0xbf58476d1ce4e5b9)
	return hashmix.Mix(h, ports^x.seed)
}

// holds reports whether t is one of the tuples the joiner may index p
// under.
func (p *pending) holds(t ptuple) bool {
	if t == p.key() {
		return true
	}
	if r := p.reply(); r.valid() && (t == r || t == r.reverse()) {
		return true
	}
	for _, r := range p.oldReplies() {
		if t == r || t == r.reverse() {
			return true
		}
	}
	return false
}
