package join

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
)

func indexTuple(sport uint16) ptuple {
	return packTuple(event.Tuple{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.96.0.10"), SrcPort: sport, DstPort: 80, Proto: 6})
}

// TestTupleIndexCollision: a tuple whose key another flow's tuple has
// is still led to its own flow, and keeps it when the other flow goes.
// No two tuples are known to collide, so the other flow's entry is put
// under the tuple's key by hand, as a collision would.
func TestTupleIndexCollision(t *testing.T) {
	x := newTupleIndex()
	a, b, c := indexTuple(1000), indexTuple(2000), indexTuple(3000)
	// c's flow holds b too (its reply reversed), so it may claim it.
	pa, pb, pc := newPending(a), newPending(b), newPending(c)
	pc.setReply(b.reverse())
	x.claim(pa, a)
	bKey, _ := x.keyOf(b)
	x.insert(bKey, pa) // a's flow has an entry under b's key
	x.claim(pb, b)
	if got := x.get(b); got != pb {
		t.Fatalf("get(b) = %p, want b's flow %p", got, pb)
	}
	if got := x.get(a); got != pa {
		t.Fatalf("get(a) = %p, want a's flow %p", got, pa)
	}
	// a's flow ends: its slots go, b stays led to its flow and a third
	// flow cannot take b from it.
	release(&x, pa, a)
	release(&x, pa, b)
	x.claim(pc, b)
	if got := x.get(b); got != pb {
		t.Fatalf("after a's end get(b) = %p, want b's flow %p, not the later claimer %p", got, pb, pc)
	}
	release(&x, pb, b)
	if got := x.get(b); got != nil {
		t.Fatalf("after b's end get(b) = %p, want nil", got)
	}
	x.claim(pc, c)
	if got, miss := x.get(c), x.get(a); got != pc || miss != nil {
		t.Fatalf("get(c) = %p (want %p), get(a) = %p (want nil)", got, pc, miss)
	}
}

// TestTupleIndexFirstClaimWins: a tuple two flows hold leads to the one
// that claimed it first, and nowhere once that one is released.
func TestTupleIndexFirstClaimWins(t *testing.T) {
	x := newTupleIndex()
	shared := indexTuple(1000)
	first := newPending(shared)
	second := newPending(indexTuple(2000))
	second.setReply(shared.reverse())
	x.claim(first, shared)
	x.claim(second, second.key())
	x.claim(second, shared)
	if got := x.get(shared); got != first {
		t.Fatalf("get(shared) = %p, want the first claimer %p", got, first)
	}
	release(&x, second, shared)
	if got := x.get(shared); got != first {
		t.Fatalf("the second flow's release took the first one's tuple: get = %p", got)
	}
	release(&x, first, shared)
	if got := x.get(shared); got != nil {
		t.Fatalf("get(shared) = %p after the first flow's release, want nil", got)
	}
	if got := x.get(second.key()); got != second {
		t.Fatalf("get(second key) = %p, want %p", got, second)
	}
}

// TestTupleIndexAgainstModel runs random claims, releases and looks
// through a table small enough to wrap around, grow and shift runs back
// on removal, and compares every answer with a map of tuple -> flow
// (distinct tuples never share a key there).
func TestTupleIndexAgainstModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		x := tupleIndex{seed: seed | 1}
		x.resize(8)
		model := map[ptuple]*pending{}
		get := func(tu ptuple) *pending {
			if p := model[tu]; p != nil {
				return p
			}
			if p := model[tu.reverse()]; p != nil && p.holds(tu) {
				return p
			}
			return nil
		}
		claim := func(p *pending, tu ptuple) {
			x.claim(p, tu)
			if get(tu) == nil {
				model[tu] = p
			}
		}
		// A universe of 64 tuples makes keys, replies and reverses meet.
		universe := func() ptuple { return indexTuple(uint16(1000 + rng.IntN(64))) }
		var open []*pending
		for step := range 3000 {
			switch op := rng.IntN(10); {
			case op < 4:
				p := newPending(universe())
				if get(p.key()) != nil {
					continue // the joiner makes a flow only for a tuple no flow holds
				}
				claim(p, p.key())
				if rng.IntN(2) == 0 {
					p.setReply(universe().reverse())
					claim(p, p.reply())
				}
				open = append(open, p)
			case op < 7 && len(open) > 0:
				i := rng.IntN(len(open))
				p := open[i]
				release(&x, p, p.key())
				if p.reply().valid() {
					release(&x, p, p.reply())
				}
				for tu, q := range model {
					if q == p {
						delete(model, tu)
					}
				}
				open = append(open[:i], open[i+1:]...)
			default:
				tu := universe()
				if rng.IntN(2) == 0 {
					tu = tu.reverse()
				}
				if got, want := x.get(tu), get(tu); got != want {
					t.Fatalf("seed %d step %d: get = %p, model %p", seed, step, got, want)
				}
			}
			if x.used != len(model) {
				t.Fatalf("seed %d step %d: %d entries, model %d", seed, step, x.used, len(model))
			}
		}
		for tu := range model {
			if x.get(tu) != model[tu] {
				t.Fatalf("seed %d: at the end get(%v) = %p, model %p", seed, tu, x.get(tu), model[tu])
			}
		}
	}
}

// release removes t if it leads to p.
func release(x *tupleIndex, p *pending, t ptuple) { x.releaseAll([]indexEntry{x.entry(p, t)}) }
