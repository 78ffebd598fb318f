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

// TestTableMatchesAModel: the table answers as a list of every end
// would, kept to its newest maxEntries and to the retention: a tuple's
// lookup is the newest end with it as either tuple, its history every end
// with it as original tuple, newest first. Random ends of a few tuples
// reused by new connections (reply tuples that differ, as a DNAT to
// another backend makes them; no original tuple is ever a reply tuple),
// under small caps and a large one, with pruning now and then, asked at
// the time of the last end and later. Pauses longer than most of the
// retention let a prune empty most of the table, so that its ring shrinks
// (and its index is rebuilt) as well as grows. Half the tables keep the
// ends of the last 200 ms past their cap, up to half as many again, as a
// tracker keeps those a flow may still ask for.
func TestTableMatchesAModel(t *testing.T) {
	guest.SkipKernelIndependent(t)
	shrunk, pastCap, earlyAll := 0, 0, 0
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 7))
		maxEntries := []int{16, 100, 1_000_000}[seed%3]
		retention := 500 * time.Millisecond
		tab := newTable(maxEntries, retention)
		wait, maxWaited := time.Duration(0), maxEntries
		if seed%2 == 1 {
			wait, maxWaited = 200*time.Millisecond, maxEntries*3/2
			tab.wait, tab.maxWaited = wait, maxWaited
		}
		// A quarter of the tables have a join whose clock lags (Progress):
		// ends are aged against it.
		var progress time.Time
		lagging := seed%4 == 3
		waitedAt := func(at time.Time) time.Time {
			if !progress.IsZero() && progress.Before(at) {
				return progress
			}
			return at
		}
		now := time.Unix(1000, 0)
		var ends []Entry
		heldFrom, evicted, early := 0, 0, 0 // the model: ends[heldFrom:] are held
		var tuples []event.Tuple
		seen := map[event.Tuple]bool{}
		for i := range 3000 {
			now = now.Add(time.Millisecond)
			if rng.IntN(400) == 0 {
				now = now.Add(450 * time.Millisecond)
			}
			if lagging && rng.IntN(20) == 0 {
				if p := now.Add(-time.Duration(rng.IntN(600)) * time.Millisecond); p.After(progress) {
					progress = p
					tab.progress = p
				}
			}
			e := randomEnd(rng, now)
			for _, tu := range []event.Tuple{e.Orig, e.Reply} {
				if !seen[tu] {
					seen[tu] = true
					tuples = append(tuples, tu)
				}
			}
			got := tab.ended(e)
			e.Destroyed, e.Replied = true, e.Status&StatusSeenReply != 0
			if got != e {
				t.Fatalf("seed %d, end %d: ended returned %+v, want %+v", seed, i, got, e)
			}
			for len(ends)-heldFrom >= maxEntries {
				if waitedAt(e.Seen).Sub(ends[heldFrom].Seen) < wait {
					if len(ends)-heldFrom < maxWaited {
						break
					}
					early++
				}
				heldFrom++
				evicted++
			}
			ends = append(ends, e)
			if tab.len() > maxEntries {
				pastCap++
			}
			if rng.IntN(50) == 0 {
				// Later than the last end, as a tracker's timer prunes.
				now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
				before, pruned := len(tab.ring), 0
				for ; heldFrom < len(ends) && now.Sub(ends[heldFrom].Seen) > retention; heldFrom++ {
					pruned++
				}
				for ; len(ends)-heldFrom > maxEntries && waitedAt(now).Sub(ends[heldFrom].Seen) >= wait; heldFrom++ {
					evicted++
				}
				if n := tab.prune(now); n != pruned {
					t.Fatalf("seed %d, end %d: %d pruned, want %d", seed, i, n, pruned)
				}
				if len(tab.ring) < before {
					shrunk++
				}
			}
			if i%100 == 99 {
				// Also as the table would answer later, with the older
				// ends past the retention and not pruned yet.
				for _, later := range []time.Duration{0, 300 * time.Millisecond, retention} {
					compareWithModel(t, tab, ends[heldFrom:], retention, tuples, now.Add(later))
				}
			}
		}
		if tab.evicted != uint64(evicted) || tab.evictedEarly != uint64(early) {
			t.Errorf("seed %d: evicted %d, %d early; want %d, %d", seed, tab.evicted, tab.evictedEarly, evicted, early)
		}
		earlyAll += early
	}
	if shrunk == 0 || pastCap == 0 || earlyAll == 0 {
		t.Errorf("%d prunes shrank a ring, %d ends were held past a cap, %d evicted early: want some of each", shrunk, pastCap, earlyAll)
	}
}

// compareWithModel checks every tuple's lookup and history against held,
// the ends the table may hold, oldest first.
func compareWithModel(t *testing.T, tab *table, held []Entry, retention time.Duration, tuples []event.Tuple, now time.Time) {
	t.Helper()
	for _, tu := range tuples {
		var want Entry
		var found bool
		var history []Entry
		for i := len(held) - 1; i >= 0; i-- {
			e := held[i]
			if now.Sub(e.Seen) > retention {
				break
			}
			if !found && (e.Orig == tu || e.Reply == tu) {
				want, found = e, true
			}
			if e.Orig == tu {
				history = append(history, e)
			}
		}
		if got, ok := tab.lookup(tu, now); got != want || ok != found {
			t.Fatalf("lookup %v: %+v %v, want %+v %v", tu, got, ok, want, found)
		}
		if got := tab.appendDestroyed(nil, tu, now); !reflect.DeepEqual(got, history) {
			t.Fatalf("history %v: %+v, want %+v", tu, got, history)
		}
	}
	if tab.len() != len(held) {
		t.Fatalf("%d entries held, want %d", tab.len(), len(held))
	}
}

func randomEnd(rng *rand.Rand, now time.Time) Entry {
	client := netip.AddrFrom4([4]byte{10, 0, 0, byte(1 + rng.IntN(2))})
	if rng.IntN(4) == 0 {
		// The same client over IPv6, and as an IPv4-mapped address,
		// which are other tuples.
		client = netip.AddrFrom16(client.As16())
		if rng.IntN(2) == 0 {
			client = netip.AddrFrom16([16]byte{0: 0xfd, 15: client.As4()[3]})
		}
	}
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

// BenchmarkTableEnded is a tracker's DESTROYs of distinct connections
// into a full table (65,536 entries, the default cap).
func BenchmarkTableEnded(b *testing.B) { benchEnded(b, 0) }

// TestTableIndexesWhenAsked: ends nobody asks about are kept, counted and
// pruned without an index; the first question indexes them, in order.
func TestTableIndexesWhenAsked(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newTable(100, time.Minute)
	rng := rand.New(rand.NewPCG(1, 2))
	var last Entry
	distinct := map[event.Tuple]bool{} // the tuples of the last 100 ends
	for i := range 150 {
		last = tab.ended(randomEnd(rng, now.Add(time.Duration(i)*time.Millisecond)))
		if i >= 50 {
			distinct[last.Orig], distinct[last.Reply] = true, true
		}
	}
	if n, i := tab.indexedTuples(), tab.indexed-tab.oldest; n != 0 || i != 0 {
		t.Fatalf("%d tuples indexed, %d ends indexed before any question", n, i)
	}
	if tab.len() != 100 || tab.evicted != 50 {
		t.Fatalf("%d held, %d evicted; want 100, 50", tab.len(), tab.evicted)
	}
	if got, ok := tab.lookup(last.Reply, now); !ok || got != last {
		t.Fatalf("lookup of the last end's reply: %+v %v, want %+v", got, ok, last)
	}
	if unindexed, tuples := tab.next-tab.indexed, tab.indexedTuples(); unindexed != 0 || tuples != len(distinct) {
		t.Fatalf("after a question: %d unindexed, %d tuples indexed; want 0, %d", unindexed, tuples, len(distinct))
	}
	// One more end takes the oldest indexed one's place; the prune takes
	// the other 99, which leaves no tuple indexed.
	tab.ended(randomEnd(rng, now.Add(2*time.Minute)))
	if n := tab.prune(now.Add(2 * time.Minute)); n != 99 || tab.len() != 1 || tab.indexedTuples() != 0 || tab.evicted != 51 {
		t.Fatalf("prune: %d pruned, %d held, %d tuples indexed, %d evicted; want 99, 1, 0, 51", n, tab.len(), tab.indexedTuples(), tab.evicted)
	}
}

// indexedTuples counts the index's used slots.
func (t *table) indexedTuples() int {
	n := 0
	for _, v := range t.idx.slots {
		if v != 0 {
			n++
		}
	}
	return n
}

// BenchmarkTableEndedAsked is BenchmarkTableEnded with a question after
// every 32 ends (one drain's batch), each indexing the batch: a node
// where every batch holds an end some flow asks for.
func BenchmarkTableEndedAsked(b *testing.B) { benchEnded(b, 32) }

// benchEnded takes ends of distinct connections into a full table, with
// a lookup after every askEvery of them (0: none).
func benchEnded(b *testing.B, askEvery int) {
	ends := distinctEnds()
	t := newTable(65536, time.Hour)
	i := 0
	for b.Loop() {
		t.ended(ends[i&(len(ends)-1)])
		i++
		if askEvery > 0 && i%askEvery == 0 {
			t.lookup(ends[0].Orig, time.Unix(1000, 0))
		}
	}
}

// distinctEnds are 2^18 ends of distinct connections.
func distinctEnds() []Entry {
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
	return ends
}

// TestTableCountsEarlyEvictions: of the ends a full table forgets, those
// younger than its wait (a flow may still ask for them) are counted
// apart, by the time of the end that takes their place.
func TestTableCountsEarlyEvictions(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newTable(4, time.Hour)
	tab.wait = time.Second
	rng := rand.New(rand.NewPCG(3, 4))
	at := func(d time.Duration) { tab.ended(randomEnd(rng, now.Add(d))) }
	// Four ends 100 ms apart fill it; the fifth and sixth evict ends of
	// 400 ms before: early.
	for i := range 6 {
		at(time.Duration(i) * 100 * time.Millisecond)
	}
	if tab.evicted != 2 || tab.evictedEarly != 2 {
		t.Fatalf("a burst: %d evicted, %d early; want 2, 2", tab.evicted, tab.evictedEarly)
	}
	// Ends a second apart and more evict ends of 1 s or more before.
	for i := range 4 {
		at(time.Duration(2+i) * time.Second)
	}
	if tab.evicted != 6 || tab.evictedEarly != 2 {
		t.Fatalf("ends a second apart: %d evicted, %d early; want 6, 2", tab.evicted, tab.evictedEarly)
	}
}
