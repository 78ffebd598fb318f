// Package live runs the tracer on a node: kernel events from the loader,
// joined with conntrack, node state and metadata into diagnosed flows. The
// trace command, the UI and the lab all drive it.
package live

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/conntrack"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/enrich/node"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Config is what to observe and with which metadata.
type Config struct {
	Loader loader.Config
	// NetnsPath is the observed node's namespace, for conntrack and node
	// state ("" is the caller's).
	NetnsPath string
	// PeerNetns are further namespaces whose conntrack the join reads (a
	// client's, to tie a stray reply to its connection); the loader must
	// observe them too.
	PeerNetns []string
	NodeName  string
	// Metadata names pods and Services; nil runs without.
	Metadata enrich.Metadata
	// MetadataSnapshot records the metadata in the trace header.
	MetadataSnapshot func() ([]trace.Pod, []trace.Service)
	// MetadataOnChange has the index tell of each change of what
	// MetadataSnapshot lists, so the trace records it with its time.
	MetadataOnChange func(func(time.Time, *trace.MetadataChange))
	// MetadataWarnings are shown in the header and the UI (API server
	// unreachable, ...).
	MetadataWarnings func() []string
	// Linger is how long a flow waits for more of its events.
	Linger time.Duration
	// OnHookChange, when set, is told each time a hook is lost or attached
	// while tracing (a module unloaded or loaded), on Run's goroutine.
	OnHookChange func(trace.HookChange)
	// Command and Filter are recorded in the trace header: the command
	// line that started the trace and its filter expression.
	Command string
	Filter  string
	// FlowsNotKept promises that Run's Sink.Flow keeps neither a flow nor a
	// pointer into it once it returns (it writes or copies the flow), so
	// the join may reuse the flow's memory (join.Joiner.ReuseFlows).
	FlowsNotKept bool
}

// Stats are the running counters the UI header shows.
type Stats struct {
	Events       uint64
	Flows        uint64
	DecodeErrors uint64
	Lost         uint64
	// ConntrackOverruns counts the times the kernel dropped DESTROY
	// events because a tracker read too slowly (ENOBUFS): the ends of the
	// connections they were for are missing from the joins.
	ConntrackOverruns uint64
	// ConntrackEndsEvicted counts ended entries a tracker's full table
	// forgot within a flow's linger and tick of their end, when a flow
	// may still have asked for them (conntrack.Stats.EvictedEarly).
	ConntrackEndsEvicted uint64
	// ConntrackSourceDumpsSkipped counts stray replies whose client
	// connection was looked for among the newest ended entries only: the
	// full searches (the kernel's table dumped, every end kept walked)
	// had used their share of the time.
	ConntrackSourceDumpsSkipped uint64
	// ConntrackDrops counts packets conntrack itself dropped in the
	// observed namespace since the start (its "drop" counter).
	ConntrackDrops uint64
	// ConntrackKernelLookups counts the conntrack entries asked for by
	// BPF rather than netlink GETs; ConntrackLookupsOff says why a
	// tracker asks by netlink alone ("" when none does).
	ConntrackKernelLookups uint64
	ConntrackLookupsOff    string
	// Node is the node watcher's work (zero when nothing is watched).
	Node node.WatchStats
}

// Pipeline is the attached, running tracer.
type Pipeline struct {
	cfg    Config
	tracer *loader.Tracer
	ct     multiConntrack
	// ctSources say how each tracker of ct began to read its table.
	ctSources []trace.ConntrackSource
	// fed are the trackers the kernel side reports conntrack entries'
	// ends to (event.KindCTDestroy), by their namespace's inode.
	fed map[uint32]*conntrack.Tracker
	// counters are the observed namespace's conntrack counters; nil when
	// they cannot be read.
	counters      *conntrack.Counters
	countersNetns uint32 // the inode of the counters' namespace
	watcher       *node.Watcher
	header        trace.Header

	events, flows, decodeErrors atomic.Uint64

	states   *states
	warnings []string
	modules  []moduleState

	closeOnce sync.Once
}

// Start attaches the kernel side and opens conntrack and the node watcher.
// Conntrack or node state that cannot be read is a warning, not a failure:
// the kernel's decisions are still worth showing.
func Start(ctx context.Context, cfg Config) (*Pipeline, error) {
	ctPaths := append([]string{cfg.NetnsPath}, cfg.PeerNetns...)
	ctNetns := netnsInodes(ctPaths)
	cfg.Loader.ConntrackNetns = conntrackNetns(ctNetns)
	tr, err := loader.Open(cfg.Loader)
	if err != nil {
		return nil, err
	}
	if lost := tr.Plan.LostToPrivilege(); len(lost) > 0 {
		tr.Close()
		return nil, fmt.Errorf("attach: %w", loader.SysAdminError(lost))
	}
	p := &Pipeline{cfg: cfg, tracer: tr}
	p.watchModulesFromNow()
	p.states = &states{node: cfg.NodeName, meta: cfg.Metadata, metadata: cfg.MetadataSnapshot, metaWake: make(chan struct{}, 1),
		keep: 2*cfg.Linger + holdUncertain + 10*time.Second}
	if cfg.MetadataOnChange != nil {
		cfg.MetadataOnChange(p.states.metadataChanged)
	}
	// The trackers outlive ctx until Close: Run's last flows, flushed
	// once ctx is done, still ask them for their entries.
	ctCtx := context.WithoutCancel(ctx)
	endsReported := tr.Plan.Serves(event.HookCTDestroy)
	for i, path := range ctPaths {
		opts := ConntrackOptions()
		opts.Wait = cmp.Or(cfg.Linger, join.DefaultLinger) + expiryTick
		ino := ctNetns[i]
		// One tracker of a namespace named twice takes its ends.
		opts.FedDestroys = endsReported && slices.Contains(cfg.Loader.ConntrackNetns, ino) && p.fed[ino] == nil
		ct, err := conntrack.OpenWith(ctCtx, path, opts)
		if err != nil {
			p.warn("conntrack of %s unavailable, its flows carry only what the kernel events say: %v", orCaller(path), err)
			continue
		}
		p.ct = append(p.ct, ct)
		p.ctSources = append(p.ctSources, conntrackSource(path, ino, ct.Stats(), opts.FedDestroys))
		if opts.FedDestroys {
			if p.fed == nil {
				p.fed = map[uint32]*conntrack.Tracker{}
			}
			p.fed[ino] = ct
		}
	}
	p.openCounters()
	if p.watcher, err = node.WatchWith(ctx, cfg.NetnsPath, node.WatchOptions{Poll: statePoll, OnPublish: p.states.publish}); err != nil {
		p.warn("node state unavailable, no rule attribution: %v", err)
		p.watcher = nil
	} else {
		p.states.seed(p.watcher.Current())
	}
	p.header = p.buildHeader()
	return p, nil
}

// conntrackSource says how a tracker opened with stats reads the table of
// the namespace at path: whether its lookups went to BPF, and whether the
// kernel side hands it the entries' ends.
func conntrackSource(path string, ino uint32, stats conntrack.Stats, fed bool) trace.ConntrackSource {
	src := trace.ConntrackSource{Netns: path, Inode: ino, Lookups: trace.LookupsBPF, Ends: trace.EndsDestroyEvents}
	if stats.KernelLookupsOff != "" {
		src.Lookups, src.LookupsWhy = trace.LookupsNetlink, stats.KernelLookupsOff
	}
	if fed {
		src.Ends = trace.EndsKernel
	}
	return src
}

// openCounters opens the observed namespace's conntrack counters and warns
// when the table is nearly full already: new connections are then about
// to be dropped.
func (p *Pipeline) openCounters() {
	path := p.cfg.NetnsPath
	if path == "" {
		path = "/proc/self/ns/net"
	}
	var st unix.Stat_t
	err := unix.Stat(path, &st)
	var c *conntrack.Counters
	if err == nil {
		c, err = conntrack.OpenCounters(p.cfg.NetnsPath, p.states.keep)
	}
	if err != nil {
		p.warn("conntrack counters of %s unavailable, drops by conntrack itself are not named: %v", orCaller(p.cfg.NetnsPath), err)
		return
	}
	p.counters, p.countersNetns = c, uint32(st.Ino)
	if s := c.First(); s.Max > 0 && uint64(s.Entries)*10 >= uint64(s.Max)*9 {
		p.warn("conntrack table of %s is %d%% full (%d of %d entries, net.netfilter.nf_conntrack_max): when it fills, conntrack drops new connections", orCaller(p.cfg.NetnsPath), uint64(s.Entries)*100/uint64(s.Max), s.Entries, s.Max)
	}
}

// netnsInodes are the inodes of the namespaces at paths ("" the
// caller's), 0 where one cannot be read.
func netnsInodes(paths []string) []uint32 {
	out := make([]uint32, len(paths))
	for i, path := range paths {
		if path == "" {
			path = "/proc/self/ns/net"
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil {
			out[i] = uint32(st.Ino)
		}
	}
	return out
}

// conntrackNetns are the namespaces whose conntrack entries' ends the
// kernel side is asked to report: those of the trackers, as many as it
// takes; the others subscribe to ctnetlink's DESTROY events.
func conntrackNetns(inodes []uint32) []uint32 {
	var out []uint32
	for _, ino := range inodes {
		if ino != 0 && !slices.Contains(out, ino) && len(out) < loader.MaxNetns {
			out = append(out, ino)
		}
	}
	return out
}

// ConntrackOptions are the options of the pipeline's conntrack trackers:
// the live entries the join asks for are asked by BPF where the kernel
// can (5.18 and later), by netlink GETs elsewhere.
func ConntrackOptions() conntrack.Options {
	return conntrack.Options{Kernel: openKernelConntrack}
}

func (p *Pipeline) warn(format string, a ...any) {
	p.warnings = append(p.warnings, fmt.Sprintf(format, a...))
}

// Header is the trace header: node, kernel, hook plan, and the snapshot the
// diagnosis starts from.
func (p *Pipeline) Header() trace.Header { return p.header }

// Plan is how every hook is attached.
func (p *Pipeline) Plan() loader.Plan { return p.tracer.Plan }

// Names names this kernel's drop and reset reasons, for events written in
// the trace format (trace.EventOf).
func (p *Pipeline) Names() event.ReasonNamer { return p.tracer.Reasons() }

func (p *Pipeline) buildHeader() trace.Header {
	h := trace.Header{Type: trace.TypeHeader, Schema: trace.Schema, Node: p.cfg.NodeName, Kernel: KernelRelease(),
		Started: time.Now().UTC(), Command: p.cfg.Command, Filter: p.cfg.Filter, Hooks: HookRecords(p.tracer.Plan)}
	st := p.states.latest()
	h.Snapshot = p.snapshotOf(st)
	p.states.recordFrom(st, h.Snapshot)
	h.Warnings = append(h.Warnings, p.warnings...)
	// What the node watcher could not read (a tool missing, a table that
	// does not parse) leaves rules unknown: the reader must be told.
	if st != nil {
		h.Warnings = append(h.Warnings, st.Warnings()...)
	}
	// The env the first flows are diagnosed with has already read the
	// snapshot's rulesets; its warnings are the header's.
	if env, ok := p.states.envAt(time.Now()).(interface{ Warnings() []string }); ok {
		h.Warnings = append(h.Warnings, env.Warnings()...)
	}
	if p.cfg.MetadataWarnings != nil {
		h.Warnings = append(h.Warnings, p.cfg.MetadataWarnings()...)
	}
	h.Conntrack = p.ctSources
	return h
}

// State is the node's state as last read, with the pods and Services the
// metadata holds now: what `tracer audit` walks, without reading the node
// again (the agent's audit).
func (p *Pipeline) State() *trace.Snapshot { return p.snapshotOf(p.states.latest()) }

func (p *Pipeline) snapshotOf(st *node.State) *trace.Snapshot {
	snap := &trace.Snapshot{}
	if st != nil {
		snap = st.Snapshot()
	}
	if p.cfg.MetadataSnapshot != nil {
		snap.Pods, snap.Services = p.cfg.MetadataSnapshot()
	}
	return snap
}

// RecordStates hands each change of the node's state and of the pods and
// Services, from the header's snapshot on, to fn (the trace writers), one
// at a time, on the watcher's goroutine or the metadata's.
func (p *Pipeline) RecordStates(fn func(*trace.StateChange)) { p.states.recordTo(fn) }

// Stats reads the running counters.
func (p *Pipeline) Stats() Stats {
	s := Stats{Events: p.events.Load(), Flows: p.flows.Load(), DecodeErrors: p.decodeErrors.Load()}
	if lost, err := p.tracer.Lost(); err == nil {
		for _, n := range lost {
			s.Lost += n
		}
	}
	cs := p.conntrackStats()
	s.ConntrackOverruns, s.ConntrackSourceDumpsSkipped = cs.Overruns, cs.SourceDumpsSkipped
	s.ConntrackEndsEvicted = cs.EvictedEarly
	s.ConntrackKernelLookups, s.ConntrackLookupsOff = cs.KernelLookups, cs.KernelLookupsOff
	if p.counters != nil {
		s.ConntrackDrops = p.counters.Drops()
	}
	if p.watcher != nil {
		s.Node = p.watcher.Stats()
	}
	return s
}

// conntrackStats sums the trackers' overruns, the ends they forgot early,
// the lookups of stray replies' owners they left out and the entries
// they asked by BPF; KernelLookupsOff is the first tracker's reason to ask
// by netlink alone.
func (p *Pipeline) conntrackStats() conntrack.Stats {
	var sum conntrack.Stats
	for _, ct := range p.ct {
		cs := ct.Stats()
		sum.Overruns += cs.Overruns
		sum.EvictedEarly += cs.EvictedEarly
		sum.SourceDumpsSkipped += cs.SourceDumpsSkipped
		sum.KernelLookups += cs.KernelLookups
		if sum.KernelLookupsOff == "" {
			sum.KernelLookupsOff = cs.KernelLookupsOff
		}
	}
	return sum
}

// decoded is one event read from the ring buffer, or (idle set) the time
// the ring buffer was found empty.
type decoded struct {
	ev   event.Event
	idle time.Time
}

// Sink takes what Run hands out. Flow is required; Event and Flush may
// be nil. Run calls them all on one goroutine of its own, not the
// caller's, beside the one that reads and joins the events.
type Sink struct {
	// Flow takes each finished flow.
	Flow func(*trace.Flow)
	// Event takes each event read, in the order read, with the flows of
	// its expiry round.
	Event func(event.Event)
	// Flush ends a burst: Run calls it after each expiry round (every
	// 100 ms), which finishes most flows, and before it returns. A sink
	// that holds what it writes (trace.Writer's Batch) writes it then, so
	// a flow waits at most one round beyond its linger.
	Flush func()
}

func (s Sink) flush() {
	if s.Flush != nil {
		s.Flush()
	}
}

// Run joins events into flows until ctx is done, handing each finished
// flow and event to sink, then flushes the open flows and returns the
// summary. It detaches the kernel side on the way out.
func (p *Pipeline) Run(ctx context.Context, sink Sink) (trace.Summary, error) {
	evc := make(chan decoded, 512)
	go p.read(evc)
	ran := make(chan struct{})
	defer close(ran)
	stop := context.AfterFunc(ctx, func() { p.drainThenClose(ran) })
	defer stop()

	sum := trace.Summary{Type: trace.TypeSummary}
	j := &join.Joiner{Linger: p.cfg.Linger, Names: p.tracer.Reasons(), ReuseFlows: p.cfg.FlowsNotKept}
	if len(p.ct) > 0 {
		j.CT = p.ct
	}
	if p.counters != nil {
		j.Counters, j.CountersNetns = p.counters, p.countersNetns
	}
	st := newStages(j, &enrich.Enricher{Env: p.states.envAt, EnvAfter: p.states.envAfter, HoldFor: holdUncertain}, sink,
		func() { p.flows.Add(1) })
	tick := time.NewTicker(expiryTick)
	defer tick.Stop()
	var clock eventClock
	var gone error
	lastCheck := time.Now()
	for {
		select {
		case d, ok := <-evc:
			if !ok {
				sum.Flows, sum.Verdicts = st.stop()
				return p.finish(sum), gone
			}
			if !d.idle.IsZero() {
				clock.idle(d.idle)
				continue
			}
			if d.ev.Kind == event.KindCTDestroy {
				// In the ring's order: before any later decision on
				// the entry's tuple is joined.
				p.ended(d.ev)
				continue
			}
			sum.Events++
			st.Add(d.ev, clock.event(d.ev.Time))
		case now := <-tick.C:
			st.Expire(clock.now)
			if gone == nil && now.Sub(lastCheck) >= time.Second {
				lastCheck = now
				p.sampleCounters()
				p.watchModules(now, &sum)
				// Stop reading: the loop drains what was read and ends
				// when the reader has.
				if gone = p.netnsGone(); gone != nil {
					p.tracer.Close()
				}
			}
		}
	}
}

// drainLimit bounds how long a stopping pipeline reads what the kernel
// reported before the stop. A full ring buffer of the default size
// (16 MiB, about 80,000 records) takes the pipeline about 0.3 s at its
// benchmark rate on one core (BENCHMARKS.md, section 4); the rest is room
// for a node busy enough to have filled it.
const drainLimit = 2 * time.Second

// expiryTick is how often the join finishes the flows whose linger is
// over.
const expiryTick = 100 * time.Millisecond

// drainThenClose stops the programs and lets the read loop take in what
// they queued: it ends by itself once the ring buffer is empty. A
// pipeline too far behind to get there in drainLimit of the stop is
// closed, and the events it left are counted (loader's Unread) into the
// summary's lost ones. The limit counts the detach too: closing fentry
// links waits for RCU grace periods (0.7 to 1 s in a 6.1 guest under
// emulation), and the read loop goes on meanwhile. ran is closed when
// Run has returned.
func (p *Pipeline) drainThenClose(ran <-chan struct{}) {
	t := time.NewTimer(drainLimit)
	defer t.Stop()
	detached := make(chan error, 1)
	go func() { detached <- p.tracer.Detach() }()
	select {
	case err := <-detached:
		if err != nil {
			p.tracer.Close()
			return
		}
	case <-t.C:
		// Close waits for the detach, and stops the read loop at once.
		p.tracer.Close()
		return
	case <-ran:
		return
	}
	select {
	case <-t.C:
		p.tracer.Close()
	case <-ran:
	}
}

// ErrNetnsGone: the observed namespace's path was removed (`ip netns
// del`, a pod torn down) or now names another namespace. Nothing will be
// observed there again through it; a namespace whose processes live on
// can still be traced through /proc/PID/ns/net.
var ErrNetnsGone = errors.New("the observed network namespace is gone")

// netnsGone reports whether --netns no longer names the namespace the
// tracer attached to.
func (p *Pipeline) netnsGone() error {
	path := p.cfg.NetnsPath
	if path == "" || len(p.cfg.Loader.Netns) != 1 {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrNetnsGone, path, err)
	}
	if uint32(st.Ino) != p.cfg.Loader.Netns[0] {
		return fmt.Errorf("%w: %s now names another namespace (inode %d, not %d)", ErrNetnsGone, path, st.Ino, p.cfg.Loader.Netns[0])
	}
	return nil
}

// eventClock is the pipeline's time: how far the events read so far
// reach. A flow closes when the pipeline has read past its deadline, not
// when the wall clock has: a reader running late (a loaded node, a slow
// VM) would otherwise close a connection's flow before reading the
// decisions that followed it.
type eventClock struct{ now time.Time }

// event moves the clock to an event's own time.
func (c *eventClock) event(t time.Time) time.Time {
	if t.After(c.now) {
		c.now = t
	}
	return c.now
}

// idle moves the clock to when the ring buffer was found empty: every
// event made before then has been read. The margin covers the instant
// between a program taking an event's time and submitting it.
func (c *eventClock) idle(at time.Time) {
	c.event(at.Add(-time.Millisecond))
}

// read decodes the ring buffer until the tracer is closed.
func (p *Pipeline) read(out chan<- decoded) {
	defer close(out)
	for {
		ev, err := p.tracer.NextOrEmpty()
		var empty loader.Empty
		switch {
		case errors.Is(err, os.ErrClosed):
			return
		case errors.As(err, &empty):
			out <- decoded{idle: empty.At}
			continue
		case err != nil:
			p.decodeErrors.Add(1)
			continue
		}
		if ev.Kind != event.KindCTDestroy {
			p.events.Add(1)
		}
		out <- decoded{ev: ev}
	}
}

// ended hands a conntrack entry's end to its namespace's tracker.
func (p *Pipeline) ended(ev event.Event) {
	if ct := p.fed[ev.Netns]; ct != nil {
		ct.Ended(conntrack.EndOf(ev))
	}
}

// sampleCounters reads conntrack's counters, once a second: the readings
// a drop is set between.
func (p *Pipeline) sampleCounters() {
	if p.counters == nil {
		return
	}
	// A failed reading only widens the window the next drop is set in.
	_, _ = p.counters.Sample()
}

func (p *Pipeline) finish(sum trace.Summary) trace.Summary {
	sum.Ended = time.Now().UTC()
	if p.counters != nil {
		p.counters.Sample()
		sum.ConntrackDrops = p.counters.Drops()
	}
	sum.DecodeErrors = int(p.decodeErrors.Load())
	cs := p.conntrackStats()
	sum.ConntrackOverruns, sum.ConntrackSourceDumpsSkipped = cs.Overruns, cs.SourceDumpsSkipped
	sum.ConntrackEndsEvicted = cs.EvictedEarly
	sum.ConntrackBPFLookups, sum.ConntrackLookupsOff = cs.KernelLookups, cs.KernelLookupsOff
	if lost, err := p.tracer.Lost(); err == nil {
		sum.LostByHook = map[string]uint64{}
		for h, n := range lost {
			sum.LostByHook[h.String()] = n
			sum.LostEvents += n
		}
	}
	sum.UnreadAtStop = p.tracer.Unread()
	sum.LostEvents += sum.UnreadAtStop
	self := ReadSelfUsage()
	sum.TracerCPUMillis, sum.TracerPeakRSSKiB = self.CPU.Milliseconds(), self.PeakRSS>>10
	return sum
}

// Close detaches everything; safe to call more than once.
func (p *Pipeline) Close() error {
	var errs []error
	p.closeOnce.Do(func() {
		errs = append(errs, p.tracer.Close())
		for _, ct := range p.ct {
			errs = append(errs, ct.Close())
		}
		if p.counters != nil {
			errs = append(errs, p.counters.Close())
		}
		if p.watcher != nil {
			errs = append(errs, p.watcher.Close())
		}
	})
	return errors.Join(errs...)
}

func orCaller(path string) string {
	if path == "" {
		return "this namespace"
	}
	return path
}

// multiConntrack reads the conntrack tables of several namespaces: a
// five-tuple names one connection in one of them.
type multiConntrack []*conntrack.Tracker

func (m multiConntrack) Lookup(tu event.Tuple) (conntrack.Entry, bool) {
	for _, t := range m {
		if e, ok := t.Lookup(tu); ok {
			return e, true
		}
	}
	return conntrack.Entry{}, false
}

// LookupAll asks each namespace's tracker for the tuples the ones before
// it did not have, as Lookup does one tuple. The first is asked for all
// of them in place: one namespace is the common case. Each is asked, with
// no tuples when none are left, so that each has read its DESTROYs
// (AppendDestroyedRead).
func (m multiConntrack) LookupAll(tus []event.Tuple, entries []conntrack.Entry, found []bool) {
	clear(found)
	if len(m) == 0 {
		return
	}
	m[0].LookupAll(tus, entries, found)
	for _, t := range m[1:] {
		var missed []int
		for i, ok := range found {
			if !ok {
				missed = append(missed, i)
			}
		}
		sub, subEntries, subFound := make([]event.Tuple, len(missed)), make([]conntrack.Entry, len(missed)), make([]bool, len(missed))
		for n, i := range missed {
			sub[n] = tus[i]
		}
		t.LookupAll(sub, subEntries, subFound)
		for n, i := range missed {
			entries[i], found[i] = subEntries[n], subFound[n]
		}
	}
}

// Progress tells every tracker the join's clock.
func (m multiConntrack) Progress(now time.Time) {
	for _, t := range m {
		t.Progress(now)
	}
}

// Destroyed is the first tracker's non-empty history of tu.
func (m multiConntrack) Destroyed(tu event.Tuple) []conntrack.Entry {
	for _, t := range m {
		if h := t.Destroyed(tu); len(h) > 0 {
			return h
		}
	}
	return nil
}

// AppendDestroyedRead appends the first tracker's non-empty history of tu,
// as it has read it, to dst.
func (m multiConntrack) AppendDestroyedRead(dst []conntrack.Entry, tu event.Tuple) []conntrack.Entry {
	for _, t := range m {
		if out := t.AppendDestroyedRead(dst, tu); len(out) > len(dst) {
			return out
		}
	}
	return dst
}

func (m multiConntrack) BySource(proto uint8, src netip.AddrPort) []conntrack.Entry {
	var out []conntrack.Entry
	for _, t := range m {
		out = append(out, t.BySource(proto, src)...)
	}
	return out
}
