package conntrack

import (
	"context"
	"net/netip"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	ct "github.com/ti-mo/conntrack"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/tests/vm/guest"
)

// fakeSource is a kernel table the test edits behind the tracker's back,
// and a stream of DESTROYs the test feeds, including overruns.
type fakeSource struct {
	mu    sync.Mutex
	table map[event.Tuple]Entry
	gets  int
	// queryErr fails Get and DumpSource.
	queryErr error
	// pending is what a test queues as the kernel does while it answers
	// a Get: the tracker's Drain takes it before events.
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
	ch  []Entry
	err error
}

func newFake(entries ...Entry) *fakeSource {
	f := &fakeSource{table: map[event.Tuple]Entry{}, events: make(chan fakeRecv, 16), closed: make(chan struct{})}
	for _, e := range entries {
		f.table[e.Orig] = e
	}
	return f
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

// Drain hands over whatever is queued.
func (f *fakeSource) Drain(fn func(Entry)) error {
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

func TestDestroyedRetention(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	a := dnatEntry(40010, 0)
	src := newFake(a)
	tr := startFake(t, src, Options{Retention: time.Minute, pruneEvery: 10 * time.Millisecond}, clk.now)
	src.del(a.Orig)
	src.events <- fakeRecv{ch: []Entry{a}}
	waitFor(t, "the end applied", func() bool { return tr.Stats().Entries == 1 })
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

// TestReaderErrorIsReported: a DESTROY socket that fails stops the wait
// loop, and Stats says why.
func TestReaderErrorIsReported(t *testing.T) {
	src := newFake()
	tr := startFake(t, src, Options{}, time.Now)
	src.events <- fakeRecv{err: errTest}
	waitFor(t, "error in stats", func() bool { return tr.Stats().Err != "" })
	if got := tr.Stats().Err; got != errTest.Error() {
		t.Errorf("stats error %q, want %q", got, errTest.Error())
	}
}

var errTest = &testErr{}

type testErr struct{}

func (*testErr) Error() string { return "read conntrack destroy events: socket gone" }

// TestCloseStops: once its context ends the tracker closes its source
// and applies no DESTROY any more.
func TestCloseStops(t *testing.T) {
	src := newFake()
	ctx, cancel := context.WithCancel(context.Background())
	tr, err := start(ctx, src, Options{}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-src.closed:
	case <-time.After(2 * time.Second):
		t.Fatal("source not closed after the context ended")
	}
	src.events <- fakeRecv{ch: []Entry{dnatEntry(40020, 0)}}
	if got := tr.Destroyed(dnatEntry(40020, 0).Orig); len(got) != 0 {
		t.Errorf("a DESTROY applied after the context ended: %+v", got)
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
	tab := newTable(1_000_000, time.Minute)
	now := time.Now()
	for i := 0; i < n; i++ {
		e := Entry{
			Orig:   tcp("10.244.1.7", uint16(i), "10.96.0.10", uint16(i>>16)+80),
			Reply:  tcp("10.244.2.5", 8080, "10.244.1.7", uint16(i)),
			Status: StatusConfirmed, State: "ESTABLISHED", Seen: now,
		}
		e.Reply.DstPort = uint16(i)
		e.Reply.Src = netip.AddrFrom4([4]byte{10, 244, byte(i >> 16), byte(i >> 8)})
		tab.ended(e)
	}
	// As they came, then indexed by a question.
	for _, state := range []string{"unindexed", "indexed"} {
		if state == "indexed" {
			tab.catchUp()
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		// The ring and its index are mapped, off the heap.
		per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)+int64(tab.mem.mapped())) / n
		t.Logf("%d entries, %s: %.0f bytes per entry (%.0f of them mapped)", n, state, per, float64(tab.mem.mapped())/n)
		if held := tab.len(); held != n {
			t.Fatalf("%d entries held", held)
		}
		// 104 bytes an end in the ring, 32 in the index, in arrays
		// sized to a power of two; a map of nodes took about 400.
		if per > 256 {
			t.Errorf("%s: %.0f bytes per entry, want at most 256", state, per)
		}
		if heap := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n; heap > 16 {
			t.Errorf("%s: %.0f bytes per entry on the heap, want the ring and index off it", state, heap)
		}
	}
	runtime.KeepAlive(tab)
}

// TestHistoryOfAReusedTuple: three connections from one source port, one
// after the other, are three entries; they are listed newest first with
// their own state, after what dst held, and the list stops where the
// table forgot an entry.
func TestHistoryOfAReusedTuple(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newTable(100, time.Minute)
	conn := func(status uint32, state string, at time.Duration) Entry {
		e := dnatEntry(1, status)
		e.State, e.Seen = state, now.Add(at)
		return e
	}
	first, second, third := conn(StatusSeenReply, "CLOSE", 0), conn(StatusSeenReply, "TIME_WAIT", time.Second), conn(0, "SYN_SENT", 2*time.Second)
	tab.ended(first)
	tab.ended(second)
	tab.ended(third)
	if e, ok := tab.lookup(first.Orig, now.Add(2*time.Second)); !ok || e.State != "SYN_SENT" || !e.Destroyed {
		t.Fatalf("lookup: %+v %v, want the third connection", e, ok)
	}
	kept := Entry{State: "kept"}
	h := tab.appendDestroyed([]Entry{kept}, first.Orig, now.Add(2*time.Second))
	if len(h) != 4 || h[0] != kept {
		t.Fatalf("ended after one kept entry: %d entries, want 4: %+v", len(h), h)
	}
	for i, want := range []string{"SYN_SENT", "TIME_WAIT", "CLOSE"} {
		if e := h[i+1]; e.State != want || !e.Destroyed {
			t.Errorf("destroyed[%d] = %s destroyed=%v, want %s destroyed", i, e.State, e.Destroyed, want)
		}
	}
	if r := tab.appendDestroyed(nil, first.Reply, now); len(r) != 0 {
		t.Errorf("a reply tuple has no history of its own: %+v", r)
	}
	// The first is pruned first (ended earliest): the chain ends at the
	// second.
	tab.prune(now.Add(time.Minute + time.Second/2))
	if h := tab.appendDestroyed(nil, first.Orig, now.Add(time.Minute+time.Second/2)); len(h) != 2 || h[1].State != "TIME_WAIT" {
		t.Errorf("after pruning the first entry: %+v", h)
	}
}
