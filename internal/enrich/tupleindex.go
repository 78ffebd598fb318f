package enrich

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
)

// tupleIndex leads each tuple an open flow holds (its key, its reply and
// that reversed, its earlier replies) to the flow; it holds the key and
// the replies, and finds the reversed ones through them. A busy node keeps
// hundreds of thousands of flows open, two tuples each, so the index
// keys a tuple by a 64-bit hash and checks the flow it finds: 16 bytes an
// entry instead of a 40-byte tuple and a pointer, and a hash of five
// words rather than of the key's bytes. A tuple whose hash another flow's
// tuple already holds goes to collided, keyed by the whole tuple: with a
// random seed that is about one pair in 2^64, and crafted packets cannot
// aim for it; either way every answer stays exact.
type tupleIndex struct {
	seed     uint64
	byHash   map[uint64]*pending
	collided map[ptuple]*pending
}

func newTupleIndex() tupleIndex {
	return tupleIndex{seed: rand.Uint64() | 1, byHash: map[uint64]*pending{}}
}

// get is the flow that holds t, or nil. A flow's reply reversed (the
// client's packet after its DNAT) is not indexed: it is found under the
// reply, which costs a second look only for a tuple no flow has under
// itself.
func (x *tupleIndex) get(t ptuple) *pending { return x.getHashed(t, x.hash(t)) }

// getHashed is get of t whose hash is h.
func (x *tupleIndex) getHashed(t ptuple, h uint64) *pending {
	if p := x.find(t, h); p != nil {
		return p
	}
	r := t.reverse()
	if p := x.find(r, x.hash(r)); p != nil && p.holds(t) {
		return p
	}
	return nil
}

// find is the flow indexed under t, whose hash is h.
func (x *tupleIndex) find(t ptuple, h uint64) *pending {
	if p := x.byHash[h]; p != nil && p.holds(t) {
		return p
	}
	if len(x.collided) == 0 {
		return nil
	}
	return x.collided[t]
}

// claim leads t to p unless t already leads to a flow: the first flow to
// see a tuple keeps it.
func (x *tupleIndex) claim(p *pending, t ptuple) {
	h := x.hash(t)
	if x.getHashed(t, h) != nil {
		return
	}
	x.put(p, t, h)
}

// claimUnseen is claim of a tuple get has just found no flow for: a new
// connection's key, most often, which saves looking for it twice.
func (x *tupleIndex) claimUnseen(p *pending, t ptuple) { x.put(p, t, x.hash(t)) }

// put leads t, whose hash is h, to p.
func (x *tupleIndex) put(p *pending, t ptuple, h uint64) {
	if _, taken := x.byHash[h]; !taken {
		x.byHash[h] = p
		return
	}
	if x.collided == nil {
		x.collided = map[ptuple]*pending{}
	}
	x.collided[t] = p
}

// release removes t if it leads to p. A hash slot p holds for another of
// its tuples goes too; release is only ever asked for all of a flow's
// tuples at once (unindex), so nothing is lost.
func (x *tupleIndex) release(p *pending, t ptuple) {
	h := x.hash(t)
	if x.byHash[h] == p {
		delete(x.byHash, h)
	}
	if len(x.collided) == 0 {
		return
	}
	if x.collided[t] == p {
		delete(x.collided, t)
	}
}

// hash mixes the tuple's words with the index's seed (the multiply and
// fold of wyhash): addresses as two 64-bit halves each.
func (x *tupleIndex) hash(t ptuple) uint64 {
	le := binary.LittleEndian
	ports := uint64(t.sport)<<24 | uint64(t.dport)<<8 | uint64(t.proto) | uint64(t.fams)<<40
	h := mix(le.Uint64(t.src[:8])^x.seed, le.Uint64(t.src[8:])^0x9e3779b97f4a7c15)
	h = mix(h^le.Uint64(t.dst[:8]), le.Uint64(t.dst[8:])^0xbf58476d1ce4e5b9)
	return mix(h, ports^x.seed)
}

func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b^0x94d049bb133111eb)
	return hi ^ lo
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
