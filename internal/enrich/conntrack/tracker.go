// Package conntrack keeps a copy of one network namespace's conntrack table,
// kept current by conntrack netlink events, so the joiner can find the
// connection a kernel decision belongs to (by either of its tuples), see
// whether it was ever replied to, and still find it shortly after the kernel
// destroyed it. A targeted tracker (Options.Targeted, what the live pipeline
// runs) keeps only the destroyed entries and asks the kernel for a live one
// when it is looked up.
//
// Lost events are never silent: when the event socket overruns (ENOBUFS),
// the overrun is counted and the table is rebuilt from a fresh dump while
// events keep flowing (a targeted tracker has no live copy to rebuild).
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
	// Overruns counts ENOBUFS on the event socket: the kernel dropped
	// events because the tracker did not read fast enough.
	Overruns uint64
	// Redumps counts the table rebuilds that recovered from overruns.
	Redumps uint64
	// DroppedUpdates counts changes not delivered on Updates because its
	// consumer was behind; the table itself has them.
	DroppedUpdates uint64
	// Entries is the number of entries held (live and destroyed);
	// Destroyed is how many of them are destroyed ones kept for late joins.
	Entries   int
	Destroyed int
	// Evicted counts entries forgotten because the table was full.
	Evicted uint64
	// QueryErrors counts the kernel queries of targeted lookups that
	// failed (the lookup then answered from the destroyed entries).
	QueryErrors uint64
	// SourceDumpsSkipped counts BySource calls of a targeted tracker
	// answered from the destroyed entries alone, because the kernel dumps
	// had taken their share of the time (dumpBudget).
	SourceDumpsSkipped uint64
	// DecodeErrors counts event messages that could not be parsed.
	DecodeErrors uint64
	// LastDump is how long the most recent full dump took to read and
	// apply, and DumpedEntries how many entries it had.
	LastDump      time.Duration
	DumpedEntries int
	// KernelLookups counts the entries asked of the KernelTable;
	// KernelLookupsOff says why it answers none ("" while it answers,
	// and without Options.Kernel).
	KernelLookups    uint64
	KernelLookupsOff string
	// Err is the error that stopped the event reader, if any: the table
	// is no longer kept current.
	Err string
}

// Options tune a Tracker. Zero values take the defaults.
type Options struct {
	// MaxEntries bounds the table (live and destroyed). Default 1,000,000.
	MaxEntries int
	// MaxDestroyed bounds the destroyed entries kept for late joins.
	// Default 65,536.
	MaxDestroyed int
	// Retention is how long a destroyed entry stays resolvable. Default 2m.
	Retention time.Duration
	// UpdateBuffer is the capacity of the Updates channel. Default 4096.
	UpdateBuffer int
	// NoUpdates is for a caller that never reads Updates: no change is
	// copied to it (the channel only closes when the tracker stops). A
	// busy node's DESTROYs would otherwise fill it and then be counted
	// as dropped, one failed send each.
	NoUpdates bool
	// ReadBuffer sets the event socket's receive buffer in bytes (the
	// kernel doubles it, caps it at net.core.rmem_max and enforces a
	// minimum). Default 4 MiB, so that bursts of new connections overrun
	// less often; tests make it tiny to force overruns.
	ReadBuffer int

	// Targeted keeps only destroyed entries from events, subscribing to
	// DESTROY alone, and asks the kernel for a live entry each time one is
	// looked up (a ctnetlink GET of the tuple; BySource a dump the kernel
	// filters by source). The kernel then builds one event message per
	// connection, not one per state change, and the tracker decodes no
	// event of a connection nobody looks up. Overruns are counted; there
	// is nothing to re-dump (live entries are always asked for), and the
	// DESTROYs lost in one are lost.
	Targeted bool

	// FedDestroys (with Targeted) opens no event socket at all: the
	// caller hands the tracker each entry's end as the kernel side
	// reported it (Ended), which spares the kernel a netlink message per
	// connection. The ends it does not hand over are lost to it, as
	// DESTROYs lost in an overrun are; the caller counts them.
	FedDestroys bool

	// Kernel (with Targeted) opens a KernelTable to ask in place of
	// netlink GETs for what it answers. When it cannot be opened, or
	// once it fails, the GETs answer everything; Stats says why.
	Kernel func() (KernelTable, error)

	// pruneEvery overrides how often destroyed entries are pruned (tests
	// with a fake clock).
	pruneEvery time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxEntries <= 0 {
		o.MaxEntries = 1_000_000
	}
	if o.MaxDestroyed <= 0 {
		o.MaxDestroyed = 65536
	}
	if o.MaxDestroyed > o.MaxEntries {
		o.MaxDestroyed = o.MaxEntries
	}
	if o.Retention <= 0 {
		o.Retention = 2 * time.Minute
	}
	if o.pruneEvery <= 0 {
		o.pruneEvery = pruneInterval(o.Retention)
	}
	if o.UpdateBuffer <= 0 {
		o.UpdateBuffer = 4096
	}
	if o.NoUpdates {
		o.UpdateBuffer = 0
	}
	return o
}

// Tracker is a live copy of one namespace's conntrack table.
type Tracker struct {
	src  source
	opts Options
	now  func() time.Time

	mu  sync.RWMutex
	tab *table

	updates chan Entry
	// queue carries changes from the reader to the applier; an overrun is
	// a marker in it, so the re-dump happens after every change received
	// before the overrun was applied and before any received after it.
	queue chan item

	// drainer is a targeted tracker's source; rx makes each drain see
	// every event queued before it started.
	drainer drainer
	rx      sync.Mutex
	stopped bool // under rx: Updates is closed, nothing is applied any more
	// drained and published are drain's and applyEach's scratch (under
	// rx for a targeted tracker, whose only applier is drain).
	drained   []change
	published []Entry

	overruns, redumps, dropped atomic.Uint64
	queryErrors                atomic.Uint64
	// sourceDumps bounds BySource's dumps; sourceDumpsSkipped counts those
	// it refused.
	sourceDumps        dumpBudget
	sourceDumpsSkipped atomic.Uint64
	lastDump           atomic.Int64
	dumped             atomic.Int64
	errMu              sync.Mutex
	err                error

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

type item struct {
	changes []change
	overrun bool
}

// Open dumps the conntrack table of the namespace at netnsPath ("" for the
// caller's) and keeps it current from events until ctx ends or Close.
func Open(ctx context.Context, netnsPath string) (*Tracker, error) {
	return OpenWith(ctx, netnsPath, Options{})
}

// OpenWith is Open with options.
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
	if opts.Targeted && opts.Kernel != nil {
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

// start builds a tracker on any source: the initial dump, then the reader
// and applier goroutines.
func start(ctx context.Context, src source, opts Options, now func() time.Time) (*Tracker, error) {
	opts = opts.withDefaults()
	t := &Tracker{
		src:     src,
		opts:    opts,
		now:     now,
		tab:     newTable(opts.MaxEntries, opts.MaxDestroyed, opts.Retention),
		updates: make(chan Entry, opts.UpdateBuffer),
		queue:   make(chan item, 1024),
		done:    make(chan struct{}),
	}
	if opts.FedDestroys && !opts.Targeted {
		return nil, errors.New("conntrack tracker: ends can be fed to a targeted tracker only")
	}
	ctx, t.cancel = context.WithCancel(ctx)
	switch {
	case opts.FedDestroys:
		go t.pruneLoop(ctx)
	case opts.Targeted:
		d, ok := src.(drainer)
		if !ok {
			return nil, errors.New("targeted conntrack tracker: the source cannot be drained")
		}
		t.drainer = d
		go t.waitLoop()
		go t.pruneLoop(ctx)
	default:
		if err := t.dump(false); err != nil {
			return nil, err
		}
		readerDone := make(chan struct{})
		go t.read(readerDone)
		go t.apply(ctx, readerDone)
	}
	go func() {
		<-ctx.Done()
		t.Close()
	}()
	return t, nil
}

// dump reads the whole table and replaces the live entries with it. Dumps
// can fail transiently while the table changes under them (the kernel
// flags an interrupted dump), so it retries a few times.
func (t *Tracker) dump(redump bool) error {
	start := time.Now()
	var entries []Entry
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		entries, err = t.src.Dump()
		if err == nil {
			break
		}
	}
	if err != nil {
		return err
	}
	now := t.now()
	for i := range entries {
		entries[i].Seen = now
	}
	t.mu.Lock()
	changed := t.tab.replace(entries, now)
	t.mu.Unlock()
	t.lastDump.Store(int64(time.Since(start)))
	t.dumped.Store(int64(len(entries)))
	if redump {
		t.redumps.Add(1)
		for _, e := range changed {
			t.publish(e)
		}
	}
	return nil
}

// read is the only goroutine on the event socket. It never waits for the
// Updates consumer; it can wait for the applier, and if that makes the
// kernel drop events the overrun is caught and repaired like any other.
func (t *Tracker) read(done chan struct{}) {
	defer close(done)
	for {
		ch, err := t.src.Receive()
		switch {
		case errors.Is(err, errClosed):
			return
		case errors.Is(err, errOverrun):
			t.overruns.Add(1)
			if !t.enqueue(item{overrun: true}) {
				return
			}
			continue
		case err != nil:
			t.setErr(err)
			return
		}
		if len(ch) > 0 && !t.enqueue(item{changes: ch}) {
			return
		}
	}
}

func (t *Tracker) enqueue(it item) bool {
	select {
	case t.queue <- it:
		return true
	case <-t.done:
		return false
	}
}

// apply owns the table's writes: events, re-dumps and pruning.
func (t *Tracker) apply(ctx context.Context, readerDone chan struct{}) {
	defer close(t.updates)
	prune := time.NewTicker(t.opts.pruneEvery)
	defer prune.Stop()
	// A redump whose dump fails is tried again after a pause, longer
	// each time, rather than leave the table stale until the next
	// overrun; after redumpTries failures in a row only a new overrun
	// tries again, and Stats.Err says the table is not kept current.
	var retry <-chan time.Time
	failed := 0
	redumped := func(err error) {
		retry = nil
		if err == nil {
			failed = 0
			return
		}
		if failed++; failed >= redumpTries {
			t.setErr(fmt.Errorf("redump after overrun, %d tries: %w", failed, err))
			return
		}
		retry = time.After(redumpPause << (failed - 1))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-readerDone:
			// Drain what the reader queued before it stopped.
			for {
				select {
				case it := <-t.queue:
					t.handle(it)
				default:
					return
				}
			}
		case <-prune.C:
			t.prune()
		case <-retry:
			redumped(t.handle(item{overrun: true}))
		case it := <-t.queue:
			if err := t.handle(it); it.overrun {
				redumped(err)
			}
		}
	}
}

// redumpTries is how many times in a row a redump is tried, redumpPause
// apart and doubling, before the tracker says it stopped keeping the
// table current: pauses of 100 to 800 ms, 1.5 s in all.
const (
	redumpTries = 5
	redumpPause = 100 * time.Millisecond
)

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

// handle applies it; an overrun redumps, and handle gives the redump's
// error.
func (t *Tracker) handle(it item) error {
	if it.overrun {
		// Coalesce overruns already queued behind this one: one dump
		// repairs them all, as long as it starts after they happened.
	drain:
		for {
			select {
			case next := <-t.queue:
				if !next.overrun {
					// Changes queued before the dump starts are
					// older than it: applying them first lets the
					// dump have the last word.
					t.applyChanges(next.changes)
				}
			default:
				break drain
			}
		}
		return t.dump(true)
	}
	t.applyChanges(it.changes)
	return nil
}

func (t *Tracker) applyChanges(ch []change) {
	t.applyEach(ch, func(c change) (Entry, bool) {
		if c.destroy {
			return t.tab.destroy(c.entry), true
		}
		return t.tab.upsert(c.entry, false)
	})
}

// applyEach stamps each change with now and applies it with one under the
// table's lock, then publishes the entries one says changed.
func (t *Tracker) applyEach(ch []change, one func(change) (Entry, bool)) {
	now := t.now()
	out := t.published[:0]
	t.mu.Lock()
	for _, c := range ch {
		c.entry.Seen = now
		if e, changed := one(c); changed && !t.opts.NoUpdates {
			out = append(out, e)
		}
	}
	t.mu.Unlock()
	for _, e := range out {
		t.publish(e)
	}
	t.published = scratch(out)
}

// prune forgets the destroyed entries past the retention.
func (t *Tracker) prune() {
	t.mu.Lock()
	t.tab.prune(t.now())
	t.mu.Unlock()
}

// publish never blocks: the joiner being slow must not stall the table.
func (t *Tracker) publish(e Entry) {
	if t.opts.NoUpdates {
		return
	}
	select {
	case t.updates <- e:
	default:
		t.dropped.Add(1)
	}
}

func (t *Tracker) setErr(err error) {
	t.errMu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.errMu.Unlock()
}

// Lookup finds the entry whose original or reply tuple is tu (proto
// included), live or destroyed within the retention.
func (t *Tracker) Lookup(tu event.Tuple) (Entry, bool) {
	tu.Src, tu.Dst = unmap(tu.Src), unmap(tu.Dst)
	if t.opts.Targeted {
		if e, ok := t.get(tu); ok {
			return e, true
		}
		// A DESTROY the kernel sent before it said it has no such
		// entry is in the table once drained.
		t.drain()
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.tab.lookup(tu, t.now())
}

// LookupAll is Lookup of every tuple, answered into entries and found (as
// long as tus; IPv4-mapped addresses in tus are unmapped in place). A
// targeted tracker asks the kernel for all of them together
// (getter.getAll: 3.4-3.6 µs an entry against 5.8-5.9 one GET at a time,
// BenchmarkPrivGetAll), then reads the DESTROYs queued by then, even with
// no tuples, and looks for the missed ones among them as Lookup does.
// AppendDestroyedRead answers from that read.
func (t *Tracker) LookupAll(tus []event.Tuple, entries []Entry, found []bool) {
	for i := range tus {
		tus[i].Src, tus[i].Dst = unmap(tus[i].Src), unmap(tus[i].Dst)
	}
	clear(found)
	if t.opts.Targeted {
		t.getAll(tus, entries, found)
		t.drain()
		if !slices.Contains(found, false) {
			return
		}
	}
	now := t.now()
	t.mu.RLock()
	defer t.mu.RUnlock()
	for i, tu := range tus {
		if !found[i] {
			entries[i], found[i] = t.tab.lookup(tu, now)
		}
	}
}

// getAll asks the kernel for the tuples' live entries (targeted lookups);
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

// get asks the kernel for tu's live entry (targeted lookups).
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

// Destroyed lists the destroyed entries whose original tuple is tu,
// newest first, within the retention: the earlier connections of a tuple
// a client reused its source port for. It asks the kernel nothing; a
// targeted tracker first applies the DESTROYs queued on its socket.
func (t *Tracker) Destroyed(tu event.Tuple) []Entry {
	if t.opts.Targeted {
		t.drain()
	}
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
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.tab.appendDestroyed(dst, tu, t.now())
}

// Updates delivers every change after Open (and the changes a re-dump
// found). It is closed when the tracker stops.
func (t *Tracker) Updates() <-chan Entry { return t.updates }

// Stats returns the counters.
func (t *Tracker) Stats() Stats {
	t.mu.RLock()
	live, dead := t.tab.len()
	evicted := t.tab.evicted
	t.mu.RUnlock()
	s := Stats{
		Overruns:           t.overruns.Load(),
		Redumps:            t.redumps.Load(),
		DroppedUpdates:     t.dropped.Load(),
		Entries:            live + dead,
		Destroyed:          dead,
		Evicted:            evicted,
		QueryErrors:        t.queryErrors.Load(),
		SourceDumpsSkipped: t.sourceDumpsSkipped.Load(),
		LastDump:           time.Duration(t.lastDump.Load()),
		DumpedEntries:      int(t.dumped.Load()),
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

// Close stops the tracker and closes its sockets. Updates is closed once
// the applier has stopped.
func (t *Tracker) Close() error {
	t.closeOnce.Do(func() {
		close(t.done)
		if t.cancel != nil {
			t.cancel()
		}
		if t.opts.FedDestroys {
			t.rx.Lock()
			t.stopped = true
			close(t.updates)
			t.rx.Unlock()
		}
		if err := t.src.Close(); err != nil {
			t.closeErr = fmt.Errorf("close conntrack tracker: %w", err)
		}
	})
	return t.closeErr
}

// BySource lists the connections whose original direction leaves from src:
// how a reply from the wrong five-tuple is tied to the client connection it
// was meant for.
func (t *Tracker) BySource(proto uint8, src netip.AddrPort) []Entry {
	src = netip.AddrPortFrom(unmap(src.Addr()), src.Port())
	var live []Entry
	if t.opts.Targeted {
		if start := t.now(); t.sourceDumps.take(start) {
			live = t.dumpSource(proto, src)
			t.sourceDumps.spend(t.now().Sub(start))
		} else {
			t.sourceDumpsSkipped.Add(1)
		}
		t.drain()
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return append(live, t.tab.bySource(proto, src, t.now())...)
}

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

// dumpSource asks the kernel for the live entries from src (targeted
// lookups).
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

// drainer is the source of a targeted tracker: Drain hands over every
// change queued now without blocking (errOverrun when the kernel dropped
// some).
type drainer interface {
	Drain(fn func(change)) error
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
	defer func() {
		t.rx.Lock()
		t.stopped = true
		close(t.updates)
		t.rx.Unlock()
	}()
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
	err := t.drainer.Drain(func(c change) { batch = append(batch, c) })
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
	e = t.tab.ended(e)
	t.mu.Unlock()
	t.publish(e)
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

// applyDestroys records a targeted tracker's DESTROYs as the table would
// have had them from every event: the connection's entry, then its end.
// A destroyed entry already held for the tuple is then an earlier
// connection's (the client reused its source port), never this one's.
func (t *Tracker) applyDestroys(ch []change) {
	t.applyEach(ch, func(c change) (Entry, bool) { return t.tab.ended(c.entry), true })
}

// pruneLoop forgets expired destroyed entries (targeted trackers).
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
