// Package conntrack keeps what the joiner needs of one network
// namespace's conntrack table: it asks the kernel for a connection's live
// entry when the joiner looks it up (by either of its tuples), and keeps
// the entries the kernel destroyed for a while, so that a kernel decision
// is still joined with its connection shortly after it ended and a flow
// of an earlier connection of a reused tuple finds its own. The ends come
// from ctnetlink's DESTROY events, or from the kernel side where it
// reports them (Options.FedDestroys).
//
// Lost DESTROYs are never silent: when the event socket overruns
// (ENOBUFS), the overrun is counted; there is no copy of the live table
// to repair, since live entries are always asked for.
package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// Entry is one conntrack entry.
type Entry struct {
	// Orig and Reply are the kernel's tuples. ICMP: SrcPort is the echo
	// id, DstPort type<<8|code, as conntrack keys it.
	Orig, Reply event.Tuple
	// Status is the IPS_* bits as the kernel has them.
	Status uint32
	Mark   uint32
	Zone   uint16
	// State is the TCP state name (SYN_SENT, ESTABLISHED, ...), "" for
	// other protocols.
	State string
	// Replied is set once SEEN_REPLY was seen, and stays set.
	Replied   bool
	Destroyed bool
	// Seen is when the tracker last saw the entry change (or destroyed).
	Seen time.Time
}

// Stats are the tracker's counters since Open.
type Stats struct {
	// Overruns counts ENOBUFS on the DESTROY event socket: the kernel
	// dropped DESTROYs because the tracker did not read fast enough.
	Overruns uint64
	// Entries is the number of ended entries held for late joins.
	Entries int
	// Evicted counts entries forgotten because the table was full.
	Evicted uint64
	// EvictedEarly counts those of them that had ended less than
	// Options.Wait before (before the join's clock, when it said it and is
	// behind: Progress): a flow finishing then may have gone without
	// its entry. The others' flows had been written, unless an event after
	// the connection's end (a late reset or ICMP error) started one.
	EvictedEarly uint64
	// QueryErrors counts the kernel queries of lookups that failed (the
	// lookup then answered from the ended entries).
	QueryErrors uint64
	// SourceDumpsSkipped counts BySource calls answered from the newest
	// ended entries alone, because the kernel dumps and the walks of
	// every end had taken their share of the time (dumpBudget).
	SourceDumpsSkipped uint64
	// DecodeErrors counts event messages that could not be parsed.
	DecodeErrors uint64
	// KernelLookups counts the entries asked of the KernelTable;
	// KernelLookupsOff says why it answers none ("" while it answers,
	// and without Options.Kernel).
	KernelLookups    uint64
	KernelLookupsOff string
	// Err is the error that stopped the DESTROY reader, if any: the ends
	// of connections are no longer taken in.
	Err string
}

// Options tune a Tracker. Zero values take the defaults.
type Options struct {
	// MaxEntries bounds the ended entries kept for late joins; the oldest
	// go first, but for those a flow may still ask for (ended less than
	// Wait before), which stay up to MaxWaited. Default 65,536: 8.5 MiB
	// when full, which a node making 550 connections a second fills
	// within the retention.
	MaxEntries int
	// MaxWaited bounds the ended entries held while the oldest are
	// younger than Wait: a flood's. Default 524,288 (68 MiB when full):
	// the ends of 1.6 s at 320,000 connections a second.
	MaxWaited int
	// Retention is how long an ended entry stays resolvable. Default 2m.
	Retention time.Duration
	// Wait is the most a flow asks for its entry after the entry ended,
	// as a joiner does: its linger and one tick of its clock. Default
	// 1.6 s, the joiner's default linger (1.5 s) and the live pipeline's
	// 100-ms tick.
	Wait time.Duration
	// ReadBuffer sets the event socket's receive buffer in bytes (the
	// kernel doubles it, caps it at net.core.rmem_max and enforces a
	// minimum). Default 4 MiB, so that bursts of new connections overrun
	// less often; tests make it tiny to force overruns.
	ReadBuffer int

	// FedDestroys opens no event socket at all: the
	// caller hands the tracker each entry's end as the kernel side
	// reported it (Ended), which spares the kernel a netlink message per
	// connection. The ends it does not hand over are lost to it, as
	// DESTROYs lost in an overrun are; the caller counts them.
	FedDestroys bool

	// Kernel opens a KernelTable to ask in place of
	// netlink GETs for what it answers. When it cannot be opened, or
	// once it fails, the GETs answer everything; Stats says why.
	Kernel func() (KernelTable, error)

	// pruneEvery overrides how often ended entries are pruned (tests
	// with a fake clock).
	pruneEvery time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxEntries <= 0 {
		o.MaxEntries = 1 << 16
	}
	if o.MaxWaited <= 0 {
		o.MaxWaited = 1 << 19
	}
	if o.Wait <= 0 {
		o.Wait = 1600 * time.Millisecond
	}
	if o.Retention <= 0 {
		o.Retention = 2 * time.Minute
	}
	if o.pruneEvery <= 0 {
		o.pruneEvery = pruneInterval(o.Retention)
	}
	return o
}

// Tracker answers one namespace's conntrack lookups: live entries from
// the kernel, ended ones from its table.
type Tracker struct {
	src  source
	opts Options
	now  func() time.Time

	// mu guards tab, whose questions write too (table.catchUp).
	mu  sync.Mutex
	tab *table

	// drainer is the DESTROY socket (nil when the ends are fed); rx
	// makes each drain see every event queued before it started.
	drainer drainer
	rx      sync.Mutex
	stopped bool // under rx: nothing is applied any more
	// drained is drain's scratch, under rx.
	drained []Entry

	overruns    atomic.Uint64
	queryErrors atomic.Uint64
	// sourceDumps bounds BySource's dumps; sourceDumpsSkipped counts those
	// it refused.
	sourceDumps        dumpBudget
	sourceDumpsSkipped atomic.Uint64
	errMu              sync.Mutex
	err                error

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// OpenWith opens a tracker of the namespace at netnsPath ("" for the
// caller's), which answers until ctx ends or Close.
func OpenWith(ctx context.Context, netnsPath string, opts Options) (*Tracker, error) {
	if opts.ReadBuffer <= 0 {
		opts.ReadBuffer = 4 << 20
	}
	var src *netlinkSource
	err := withNetns(netnsPath, func(nsFD int) (err error) {
		src, err = dialNetlink(nsFD, opts.ReadBuffer, opts)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open conntrack tracker: %w", err)
	}
	if opts.Kernel != nil {
		src.kernel, src.kernelErr = openKernelLookups(netnsPath, opts.Kernel)
	}
	t, err := start(ctx, src, opts, time.Now)
	if err != nil {
		src.Close()
		return nil, fmt.Errorf("open conntrack tracker: %w", err)
	}
	return t, nil
}

// withNetns calls fn with an fd of the namespace at path, or 0 for the
// caller's own (path ""). The sockets fn opens there keep the namespace
// alive; the fd is only needed to create them.
func withNetns(path string, fn func(nsFD int) error) error {
	if path == "" {
		return fn(0)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open namespace %s: %w", path, err)
	}
	defer unix.Close(fd)
	return fn(fd)
}

// start builds a tracker on any source, with its wait loop on the
// DESTROY socket (unless the ends are fed) and its pruning.
func start(ctx context.Context, src source, opts Options, now func() time.Time) (*Tracker, error) {
	opts = opts.withDefaults()
	t := &Tracker{
		src:  src,
		opts: opts,
		now:  now,
		tab:  newTable(opts.MaxEntries, opts.Retention),
		done: make(chan struct{}),
	}
	t.tab.wait, t.tab.maxWaited = opts.Wait, tableCap(max(opts.MaxWaited, t.tab.maxEntries))
	ctx, t.cancel = context.WithCancel(ctx)
	if !opts.FedDestroys {
		d, ok := src.(drainer)
		if !ok {
			return nil, errors.New("conntrack tracker: the source cannot be drained")
		}
		t.drainer = d
		go t.waitLoop()
	}
	go t.pruneLoop(ctx)
	go func() {
		<-ctx.Done()
		t.Close()
	}()
	return t, nil
}

func pruneInterval(retention time.Duration) time.Duration {
	d := retention / 4
	if d < 50*time.Millisecond {
		d = 50 * time.Millisecond
	}
	if d > 10*time.Second {
		d = 10 * time.Second
	}
	return d
}

// Progress tells the tracker the join's clock: it has read the kernel's
// events made before at and finished the flows quiet since at less its
// linger. An end is kept past MaxEntries until at is Wait past it, not
// only the newest end: a join reading late (its ring buffer backed up
// under a flood) asks for its flows' entries late. Without it, ends are
// aged against the newest.
func (t *Tracker) Progress(at time.Time) {
	t.mu.Lock()
	if at.After(t.tab.progress) {
		t.tab.progress = at
	}
	t.mu.Unlock()
}

// prune forgets the ended entries past the retention.
func (t *Tracker) prune() {
	t.mu.Lock()
	t.tab.prune(t.now())
	t.mu.Unlock()
}

func (t *Tracker) setErr(err error) {
	t.errMu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.errMu.Unlock()
}

// Lookup finds the entry whose original or reply tuple is tu (proto
// included): the kernel's live one, or an ended one within the
// retention.
func (t *Tracker) Lookup(tu event.Tuple) (Entry, bool) {
	tu.Src, tu.Dst = unmap(tu.Src), unmap(tu.Dst)
	if e, ok := t.get(tu); ok {
		return e, true
	}
	// A DESTROY the kernel sent before it said it has no such entry is
	// in the table once drained.
	t.drain()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tab.lookup(tu, t.now())
}

// LookupAll is Lookup of every tuple, answered into entries and found (as
// long as tus; IPv4-mapped addresses in tus are unmapped in place). It
// asks the kernel for all of them together
// (getter.getAll: 3.4-3.6 µs an entry against 5.8-5.9 one GET at a time,
// BenchmarkPrivGetAll), then reads the DESTROYs queued by then, even with
// no tuples, and looks for the missed ones among them as Lookup does.
// AppendDestroyedRead answers from that read.
func (t *Tracker) LookupAll(tus []event.Tuple, entries []Entry, found []bool) {
	for i := range tus {
		tus[i].Src, tus[i].Dst = unmap(tus[i].Src), unmap(tus[i].Dst)
	}
	clear(found)
	t.getAll(tus, entries, found)
	t.drain()
	if !slices.Contains(found, false) {
		return
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, tu := range tus {
		if !found[i] {
			entries[i], found[i] = t.tab.lookup(tu, now)
		}
	}
}

// getAll asks the kernel for the tuples' live entries;
// on an error none is found.
func (t *Tracker) getAll(tus []event.Tuple, entries []Entry, found []bool) {
	if err := t.src.GetAll(tus, entries, found); err != nil {
		t.queryErrors.Add(1)
		clear(found)
		return
	}
	now := t.now()
	for i := range entries {
		if found[i] {
			entries[i].Seen = now
			entries[i].Replied = entries[i].Replied || entries[i].Status&StatusSeenReply != 0
		}
	}
}

// get asks the kernel for tu's live entry.
func (t *Tracker) get(tu event.Tuple) (Entry, bool) {
	e, ok, err := t.src.Get(tu)
	if err != nil {
		t.queryErrors.Add(1)
		return Entry{}, false
	}
	e.Seen = t.now()
	e.Replied = e.Replied || e.Status&StatusSeenReply != 0
	return e, ok
}

// Destroyed lists the ended entries whose original tuple is tu,
// newest first, within the retention: the earlier connections of a tuple
// a client reused its source port for. It asks the kernel nothing; it
// first applies the DESTROYs queued on its socket.
func (t *Tracker) Destroyed(tu event.Tuple) []Entry {
	t.drain()
	return t.AppendDestroyedRead(nil, tu)
}

// AppendDestroyedRead appends Destroyed to dst without reading the socket
// first (and without a slice of its own per call): for a
// caller that has had LookupAll read it since it learnt that tu's
// connection had ended (a newer connection's event, or the newer entry a
// GET found). The kernel queues a connection's DESTROY before the entry
// leaves its table, so before any newer entry of the tuple exists, and
// that read holds it: one read per batch instead of one per replaced
// connection.
func (t *Tracker) AppendDestroyedRead(dst []Entry, tu event.Tuple) []Entry {
	tu.Src, tu.Dst = unmap(tu.Src), unmap(tu.Dst)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tab.appendDestroyed(dst, tu, t.now())
}

// Stats returns the counters.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	held := t.tab.len()
	evicted, early := t.tab.evicted, t.tab.evictedEarly
	t.mu.Unlock()
	s := Stats{
		Overruns:           t.overruns.Load(),
		Entries:            held,
		Evicted:            evicted,
		EvictedEarly:       early,
		QueryErrors:        t.queryErrors.Load(),
		SourceDumpsSkipped: t.sourceDumpsSkipped.Load(),
	}
	if dc, ok := t.src.(interface{ decodeErrorCount() uint64 }); ok {
		s.DecodeErrors = dc.decodeErrorCount()
	}
	if ns, ok := t.src.(*netlinkSource); ok {
		s.KernelLookups, s.KernelLookupsOff = ns.kernelState()
	}
	t.errMu.Lock()
	if t.err != nil {
		s.Err = t.err.Error()
	}
	t.errMu.Unlock()
	return s
}

// Close stops the tracker and closes its sockets: nothing is applied
// after it.
func (t *Tracker) Close() error {
	t.closeOnce.Do(func() {
		close(t.done)
		if t.cancel != nil {
			t.cancel()
		}
		t.rx.Lock()
		t.stopped = true
		t.rx.Unlock()
		if err := t.src.Close(); err != nil {
			t.closeErr = fmt.Errorf("close conntrack tracker: %w", err)
		}
	})
	return t.closeErr
}

// BySource lists the connections whose original direction leaves from src:
// how a reply from the wrong five-tuple is tied to the client connection it
// was meant for. The full search, the kernel's table dumped and every end
// kept walked, spends the dumps' share of the time; refused, it walks only
// the newest ends (recentEnds). Every drop of a storm may ask, and after a
// flood the ends kept number hundreds of thousands.
func (t *Tracker) BySource(proto uint8, src netip.AddrPort) []Entry {
	src = netip.AddrPortFrom(unmap(src.Addr()), src.Port())
	start := t.now()
	full := t.sourceDumps.take(start)
	var out []Entry
	limit := recentEnds
	if full {
		out, limit = t.dumpSource(proto, src), 0
	} else {
		t.sourceDumpsSkipped.Add(1)
	}
	t.drain()
	t.mu.Lock()
	out = append(out, t.tab.bySource(proto, src, t.now(), limit)...)
	t.mu.Unlock()
	if full {
		t.sourceDumps.spend(t.now().Sub(start))
	}
	return out
}

// recentEnds is how many of the newest ends BySource walks when the dumps
// have used their share: 4,096 take about 3 µs (BenchmarkBySourceRecent).
const recentEnds = 1 << 12

// dumpBudget keeps the kernel's dumps by source to a share of the time: a
// dump walks the namespace's whole table, so on a node whose table is
// full, where packets drop for want of an entry, one dump per stray
// reply would add load to the node in trouble. Dumps spend credit, which
// comes back at dumpShare of the time passing, up to dumpBurst.
type dumpBudget struct {
	mu     sync.Mutex
	credit time.Duration
	at     time.Time // when credit was last brought up to date
}

const (
	dumpShare = 0.05
	dumpBurst = 250 * time.Millisecond
)

// take brings the credit up to now and says whether a dump may start.
func (b *dumpBudget) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at.IsZero() {
		b.credit = dumpBurst
	} else if passed := now.Sub(b.at); passed > 0 {
		b.credit = min(dumpBurst, b.credit+time.Duration(float64(passed)*dumpShare))
	}
	b.at = now
	return b.credit > 0
}

// spend takes a dump's time from the credit.
func (b *dumpBudget) spend(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.credit -= d
}

// dumpSource asks the kernel for the live entries from src.
func (t *Tracker) dumpSource(proto uint8, src netip.AddrPort) []Entry {
	live, err := t.src.DumpSource(proto, src)
	if err != nil {
		t.queryErrors.Add(1)
		return nil
	}
	now := t.now()
	for i := range live {
		live[i].Seen = now
	}
	return live
}

// drainer is the DESTROY event socket: Drain hands over every DESTROY
// queued now without blocking (errOverrun when the kernel dropped some).
type drainer interface {
	Drain(fn func(Entry)) error
}

// waitLoop applies the DESTROY events as they come, so the socket does
// not overrun between lookups: it drains on a timer, every destroyBatch
// while they come, less often (down to destroyIdle) while none do.
// Nothing waits in a system call for them: a thread parked in poll(2)
// is one the Go scheduler hands its processor away from when it parks
// and takes one back for when it wakes, and its runtime monitor then
// looks every 20 µs for a while. In the benchmark's full live pipeline
// (6,000 to 7,000 connections a second) the process's threads switched
// out about 1,920 times a second with the wait in poll(2), 1,370 on the
// timer.
func (t *Tracker) waitLoop() {
	wait := destroyBatch
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-timer.C:
		}
		n, err := t.drain()
		if err != nil {
			return
		}
		wait = nextWait(wait, n)
		timer.Reset(wait)
	}
}

// destroyBatch is how long the wait loop lets DESTROY events gather
// before it reads them while they come: a wakeup per batch rather than
// per connection, which cost the benchmark's pipeline about 4 µs per
// connection. A batch of 5 ms at 100,000 connections/s is 500 events,
// about 100 KiB of the socket's buffer; lookups drain the socket
// themselves, so none waits for a batch. destroyIdle is the longest it
// waits when none came: a burst after a quiet time fills at most that
// much of the buffer (4 MiB by default) before the first read.
const (
	destroyBatch = 5 * time.Millisecond
	destroyIdle  = 20 * time.Millisecond
)

// nextWait is the wait loop's next interval after one that took read
// events: back to destroyBatch when some came, twice as long (up to
// destroyIdle) when none did.
func nextWait(wait time.Duration, read int) time.Duration {
	if read > 0 {
		return destroyBatch
	}
	return min(2*wait, destroyIdle)
}

// drain applies every event queued now, and says how many. Overruns are
// counted: there is no live copy to repair, and the DESTROYs lost in one
// stay lost. err is the source's failure, which the tracker's error
// reports too; nothing more can be read after it.
func (t *Tracker) drain() (int, error) {
	if t.drainer == nil {
		return 0, nil // fed: every end handed over is applied already
	}
	t.rx.Lock()
	defer t.rx.Unlock()
	if t.stopped {
		return 0, nil
	}
	batch := t.drained[:0]
	err := t.drainer.Drain(func(e Entry) { batch = append(batch, e) })
	// The overrun is counted before the DESTROYs read after it apply, so
	// whoever sees those sees the loss too.
	switch {
	case errors.Is(err, errOverrun):
		t.overruns.Add(1)
		err = nil
	case errors.Is(err, errClosed):
		err = nil
	case err != nil:
		t.setErr(err)
	}
	n := len(batch)
	if n > 0 {
		t.applyDestroys(batch)
	}
	t.drained = scratch(batch)
	return n, err
}

// maxScratch bounds the batches a tracker keeps for its next drain: a
// burst after a stall need not stay in memory.
const maxScratch = 4096

// scratch is s emptied for reuse, or nil when it grew past maxScratch.
func scratch[S ~[]E, E any](s S) S {
	if cap(s) > maxScratch {
		return nil
	}
	clear(s)
	return s[:0]
}

// Ended applies the end of a connection the kernel side reported
// (EndOf an event.KindCTDestroy) to a tracker opened with FedDestroys.
// The caller hands the ends over in the order the ring buffer gave them,
// among the decisions: an earlier connection's end then always comes
// before a newer connection of its tuple is joined, as a DESTROY read
// before the newer entry was asked for does.
func (t *Tracker) Ended(e Entry) {
	if e.Seen.IsZero() {
		e.Seen = t.now()
	}
	t.rx.Lock()
	defer t.rx.Unlock()
	if t.stopped {
		return
	}
	t.mu.Lock()
	t.tab.ended(e)
	t.mu.Unlock()
}

// EndOf is the entry a kernel-side conntrack end (event.KindCTDestroy)
// reports, as ctnetlink's DESTROY event has it (the kernel marks the
// entry DYING as it deletes it, after the program read its status), seen
// when the kernel ended it.
func EndOf(ev event.Event) Entry {
	e := Entry{Orig: ev.Orig, Reply: ev.Reply, Status: ev.CTStatus | StatusDying, Mark: ev.CTMark, Zone: ev.CTZone, Seen: ev.Time}
	e.Orig.Src, e.Orig.Dst = unmap(e.Orig.Src), unmap(e.Orig.Dst)
	e.Reply.Src, e.Reply.Dst = unmap(e.Reply.Src), unmap(e.Reply.Dst)
	if ev.HasReason && ev.Orig.Proto == 6 {
		e.State = TCPStateName(uint8(ev.Reason))
	}
	e.Replied = e.Status&StatusSeenReply != 0
	return e
}

// applyDestroys records the DESTROYs read, each seen now. A destroyed
// entry already held for the tuple is an earlier connection's (the
// client reused its source port), never this one's.
func (t *Tracker) applyDestroys(ends []Entry) {
	now := t.now()
	t.mu.Lock()
	for _, e := range ends {
		e.Seen = now
		t.tab.ended(e)
	}
	t.mu.Unlock()
}

// pruneLoop forgets expired ended entries.
func (t *Tracker) pruneLoop(ctx context.Context) {
	prune := time.NewTicker(t.opts.pruneEvery)
	defer prune.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-prune.C:
			t.prune()
		}
	}
}
