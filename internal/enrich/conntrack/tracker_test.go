package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	ct "github.com/ti-mo/conntrack"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/tests/vm/guest"
)

// fakeSource is a kernel table the test edits behind the tracker's back,
// and an event stream the test feeds, including overruns.
type fakeSource struct {
	mu    sync.Mutex
	table map[event.Tuple]Entry
	dumps int
	gets  int
	// queryErr fails Get and DumpSource.
	queryErr error
	// dumpFails fails that many Dumps from now, as a table that keeps
	// changing under them does.
	dumpFails int
	// pending is what a test queues as the kernel does while it answers
	// a Get: a targeted tracker's Drain takes it before events.
	pending []fakeRecv
	// onMiss runs (with mu held) when Get finds nothing.
	onMiss func(tu event.Tuple)
	// sourceDumps counts DumpSource calls; onSourceDump runs in each
	// (with mu held), as a dump of a big table takes time.
	sourceDumps  int
	onSourceDump func()
	events       chan fakeRecv
	closed       chan struct{}
	once         sync.Once
}

type fakeRecv struct {
	ch  []change
	err error
}

func newFake(entries ...Entry) *fakeSource {
	f := &fakeSource{table: map[event.Tuple]Entry{}, events: make(chan fakeRecv, 16), closed: make(chan struct{})}
	for _, e := range entries {
		f.table[e.Orig] = e
	}
	return f
}

func (f *fakeSource) Dump() ([]Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dumps++
	if f.dumpFails > 0 {
		f.dumpFails--
		return nil, errors.New("dump interrupted")
	}
	var out []Entry
	for _, e := range f.table {
		out = append(out, e)
	}
	return out, nil
}

func (f *fakeSource) Receive() ([]change, error) {
	select {
	case r := <-f.events:
		return r.ch, r.err
	case <-f.closed:
		return nil, errClosed
	}
}

func (f *fakeSource) Get(tu event.Tuple) (Entry, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	if f.queryErr != nil {
		return Entry{}, false, f.queryErr
	}
	for _, e := range f.table {
		if e.Orig == tu || e.Reply == tu {
			return e, true, nil
		}
	}
	if f.onMiss != nil {
		f.onMiss(tu)
	}
	return Entry{}, false, nil
}

func (f *fakeSource) GetAll(tus []event.Tuple, entries []Entry, found []bool) error {
	for i, tu := range tus {
		e, ok, err := f.Get(tu)
		if err != nil {
			return err
		}
		entries[i], found[i] = e, ok
	}
	return nil
}

func (f *fakeSource) DumpSource(proto uint8, src netip.AddrPort) ([]Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sourceDumps++
	if f.onSourceDump != nil {
		f.onSourceDump()
	}
	if f.queryErr != nil {
		return nil, f.queryErr
	}
	var out []Entry
	for _, e := range f.table {
		if e.Orig.Proto == proto && e.Orig.SrcAddrPort() == src {
			out = append(out, e)
		}
	}
	return out, nil
}

// Drain reads the same event stream as Receive, for targeted trackers:
// it hands over whatever is queued.
func (f *fakeSource) Drain(fn func(change)) error {
	f.mu.Lock()
	items := f.pending
	f.pending = nil
	f.mu.Unlock()
	for more := true; more; {
		select {
		case r := <-f.events:
			items = append(items, r)
		default:
			more = false
		}
	}
	var err error
	for _, r := range items {
		if r.err != nil {
			err = r.err
		}
		for _, c := range r.ch {
			fn(c)
		}
	}
	return err
}

func (f *fakeSource) Close() error {
	f.once.Do(func() { close(f.closed) })
	return nil
}

func (f *fakeSource) set(e Entry) {
	f.mu.Lock()
	f.table[e.Orig] = e
	f.mu.Unlock()
}

func (f *fakeSource) del(orig event.Tuple) {
	f.mu.Lock()
	delete(f.table, orig)
	f.mu.Unlock()
}

func tcp(src string, sport uint16, dst string, dport uint16) event.Tuple {
	return event.Tuple{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), SrcPort: sport, DstPort: dport, Proto: 6}
}

// dnatEntry is a client → VIP connection DNAT'd to a backend.
func dnatEntry(sport uint16, status uint32) Entry {
	return Entry{
		Orig:   tcp("10.244.1.7", sport, "10.96.0.10", 80),
		Reply:  tcp("10.244.2.5", 8080, "10.244.1.7", sport),
		Status: status | StatusConfirmed | StatusDstNAT,
		State:  "SYN_SENT",
	}
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func startFake(t *testing.T, src *fakeSource, opts Options, now func() time.Time) *Tracker {
	t.Helper()
	tr, err := start(context.Background(), src, opts, now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestLookupByBothTuplesAndUpdates(t *testing.T) {
	a := dnatEntry(40000, 0)
	src := newFake(a)
	tr := startFake(t, src, Options{}, time.Now)

	for _, tu := range []event.Tuple{a.Orig, a.Reply} {
		e, ok := tr.Lookup(tu)
		if !ok || e.Orig != a.Orig || e.Replied {
			t.Fatalf("lookup %v: %+v %v", tu, e, ok)
		}
	}
	// The proto is part of the key.
	udp := a.Orig
	udp.Proto = 17
	if _, ok := tr.Lookup(udp); ok {
		t.Error("udp tuple found a tcp entry")
	}

	// The reply arrives: SEEN_REPLY and ESTABLISHED. Then an update without
	// protoinfo must keep the state, and Replied must stay once set.
	up := a
	up.Status |= StatusSeenReply | StatusAssured
	up.State = "ESTABLISHED"
	src.events <- fakeRecv{ch: []change{{entry: up}}}
	got := <-tr.Updates()
	if !got.Replied || got.State != "ESTABLISHED" || got.Status&StatusAssured == 0 || got.Seen.IsZero() {
		t.Fatalf("update %+v", got)
	}
	noState := a
	noState.State = ""
	noState.Status = StatusConfirmed | StatusDstNAT // a (hypothetical) event with the bit cleared
	src.events <- fakeRecv{ch: []change{{entry: noState}}}
	got = <-tr.Updates()
	if got.State != "ESTABLISHED" || !got.Replied {
		t.Fatalf("merged update lost state or Replied: %+v", got)
	}

	src.events <- fakeRecv{ch: []change{{entry: a, destroy: true}}}
	got = <-tr.Updates()
	if !got.Destroyed || !got.Replied {
		t.Fatalf("destroy %+v", got)
	}
	if e, ok := tr.Lookup(a.Reply); !ok || !e.Destroyed {
		t.Fatalf("destroyed entry not resolvable: %+v %v", e, ok)
	}
	if s := tr.Stats(); s.Entries != 1 || s.Destroyed != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestOverrunRedump: the fake kernel table changes while "events are lost";
// an overrun must be counted and the dump must bring the table back in step,
// with vanished entries kept as destroyed.
func TestOverrunRedump(t *testing.T) {
	a, b := dnatEntry(40001, 0), dnatEntry(40002, 0)
	src := newFake(a, b)
	tr := startFake(t, src, Options{}, time.Now)

	c := dnatEntry(40003, StatusSeenReply)
	bUp := b
	bUp.Status |= StatusSeenReply
	bUp.State = "ESTABLISHED"
	src.del(a.Orig)
	src.set(bUp)
	src.set(c)
	src.events <- fakeRecv{err: errOverrun}
	src.events <- fakeRecv{err: errOverrun}

	waitFor(t, "redump", func() bool { return tr.Stats().Redumps >= 1 && tr.Stats().Overruns == 2 })
	s := tr.Stats()
	if s.Redumps > 2 {
		t.Errorf("%d redumps for 2 overruns", s.Redumps)
	}
	if e, ok := tr.Lookup(a.Orig); !ok || !e.Destroyed {
		t.Errorf("a vanished during the overrun: want destroyed, got %+v %v", e, ok)
	}
	if e, ok := tr.Lookup(b.Reply); !ok || !e.Replied || e.State != "ESTABLISHED" {
		t.Errorf("b after redump: %+v %v", e, ok)
	}
	if e, ok := tr.Lookup(c.Reply); !ok || !e.Replied || e.Destroyed {
		t.Errorf("c after redump: %+v %v", e, ok)
	}
	// The redump's changes reach the consumer: a destroyed, b updated, c new.
	seen := map[uint16]Entry{}
	for len(seen) < 3 {
		select {
		case e := <-tr.Updates():
			seen[e.Orig.SrcPort] = e
		case <-time.After(2 * time.Second):
			t.Fatalf("redump updates: got %v", seen)
		}
	}
	if !seen[40001].Destroyed || !seen[40002].Replied || seen[40003].Destroyed {
		t.Errorf("redump updates %+v", seen)
	}
	// Events keep flowing after the redump.
	d := dnatEntry(40004, 0)
	src.events <- fakeRecv{ch: []change{{entry: d}}}
	waitFor(t, "event after redump", func() bool { _, ok := tr.Lookup(d.Orig); return ok })
}

func TestDestroyedRetention(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	a := dnatEntry(40010, 0)
	src := newFake(a)
	tr := startFake(t, src, Options{Retention: time.Minute, pruneEvery: 10 * time.Millisecond}, clk.now)
	src.events <- fakeRecv{ch: []change{{entry: a, destroy: true}}}
	<-tr.Updates()
	clk.add(59 * time.Second)
	if _, ok := tr.Lookup(a.Orig); !ok {
		t.Fatal("destroyed entry gone before its retention")
	}
	clk.add(2 * time.Second)
	if _, ok := tr.Lookup(a.Orig); ok {
		t.Fatal("destroyed entry still resolvable after its retention")
	}
	waitFor(t, "prune", func() bool { return tr.Stats().Entries == 0 })
}

func TestTableBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newTable(3, 1, time.Minute)
	e := func(p uint16) Entry { x := dnatEntry(p, 0); x.Seen = now; return x }
	tab.upsert(e(1), false)
	tab.upsert(e(2), false)
	tab.destroy(e(1))
	tab.destroy(e(2)) // maxDestroyed 1: entry 1 goes
	if _, ok := tab.lookup(e(1).Orig, now); ok {
		t.Error("destroyed cap not kept")
	}
	tab.upsert(e(3), false)
	tab.upsert(e(4), false)
	tab.upsert(e(5), false) // 4 entries > 3: the destroyed one goes first
	if _, ok := tab.lookup(e(2).Orig, now); ok {
		t.Error("destroyed entry should be evicted before live ones")
	}
	tab.upsert(e(3), false) // 3 is now most recent
	tab.upsert(e(6), false) // evicts the least recently updated: 4
	for p, want := range map[uint16]bool{3: true, 4: false, 5: true, 6: true} {
		if _, ok := tab.lookup(e(p).Reply, now); ok != want {
			t.Errorf("entry %d present=%v, want %v", p, ok, want)
		}
	}
	if live, dead := tab.len(); live != 3 || dead != 0 || len(tab.byTuple) != 6 {
		t.Errorf("live %d dead %d keys %d", live, dead, len(tab.byTuple))
	}
}

// TestTupleReuse: a new connection on a destroyed one's tuple is a new
// entry; pruning the old one must not unindex the new one.
func TestTupleReuse(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newTable(100, 100, time.Minute)
	old := dnatEntry(1, StatusSeenReply)
	old.Seen = now
	tab.upsert(old, false)
	tab.destroy(old)
	fresh := dnatEntry(1, 0)
	fresh.Seen = now.Add(time.Second)
	got, _ := tab.upsert(fresh, false)
	if got.Replied || got.Destroyed {
		t.Fatalf("reused tuple inherited the old entry: %+v", got)
	}
	tab.prune(now.Add(90 * time.Second))
	if e, ok := tab.lookup(fresh.Orig, now); !ok || e.Destroyed {
		t.Fatalf("new entry lost when the old one was pruned: %+v %v", e, ok)
	}
}

func TestSlowConsumerCountsDrops(t *testing.T) {
	src := newFake()
	tr := startFake(t, src, Options{UpdateBuffer: 2}, time.Now)
	var ch []change
	for p := uint16(1); p <= 10; p++ {
		ch = append(ch, change{entry: dnatEntry(p, 0)})
	}
	src.events <- fakeRecv{ch: ch}
	waitFor(t, "10 entries", func() bool { return tr.Stats().Entries == 10 })
	if s := tr.Stats(); s.DroppedUpdates != 8 {
		t.Errorf("dropped %d updates, want 8", s.DroppedUpdates)
	}
}

func TestReaderErrorIsReported(t *testing.T) {
	src := newFake()
	tr := startFake(t, src, Options{}, time.Now)
	src.events <- fakeRecv{err: errTest}
	waitFor(t, "error in stats", func() bool { return tr.Stats().Err != "" })
	if _, open := <-tr.Updates(); open {
		t.Error("updates still open after the reader stopped")
	}
}

var errTest = &testErr{}

type testErr struct{}

func (*testErr) Error() string { return "receive conntrack events: socket gone" }

func TestCloseStops(t *testing.T) {
	src := newFake()
	ctx, cancel := context.WithCancel(context.Background())
	tr, err := start(ctx, src, Options{}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case _, open := <-tr.Updates():
		if open {
			t.Fatal("unexpected update")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("updates not closed after the context ended")
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFromFlow(t *testing.T) {
	f := ct.Flow{
		TupleOrig: ct.Tuple{
			IP:    ct.IPTuple{SourceAddress: netip.MustParseAddr("::ffff:10.0.0.1"), DestinationAddress: netip.MustParseAddr("10.96.0.10")},
			Proto: ct.ProtoTuple{Protocol: 1, ICMPv4: true, ICMPID: 77, ICMPType: 8, ICMPCode: 0},
		},
		TupleReply: ct.Tuple{
			IP:    ct.IPTuple{SourceAddress: netip.MustParseAddr("10.96.0.10"), DestinationAddress: netip.MustParseAddr("10.0.0.1")},
			Proto: ct.ProtoTuple{Protocol: 1, ICMPv4: true, ICMPID: 77, ICMPType: 0, ICMPCode: 0},
		},
		Status: ct.StatusConfirmed,
		Mark:   0x4000,
		Zone:   3,
	}
	e := fromFlow(&f)
	want := event.Tuple{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.96.0.10"), SrcPort: 77, DstPort: 8 << 8, Proto: 1}
	if e.Orig != want || e.Reply.DstPort != 0 || e.Reply.SrcPort != 77 || e.Mark != 0x4000 || e.Zone != 3 || e.State != "" || e.Replied {
		t.Errorf("icmp entry %+v", e)
	}
	f = ct.Flow{
		TupleOrig:  ct.Tuple{IP: ct.IPTuple{SourceAddress: netip.MustParseAddr("10.0.0.1"), DestinationAddress: netip.MustParseAddr("10.0.0.2")}, Proto: ct.ProtoTuple{Protocol: 6, SourcePort: 1234, DestinationPort: 80}},
		TupleReply: ct.Tuple{IP: ct.IPTuple{SourceAddress: netip.MustParseAddr("10.0.0.2"), DestinationAddress: netip.MustParseAddr("10.0.0.1")}, Proto: ct.ProtoTuple{Protocol: 6, SourcePort: 80, DestinationPort: 1234}},
		Status:     ct.StatusConfirmed | ct.StatusSeenReply,
		ProtoInfo:  ct.ProtoInfo{TCP: &ct.ProtoInfoTCP{State: 3}},
	}
	e = fromFlow(&f)
	if e.State != "ESTABLISHED" || !e.Replied || e.Orig.DstPort != 80 || e.Reply.SrcPort != 80 {
		t.Errorf("tcp entry %+v", e)
	}
}

func TestFormatStatus(t *testing.T) {
	got := FormatStatus(StatusSeenReply | StatusAssured | StatusConfirmed | StatusDstNAT)
	want := []string{"SEEN_REPLY", "ASSURED", "CONFIRMED", "DST_NAT"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FormatStatus = %v, want %v", got, want)
	}
	if FormatStatus(0) != nil {
		t.Error("zero status has names")
	}
	if TCPStateName(7) != "TIME_WAIT" || TCPStateName(200) != "" {
		t.Error("tcp state names")
	}
}

// TestMemoryPerEntry measures the table's cost per entry; the figure is
// logged for the report and bounded so a regression shows.
func TestMemoryPerEntry(t *testing.T) {
	guest.SkipKernelIndependent(t)
	if testing.Short() {
		t.Skip("allocates 200k entries")
	}
	const n = 200_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tab := newTable(1_000_000, 1000, time.Minute)
	now := time.Now()
	for i := 0; i < n; i++ {
		e := Entry{
			Orig:   tcp("10.244.1.7", uint16(i), "10.96.0.10", uint16(i>>16)+80),
			Reply:  tcp("10.244.2.5", 8080, "10.244.1.7", uint16(i)),
			Status: StatusConfirmed, State: "ESTABLISHED", Seen: now,
		}
		e.Reply.DstPort = uint16(i)
		e.Reply.Src = netip.AddrFrom4([4]byte{10, 244, byte(i >> 16), byte(i >> 8)})
		tab.upsert(e, true)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%d entries: %.0f bytes per entry", n, per)
	if live, _ := tab.len(); live != n {
		t.Fatalf("%d entries held", live)
	}
	if per > 1024 {
		t.Errorf("%.0f bytes per entry", per)
	}
	runtime.KeepAlive(tab)
}

// TestHistoryOfAReusedTuple: three connections from one source port, one
// after the other, are three entries; the destroyed ones are listed newest
// first with their own state, after what dst held, and the list stops
// where the table forgot an entry.
func TestHistoryOfAReusedTuple(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newTable(100, 100, time.Minute)
	conn := func(status uint32, state string, at time.Duration) Entry {
		e := dnatEntry(1, status)
		e.State, e.Seen = state, now.Add(at)
		return e
	}
	first, second, third := conn(StatusSeenReply, "CLOSE", 0), conn(StatusSeenReply, "TIME_WAIT", time.Second), conn(0, "SYN_SENT", 2*time.Second)
	tab.upsert(first, false)
	tab.destroy(first)
	tab.upsert(second, false)
	tab.destroy(second)
	tab.upsert(third, false)
	if e, ok := tab.lookup(first.Orig, now.Add(2*time.Second)); !ok || e.State != "SYN_SENT" || e.Destroyed {
		t.Fatalf("lookup: %+v %v, want the live third connection", e, ok)
	}
	kept := Entry{State: "kept"}
	h := tab.appendDestroyed([]Entry{kept}, first.Orig, now.Add(2*time.Second))
	if len(h) != 3 || h[0] != kept {
		t.Fatalf("destroyed after one kept entry: %d entries, want 3: %+v", len(h), h)
	}
	for i, want := range []string{"TIME_WAIT", "CLOSE"} {
		if e := h[i+1]; e.State != want || !e.Destroyed {
			t.Errorf("destroyed[%d] = %s destroyed=%v, want %s destroyed", i, e.State, e.Destroyed, want)
		}
	}
	if r := tab.appendDestroyed(nil, first.Reply, now); len(r) != 0 {
		t.Errorf("a reply tuple has no history of its own: %+v", r)
	}
	// The first is pruned first (destroyed earliest): the chain ends at
	// the second.
	tab.prune(now.Add(time.Minute + time.Second/2))
	if h := tab.appendDestroyed(nil, first.Orig, now.Add(time.Minute+time.Second/2)); len(h) != 1 || h[0].State != "TIME_WAIT" {
		t.Errorf("after pruning the first entry: %+v", h)
	}
}

// TestOverrunRedumpRetried: a redump that fails (the table kept changing
// under all of dump's tries) is tried again after a pause without another
// overrun, and brings the table in step; one that fails redumpTries times
// in a row says so in Stats.Err.
func TestOverrunRedumpRetried(t *testing.T) {
	guest.SkipKernelIndependent(t)
	a, b := dnatEntry(40011, 0), dnatEntry(40012, 0)
	src := newFake(a)
	tr := startFake(t, src, Options{}, time.Now)
	src.mu.Lock()
	src.dumpFails = 3 + 3 // dump tries 3 times: two redumps fail
	src.mu.Unlock()
	src.set(b)
	src.events <- fakeRecv{err: errOverrun}
	waitFor(t, "redump after two failed", func() bool { return tr.Stats().Redumps == 1 })
	if e, ok := tr.Lookup(b.Reply); !ok || e.Destroyed {
		t.Errorf("the entry made during the overrun after the redump: %+v %v", e, ok)
	}
	if s := tr.Stats(); s.Overruns != 1 || s.Err != "" {
		t.Errorf("stats %+v", s)
	}

	src.mu.Lock()
	src.dumpFails = 3 * redumpTries
	src.mu.Unlock()
	src.events <- fakeRecv{err: errOverrun}
	waitFor(t, "the tracker giving up", func() bool { return tr.Stats().Err != "" })
	src.mu.Lock()
	left := src.dumpFails
	src.mu.Unlock()
	if s := tr.Stats(); left != 0 || s.Redumps != 1 || !strings.Contains(s.Err, "redump after overrun") {
		t.Errorf("after %d failed redumps: %d dumps left to fail, stats %+v", redumpTries, left, s)
	}
}
