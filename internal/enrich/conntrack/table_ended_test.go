package conntrack

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/tests/vm/guest"
)

// TestTableEndedIsUpsertThenDestroy: ended leaves the table as upsert then
// destroy did, for random ends of a few tuples reused by new connections
// (reply tuples that differ, as a DNAT to another backend makes them),
// under a small cap on destroyed entries: the entries returned, every
// tuple's lookup and history, and the destroyed list's order.
func TestTableEndedIsUpsertThenDestroy(t *testing.T) {
	guest.SkipKernelIndependent(t)
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		got, want := newTable(1_000_000, 16, time.Minute), newTable(1_000_000, 16, time.Minute)
		now := time.Unix(1000, 0)
		var tuples []event.Tuple
		for i := range 3000 {
			now = now.Add(time.Millisecond)
			e := randomEnd(rng, now)
			tuples = append(tuples, e.Orig, e.Reply)
			g := got.ended(e)
			want.upsert(e, true)
			w := want.destroy(e)
			if g != w {
				t.Fatalf("seed %d, end %d: ended returned %+v, upsert+destroy %+v", seed, i, g, w)
			}
			if i%100 == 99 {
				compareTables(t, got, want, tuples, now)
			}
		}
		compareTables(t, got, want, tuples, now)
	}
}

func randomEnd(rng *rand.Rand, now time.Time) Entry {
	client := netip.AddrFrom4([4]byte{10, 0, 0, byte(1 + rng.IntN(2))})
	backend := netip.AddrFrom4([4]byte{10, 1, 0, byte(1 + rng.IntN(3))})
	port := uint16(1000 + rng.IntN(8))
	e := Entry{
		Orig:   event.Tuple{Src: client, Dst: netip.MustParseAddr("10.96.0.1"), SrcPort: port, DstPort: 80, Proto: 6},
		Reply:  event.Tuple{Src: backend, Dst: client, SrcPort: 8080, DstPort: port, Proto: 6},
		Status: uint32(rng.IntN(16)),
		Seen:   now,
	}
	if rng.IntN(3) > 0 {
		e.State = TCPStateName(uint8(rng.IntN(10)))
	}
	return e
}

func compareTables(t *testing.T, got, want *table, tuples []event.Tuple, now time.Time) {
	t.Helper()
	for _, tu := range tuples {
		g, gok := got.lookup(tu, now)
		w, wok := want.lookup(tu, now)
		if g != w || gok != wok {
			t.Fatalf("lookup %v: %+v %v, upsert+destroy %+v %v", tu, g, gok, w, wok)
		}
		if gh, wh := got.appendDestroyed(nil, tu, now), want.appendDestroyed(nil, tu, now); !reflect.DeepEqual(gh, wh) {
			t.Fatalf("history %v: %+v, upsert+destroy %+v", tu, gh, wh)
		}
	}
	g, w := got.dead.head, want.dead.head
	for g != nil && w != nil {
		if g.e != w.e {
			t.Fatalf("destroyed list: %+v, upsert+destroy %+v", g.e, w.e)
		}
		g, w = g.next, w.next
	}
	if g != nil || w != nil || got.live.n != want.live.n || got.evicted != want.evicted {
		t.Fatalf("lists differ: live %d/%d, destroyed %d/%d, evicted %d/%d",
			got.live.n, want.live.n, got.dead.n, want.dead.n, got.evicted, want.evicted)
	}
}

// BenchmarkTableEnded is a targeted tracker's DESTROYs of distinct
// connections into a full table of destroyed entries (65,536, the
// default cap): ended, and the upsert then destroy it replaces.
func BenchmarkTableEnded(b *testing.B) {
	ends := make([]Entry, 1<<18)
	for i := range ends {
		client := netip.AddrFrom4([4]byte{10, 0, byte(i >> 16), byte(i >> 8)})
		port := uint16(i)
		ends[i] = Entry{
			Orig:  event.Tuple{Src: client, Dst: netip.MustParseAddr("10.96.0.1"), SrcPort: port, DstPort: 80, Proto: 6},
			Reply: event.Tuple{Src: netip.MustParseAddr("10.1.0.1"), Dst: client, SrcPort: 8080, DstPort: port, Proto: 6},
			State: "TIME_WAIT", Seen: time.Unix(1000, 0),
		}
	}
	for _, bc := range []struct {
		name string
		end  func(t *table, e Entry)
	}{
		{"ended", func(t *table, e Entry) { t.ended(e) }},
		{"upsert+destroy", func(t *table, e Entry) { t.upsert(e, true); t.destroy(e) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			t := newTable(1_000_000, 65536, time.Hour)
			i := 0
			for b.Loop() {
				bc.end(t, ends[i&(len(ends)-1)])
				i++
			}
		})
	}
}
