package conntrack

import (
	"errors"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
)

// TestLookupAsksTheKernel: a tracker answers a live entry as the kernel
// has it now (changed behind its back, without any event), and an ended
// one from the DESTROY it was told of.
func TestLookupAsksTheKernel(t *testing.T) {
	a := dnatEntry(40100, 0)
	src := newFake(a)
	tr := startFake(t, src, Options{}, time.Now)
	for _, tu := range []event.Tuple{a.Orig, a.Reply} {
		if e, ok := tr.Lookup(tu); !ok || e.Orig != a.Orig || e.Replied || e.Seen.IsZero() {
			t.Fatalf("lookup %v: %+v %v", tu, e, ok)
		}
	}
	up := a
	up.Status |= StatusSeenReply
	up.State = "ESTABLISHED"
	src.set(up)
	if e, ok := tr.Lookup(a.Orig); !ok || !e.Replied || e.State != "ESTABLISHED" {
		t.Fatalf("lookup after the kernel's change: %+v %v", e, ok)
	}

	src.del(a.Orig)
	src.events <- fakeRecv{ch: []Entry{up}}
	waitFor(t, "destroy applied", func() bool { return tr.Stats().Entries == 1 })
	if e, ok := tr.Lookup(a.Reply); !ok || !e.Destroyed || !e.Replied || e.State != "ESTABLISHED" {
		t.Fatalf("destroyed entry: %+v %v", e, ok)
	}
	if s := tr.Stats(); s.Entries != 1 || s.QueryErrors != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestBySourceAsksTheKernel lists the kernel's live entries from the source,
// then the destroyed ones, and none from another source.
func TestBySourceAsksTheKernel(t *testing.T) {
	a, b, other := dnatEntry(40110, 0), dnatEntry(40111, 0), dnatEntry(40112, 0)
	src := newFake(a, other)
	tr := startFake(t, src, Options{}, time.Now)
	src.events <- fakeRecv{ch: []Entry{b}}
	waitFor(t, "destroy applied", func() bool { return tr.Stats().Entries == 1 })

	got := tr.BySource(6, a.Orig.SrcAddrPort())
	if len(got) != 1 || got[0].Orig != a.Orig || got[0].Destroyed {
		t.Fatalf("live from %v: %+v", a.Orig.SrcAddrPort(), got)
	}
	got = tr.BySource(6, b.Orig.SrcAddrPort())
	if len(got) != 1 || got[0].Orig != b.Orig || !got[0].Destroyed {
		t.Fatalf("destroyed from %v: %+v", b.Orig.SrcAddrPort(), got)
	}
	if got := tr.BySource(17, a.Orig.SrcAddrPort()); len(got) != 0 {
		t.Fatalf("udp from a tcp source: %+v", got)
	}
}

// TestBySourceDumpsBounded: dumps by source that take 100 ms each
// (a big table) stop after the 250 ms of credit are spent, are counted as
// skipped meanwhile (the answer is the destroyed entries alone), and start
// again once time has brought the credit back at 5%.
func TestBySourceDumpsBounded(t *testing.T) {
	a, b := dnatEntry(40130, 0), dnatEntry(40131, 0)
	src := newFake(a)
	c := &clock{t: time.Unix(1700000000, 0)}
	src.onSourceDump = func() { c.add(100 * time.Millisecond) }
	tr := startFake(t, src, Options{}, c.now)
	src.events <- fakeRecv{ch: []Entry{b}}
	waitFor(t, "destroy applied", func() bool { return tr.Stats().Entries == 1 })

	for i := range 3 {
		if got := tr.BySource(6, a.Orig.SrcAddrPort()); len(got) != 1 || got[0].Orig != a.Orig {
			t.Fatalf("dump %d: %+v", i+1, got)
		}
	}
	// 250 ms + 3 x 5 ms of credit, 300 ms spent: the next is refused.
	if got := tr.BySource(6, a.Orig.SrcAddrPort()); len(got) != 0 {
		t.Errorf("a fourth dump ran at once: %+v", got)
	}
	if got := tr.BySource(6, b.Orig.SrcAddrPort()); len(got) != 1 || !got[0].Destroyed {
		t.Errorf("a refused dump still answers from the destroyed entries: %+v", got)
	}
	if s := tr.Stats(); src.sourceDumps != 3 || s.SourceDumpsSkipped != 2 {
		t.Errorf("%d dumps, %d skipped; want 3 and 2", src.sourceDumps, s.SourceDumpsSkipped)
	}
	c.add(time.Second) // 50 ms of credit back
	if got := tr.BySource(6, a.Orig.SrcAddrPort()); len(got) != 1 {
		t.Errorf("no dump a second later: %+v", got)
	}
	if src.sourceDumps != 4 {
		t.Errorf("%d dumps, want 4", src.sourceDumps)
	}
}

// TestOverrunCounted: an overrun is counted and repaired by
// nothing (there is no live copy to re-dump); DESTROYs after it apply.
func TestOverrunCounted(t *testing.T) {
	a := dnatEntry(40120, 0)
	src := newFake()
	tr := startFake(t, src, Options{}, time.Now)
	src.events <- fakeRecv{err: errOverrun}
	src.events <- fakeRecv{ch: []Entry{a}}
	waitFor(t, "destroy after the overrun", func() bool { return tr.Stats().Entries == 1 })
	if s := tr.Stats(); s.Overruns != 1 || s.Err != "" {
		t.Errorf("stats %+v", s)
	}
}

// TestQueryErrorCounted: a failed kernel query is counted, and the
// lookup still answers from the destroyed entries.
func TestQueryErrorCounted(t *testing.T) {
	a := dnatEntry(40130, 0)
	src := newFake()
	tr := startFake(t, src, Options{}, time.Now)
	src.events <- fakeRecv{ch: []Entry{a}}
	waitFor(t, "destroy applied", func() bool { return tr.Stats().Entries == 1 })
	src.mu.Lock()
	src.queryErr = errors.New("get conntrack entry: socket gone")
	src.mu.Unlock()
	if e, ok := tr.Lookup(a.Orig); !ok || !e.Destroyed {
		t.Fatalf("lookup with the kernel unreachable: %+v %v", e, ok)
	}
	if got := tr.BySource(6, a.Orig.SrcAddrPort()); len(got) != 1 || !got[0].Destroyed {
		t.Fatalf("by source with the kernel unreachable: %+v", got)
	}
	if s := tr.Stats(); s.QueryErrors != 2 {
		t.Errorf("query errors %d, want 2", s.QueryErrors)
	}
}

// TestLookupTakesInQueuedDestroy: the kernel, asked for an entry
// that has just expired, destroys it, queues its DESTROY and answers "no
// such entry". The lookup must answer with the destroyed entry, not a
// miss, although the tracker's own reader has not seen the event yet.
func TestLookupTakesInQueuedDestroy(t *testing.T) {
	a := dnatEntry(40140, StatusSeenReply)
	a.State = "TIME_WAIT"
	src := newFake()
	tr := startFake(t, src, Options{}, time.Now)
	src.mu.Lock()
	src.onMiss = func(tu event.Tuple) {
		if tu == a.Orig {
			src.pending = append(src.pending, fakeRecv{ch: []Entry{a}})
		}
	}
	src.mu.Unlock()
	e, ok := tr.Lookup(a.Orig)
	if !ok || !e.Destroyed || e.State != "TIME_WAIT" || !e.Replied {
		t.Fatalf("lookup of the entry destroyed while asked for: %+v %v", e, ok)
	}
}

// TestReusedTupleDestroyedTwice: two connections of one tuple,
// destroyed one after the other, are two entries: a lookup finds the
// newer one, with its own state, not the first one refreshed.
func TestReusedTupleDestroyedTwice(t *testing.T) {
	first := dnatEntry(40150, StatusSeenReply)
	first.State = "CLOSE"
	second := dnatEntry(40150, 0)
	second.Reply.Src = netip.MustParseAddr("10.244.2.6") // another backend
	second.State = "SYN_SENT"
	src := newFake()
	tr := startFake(t, src, Options{}, time.Now)
	src.events <- fakeRecv{ch: []Entry{first}}
	waitFor(t, "first destroy", func() bool { return tr.Stats().Entries == 1 })
	src.events <- fakeRecv{ch: []Entry{second}}
	waitFor(t, "second destroy", func() bool { return tr.Stats().Entries == 2 })
	e, ok := tr.Lookup(second.Orig)
	if !ok || !e.Destroyed || e.State != "SYN_SENT" || e.Reply != second.Reply || e.Replied {
		t.Fatalf("lookup after two connections of one tuple: %+v %v, want the second", e, ok)
	}
	if e, ok := tr.Lookup(first.Reply); !ok || e.State != "CLOSE" {
		t.Errorf("the first connection by its own reply tuple: %+v %v", e, ok)
	}
}

// TestDestroyed: a reused tuple's destroyed connections, newest
// first, without the kernel's live entry.
func TestDestroyed(t *testing.T) {
	first, second, live := dnatEntry(40160, StatusSeenReply), dnatEntry(40160, 0), dnatEntry(40160, 0)
	first.State, second.State, live.State = "CLOSE", "TIME_WAIT", "SYN_SENT"
	second.Reply.Src = netip.MustParseAddr("10.244.2.6")
	live.Reply.Src = netip.MustParseAddr("10.244.2.8")
	src := newFake(live)
	tr := startFake(t, src, Options{}, time.Now)
	src.events <- fakeRecv{ch: []Entry{first}}
	waitFor(t, "first destroy", func() bool { return tr.Stats().Entries == 1 })
	src.events <- fakeRecv{ch: []Entry{second}}
	waitFor(t, "second destroy", func() bool { return tr.Stats().Entries == 2 })
	h := tr.Destroyed(live.Orig)
	if len(h) != 2 || h[0].State != "TIME_WAIT" || !h[0].Destroyed || h[1].State != "CLOSE" || !h[1].Destroyed {
		t.Fatalf("destroyed %+v", h)
	}
	if h := tr.Destroyed(live.Reply); len(h) != 0 {
		t.Errorf("a reply tuple has no history of its own: %+v", h)
	}
}

// TestLookupAllReadsDestroys: LookupAll reads the DESTROYs the
// kernel queued before it returned, a batch of no tuples too, so
// AppendDestroyedRead answers of them without a read of its own: the replaced
// connection's DESTROY queued while the batch was asked for, and one
// queued before an empty batch.
func TestLookupAllReadsDestroys(t *testing.T) {
	replaced, newer := dnatEntry(40170, StatusSeenReply), dnatEntry(40170, 0)
	replaced.State, newer.State = "TIME_WAIT", "SYN_SENT"
	newer.Reply.Src = netip.MustParseAddr("10.244.2.6")
	gone := dnatEntry(40171, 0)
	gone.State = "CLOSE"
	src := newFake(newer)
	tr := startFake(t, src, Options{}, time.Now)
	src.mu.Lock()
	src.onMiss = func(event.Tuple) {
		src.pending = append(src.pending, fakeRecv{ch: []Entry{replaced}})
	}
	src.mu.Unlock()
	missing := dnatEntry(40172, 0).Orig
	tus := []event.Tuple{newer.Orig, missing}
	entries, found := make([]Entry, 2), make([]bool, 2)
	tr.LookupAll(tus, entries, found)
	if !found[0] || entries[0].Reply != newer.Reply || found[1] {
		t.Fatalf("LookupAll: %+v %v", entries, found)
	}
	if h := tr.AppendDestroyedRead(nil, replaced.Orig); len(h) != 1 || h[0].State != "TIME_WAIT" || h[0].Reply != replaced.Reply {
		t.Fatalf("AppendDestroyedRead after the batch: %+v, want the replaced connection's entry", h)
	}

	src.mu.Lock()
	src.pending = append(src.pending, fakeRecv{ch: []Entry{gone}})
	src.mu.Unlock()
	tr.LookupAll(nil, nil, nil)
	if h := tr.AppendDestroyedRead(nil, gone.Orig); len(h) != 1 || h[0].State != "CLOSE" {
		t.Fatalf("AppendDestroyedRead after an empty batch: %+v", h)
	}
}

// TestFedTrackerTakesEndsFromTheCaller: a tracker fed its ends reads no
// event socket (a DESTROY queued on its source stays unread), asks the
// kernel for live entries as any tracker, and answers a connection the
// caller reported ended from that end, in Lookup, Destroyed and BySource,
// with what the kernel side's event said. Closed, it takes no more ends.
func TestFedTrackerTakesEndsFromTheCaller(t *testing.T) {
	a, b := dnatEntry(40140, 0), dnatEntry(40141, 0)
	src := newFake(a)
	tr := startFake(t, src, Options{FedDestroys: true}, time.Now)
	src.events <- fakeRecv{ch: []Entry{a}}

	tr.Ended(EndOf(event.Event{Kind: event.KindCTDestroy, Orig: b.Orig, Reply: b.Reply,
		CTStatus: b.Status | StatusSeenReply, CTMark: 7, CTZone: 3, Reason: 7, HasReason: true}))
	e, ok := tr.Lookup(b.Reply)
	if !ok || !e.Destroyed || !e.Replied || e.State != "TIME_WAIT" || e.Mark != 7 || e.Zone != 3 ||
		e.Status&StatusDying == 0 || e.Orig != b.Orig {
		t.Fatalf("ended entry: %+v %v", e, ok)
	}
	if e, ok := tr.Lookup(a.Orig); !ok || e.Destroyed {
		t.Fatalf("live entry: %+v %v (a DESTROY on the socket was read)", e, ok)
	}
	if got := tr.Destroyed(b.Orig); len(got) != 1 || got[0].Reply != b.Reply {
		t.Fatalf("destroyed of %v: %+v", b.Orig, got)
	}
	if got := tr.BySource(6, b.Orig.SrcAddrPort()); len(got) != 1 || !got[0].Destroyed {
		t.Fatalf("by source %v: %+v", b.Orig.SrcAddrPort(), got)
	}
	if s := tr.Stats(); s.Entries != 1 {
		t.Fatalf("stats %+v: want the one end handed over", s)
	}
	if len(src.events) != 1 {
		t.Fatalf("the source's DESTROY was read: %d left", len(src.events))
	}

	tr.Close()
	tr.Ended(EndOf(event.Event{Kind: event.KindCTDestroy, Orig: a.Orig, Reply: a.Reply, CTStatus: a.Status}))
	if got := tr.AppendDestroyedRead(nil, a.Orig); len(got) != 0 {
		t.Fatalf("an end handed over after Close was applied: %+v", got)
	}
}

// TestDrainsReuseTheirBatch: the drains that reuse one batch after
// another keep every DESTROY as it came: each batch's entries, not the
// next batch's written over them.
func TestDrainsReuseTheirBatch(t *testing.T) {
	src := newFake()
	tr := startFake(t, src, Options{}, time.Now)
	var want []Entry
	for round := range 3 {
		var ch []Entry
		for i := range 5 {
			e := dnatEntry(uint16(40200+round*10+i), StatusSeenReply)
			e.Mark = uint32(round*10 + i)
			e.State = []string{"TIME_WAIT", "CLOSE", "LAST_ACK"}[round]
			ch = append(ch, e)
			want = append(want, e)
		}
		src.events <- fakeRecv{ch: ch}
		n := len(want)
		waitFor(t, "the round's DESTROYs", func() bool { return tr.Stats().Entries == n })
	}
	for _, w := range want {
		h := tr.AppendDestroyedRead(nil, w.Orig)
		if len(h) != 1 || h[0].Mark != w.Mark || h[0].State != w.State || h[0].Reply != w.Reply || !h[0].Replied {
			t.Fatalf("destroyed %v: %+v, want mark %d state %s", w.Orig, h, w.Mark, w.State)
		}
	}
}

// TestWaitLoopBacksOff: the wait loop reads every destroyBatch while
// DESTROYs come, and doubles its wait while none do, up to destroyIdle.
func TestWaitLoopBacksOff(t *testing.T) {
	w := destroyBatch
	var waits []time.Duration
	for range 5 {
		w = nextWait(w, 0)
		waits = append(waits, w)
	}
	want := []time.Duration{10 * time.Millisecond, destroyIdle, destroyIdle, destroyIdle, destroyIdle}
	if !slices.Equal(waits, want) {
		t.Errorf("quiet waits %v, want %v", waits, want)
	}
	if got := nextWait(destroyIdle, 1); got != destroyBatch {
		t.Errorf("after a drain that read one: %v, want %v", got, destroyBatch)
	}
}

// TestTrackerCountsEarlyEvictions: a tracker keeps the ends a flow may
// still ask for (ended within Options.Wait) past MaxEntries, up to
// MaxWaited, and its stats say how many ends a full table forgot and how
// many of them within Wait of their end, on the tracker's clock.
func TestTrackerCountsEarlyEvictions(t *testing.T) {
	var clock atomic.Int64 // the tracker's pruning reads it too
	clock.Store(time.Unix(1000, 0).UnixNano())
	tr := startFake(t, newFake(), Options{FedDestroys: true, MaxEntries: 2, MaxWaited: 3, Wait: time.Second}, func() time.Time { return time.Unix(0, clock.Load()) })
	end := func(port uint16) {
		e := dnatEntry(port, 0)
		tr.Ended(EndOf(event.Event{Kind: event.KindCTDestroy, Orig: e.Orig, Reply: e.Reply, CTStatus: e.Status}))
	}
	for port := range uint16(4) {
		end(port)
	}
	if s := tr.Stats(); s.Entries != 3 || s.Evicted != 1 || s.EvictedEarly != 1 {
		t.Fatalf("four ends at once, 2 entries and 3 waited for: %d held, %d evicted, %d early; want 3, 1, 1", s.Entries, s.Evicted, s.EvictedEarly)
	}
	clock.Add(int64(1500 * time.Millisecond))
	end(4)
	if s := tr.Stats(); s.Entries != 2 || s.Evicted != 3 || s.EvictedEarly != 1 {
		t.Fatalf("an end 1.5 s later: %d held, %d evicted, %d early; want 2, 3, 1", s.Entries, s.Evicted, s.EvictedEarly)
	}
}

// A join that reads the kernel's events late asks for their entries late:
// while its clock (Progress) is behind, the ends it has not waited out stay
// past the cap, whatever the newest end's time, and a lookup still finds
// them; once its clock passes them they go.
func TestTrackerKeepsEndsTheJoinHasNotReached(t *testing.T) {
	var clock atomic.Int64
	t0 := time.Unix(1000, 0)
	clock.Store(t0.UnixNano())
	tr := startFake(t, newFake(), Options{FedDestroys: true, MaxEntries: 2, MaxWaited: 4, Wait: time.Second}, func() time.Time { return time.Unix(0, clock.Load()) })
	end := func(port uint16) {
		e := dnatEntry(port, 0)
		tr.Ended(EndOf(event.Event{Kind: event.KindCTDestroy, Orig: e.Orig, Reply: e.Reply, CTStatus: e.Status, Time: time.Unix(0, clock.Load())}))
	}
	tr.Progress(t0)
	for port := range uint16(4) {
		end(port)
		clock.Add(int64(2 * time.Second))
	}
	if s := tr.Stats(); s.Entries != 4 || s.Evicted != 0 {
		t.Fatalf("four ends 2 s apart, the join's clock at the first: %d held, %d evicted; want 4, 0", s.Entries, s.Evicted)
	}
	if _, ok := tr.Lookup(dnatEntry(0, 0).Orig); !ok {
		t.Fatalf("the first end, which the join has not waited out, is not found")
	}
	end(4)
	if s := tr.Stats(); s.Entries != 4 || s.Evicted != 1 || s.EvictedEarly != 1 {
		t.Fatalf("a fifth, past MaxWaited: %d held, %d evicted, %d early; want 4, 1, 1", s.Entries, s.Evicted, s.EvictedEarly)
	}
	tr.Progress(t0.Add(5500 * time.Millisecond)) // 1.5 s past the third end
	end(5)
	if s := tr.Stats(); s.Entries != 3 || s.Evicted != 3 || s.EvictedEarly != 1 {
		t.Fatalf("the join's clock past the third end: %d held, %d evicted, %d early; want 3, 3, 1", s.Entries, s.Evicted, s.EvictedEarly)
	}
}

// TestBySourceRefusedWalksRecentEnds: a refused BySource (the dumps' time
// spent) answers from the newest recentEnds ends only: an end behind that
// many newer ones is found again once a dump may run. Every drop of a
// storm may ask, and walking every end kept after a flood cost 238 µs a
// drop.
func TestBySourceRefusedWalksRecentEnds(t *testing.T) {
	owner := dnatEntry(40140, 0)
	src := newFake()
	c := &clock{t: time.Unix(1700000000, 0)}
	src.onSourceDump = func() { c.add(100 * time.Millisecond) }
	tr := startFake(t, src, Options{MaxEntries: 2 * recentEnds}, c.now)
	ends := []Entry{owner}
	for i := range recentEnds {
		ends = append(ends, dnatEntry(uint16(1024+i), 0))
	}
	src.events <- fakeRecv{ch: ends}
	waitFor(t, "destroys applied", func() bool { return tr.Stats().Entries == len(ends) })
	for range 3 { // the credit: 250 ms
		if got := tr.BySource(6, owner.Orig.SrcAddrPort()); len(got) != 1 {
			t.Fatalf("a dump's answer: %+v", got)
		}
	}
	if got := tr.BySource(6, owner.Orig.SrcAddrPort()); len(got) != 0 {
		t.Errorf("refused, it walked past the newest %d ends: %+v", recentEnds, got)
	}
	c.add(2 * time.Second)
	if got := tr.BySource(6, owner.Orig.SrcAddrPort()); len(got) != 1 {
		t.Errorf("a dump again: %+v", got)
	}
}
