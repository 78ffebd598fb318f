package enrich

import (
	"net/netip"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
)

func indexTuple(sport uint16) ptuple {
	return packTuple(event.Tuple{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.96.0.10"), SrcPort: sport, DstPort: 80, Proto: 6})
}

// TestTupleIndexCollision: a tuple whose hash another flow's tuple holds
// is still led to its own flow, and keeps it when the other flow goes.
// No two tuples are known to collide, so the other flow is put in the
// tuple's hash slot by hand, as a collision would.
func TestTupleIndexCollision(t *testing.T) {
	x := newTupleIndex()
	a, b, c := indexTuple(1000), indexTuple(2000), indexTuple(3000)
	// c's flow holds b too (its reply reversed), so it may claim it.
	pa, pb, pc := newPending(a), newPending(b), newPending(c)
	pc.setReply(b.reverse())
	x.claim(pa, a)
	x.byHash[x.hash(b)] = pa // a's flow holds b's hash slot
	x.claim(pb, b)
	if got := x.get(b); got != pb {
		t.Fatalf("get(b) = %p, want b's flow %p", got, pb)
	}
	if got := x.get(a); got != pa {
		t.Fatalf("get(a) = %p, want a's flow %p", got, pa)
	}
	// a's flow ends: its slots go, b stays led to its flow and a third
	// flow cannot take b from it.
	x.release(pa, a)
	delete(x.byHash, x.hash(b))
	x.claim(pc, b)
	if got := x.get(b); got != pb {
		t.Fatalf("after a's end get(b) = %p, want b's flow %p, not the later claimer %p", got, pb, pc)
	}
	x.release(pb, b)
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
	x.release(second, shared)
	if got := x.get(shared); got != first {
		t.Fatalf("the second flow's release took the first one's tuple: get = %p", got)
	}
	x.release(first, shared)
	if got := x.get(shared); got != nil {
		t.Fatalf("get(shared) = %p after the first flow's release, want nil", got)
	}
	if got := x.get(second.key()); got != second {
		t.Fatalf("get(second key) = %p, want %p", got, second)
	}
}
