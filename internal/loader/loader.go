// Package loader loads bpf/tracer.c, attaches every hook by the best method
// this kernel allows (each hook has its own ladder, tried by really loading
// and attaching), and reads the ring buffer. It is the only importer of
// cilium/ebpf.
package loader

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// Config selects what the kernel side reports.
type Config struct {
	// Netns are the inodes of the network namespaces to observe (at most
	// four); none means all. Kernel-wide hooks are filtered in the kernel.
	Netns []uint32
	// NetnsPaths are where netfilter-tier links attach (they are per
	// namespace); none means the caller's namespace.
	NetnsPaths []string
	// In-kernel filters: an event is kept when some tuple of it has one
	// of Ports, one address in Prefixes, and its protocol in Protos.
	Ports    []uint16
	Prefixes []netip.Prefix
	Protos   []uint8
	// Only restricts every ladder to these methods (to test one tier on a
	// kernel that supports several, like pwru's --backend).
	Only []event.Via
	// ConntrackNetns are the inodes of the namespaces (at most four)
	// whose conntrack entries' ends are reported (event.KindCTDestroy),
	// for conntrack trackers fed from the ring buffer: the ends a flow can
	// ask for, those of translated connections and of connections the
	// programs follow (IPVS's, and those answered with an error or
	// reset). None leaves event.HookCTDestroy unattached; it is not a
	// filter of the rest.
	ConntrackNetns []uint32
	// RingBuffer is the size in bytes of the ring buffer the programs
	// write their records to (a power of two from MinRingBuffer to
	// MaxRingBuffer); 0 is DefaultRingBuffer.
	RingBuffer int
}

// A record in the ring buffer takes 208 bytes (the event and the ring's
// header). DefaultRingBuffer holds about 80,000, a second of a node making
// 80,000 translated connections a second: room for the reader to fall that
// far behind, on a machine the burst itself keeps busy, before the kernel
// loses any. On the benchmark's two cores, under one-datagram UDP floods,
// the full live pipeline lost events from 60,000 connections a second with
// 4 MiB and none up to 80,000 with 16 MiB (BENCHMARKS.md, section 3). The
// kernel keeps the ring's pages for as long as the tracer runs; the
// reader maps them twice (for records that wrap), so the tracer's RSS
// counts twice the size.
const (
	DefaultRingBuffer = 16 << 20
	MinRingBuffer     = 64 << 10
	MaxRingBuffer     = 1 << 30
)

// CheckRingBuffer says whether the kernel takes a ring buffer of n bytes
// as Config.RingBuffer: a power of two from MinRingBuffer to
// MaxRingBuffer.
func CheckRingBuffer(n int64) error {
	if n < MinRingBuffer || n > MaxRingBuffer || n&(n-1) != 0 {
		return fmt.Errorf("ring buffer of %d bytes: want a power of two from 64KiB to 1GiB", n)
	}
	return nil
}

func (c Config) ringBuffer() int {
	if c.RingBuffer == 0 {
		return DefaultRingBuffer
	}
	return c.RingBuffer
}

const (
	maxPorts    = 8 // MAX_FILTER_PORTS
	maxPrefixes = 4 // MAX_FILTER_PREFIXES
	maxNetns    = 4 // MAX_FILTER_NETNS
)

// MaxNetns is how many namespaces Config.Netns and Config.ConntrackNetns
// can each name.
const MaxNetns = maxNetns

// Validate checks the filters fit the kernel side.
func (c Config) Validate() error {
	if len(c.Ports) > maxPorts {
		return fmt.Errorf("at most %d ports can be filtered in the kernel, got %d", maxPorts, len(c.Ports))
	}
	if len(c.Netns) > maxNetns {
		return fmt.Errorf("at most %d network namespaces can be observed at once, got %d", maxNetns, len(c.Netns))
	}
	if len(c.ConntrackNetns) > maxNetns {
		return fmt.Errorf("at most %d network namespaces' conntrack entries can be followed at once, got %d", maxNetns, len(c.ConntrackNetns))
	}
	if len(c.Prefixes) > maxPrefixes {
		return fmt.Errorf("at most %d address prefixes can be filtered in the kernel, got %d", maxPrefixes, len(c.Prefixes))
	}
	if c.RingBuffer != 0 {
		return CheckRingBuffer(int64(c.RingBuffer))
	}
	return nil
}

// Attempt is one rung tried.
type Attempt struct {
	Via    event.Via
	Target string
	Err    error
	// Needs is what the rung needs beyond the next one (a newer argument,
	// module BTF), said when it fails for lack of it.
	Needs string
}

// HookPlan records how one hook is attached and why better methods failed.
type HookPlan struct {
	Hook   event.Hook
	Via    event.Via // ViaNone when nothing attached
	Target string
	// Program is the program of the rung that attached ("" for the
	// netfilter tier or none).
	Program  string
	Attempts []Attempt
	// NotAsked: the hook has no use in this configuration (conntrack
	// ends, when no tracker asked for them) and was not tried.
	NotAsked bool
	// fentryElsewhere: another hook attached by fentry, so the kernel does
	// allow it and a failure is about this function.
	fentryElsewhere bool
}

// DropReasons reports whether drops come with the kernel's reason (5.17+):
// without it, a netfilter DROP cannot be told from any other free.
func (p Plan) DropReasons() bool {
	for _, h := range p {
		if h.Hook == event.HookKfreeSkb {
			return h.Program == "tr_drop_tp3"
		}
	}
	return false
}

// Plan is the attach outcome of every hook, in event.Hooks order.
type Plan []HookPlan

// Attached counts the hooks that have a method.
func (p Plan) Attached() int {
	n := 0
	for _, h := range p {
		if h.Via != event.ViaNone {
			n++
		}
	}
	return n
}

// Serves reports whether hook has a method.
func (p Plan) Serves(hook event.Hook) bool {
	return slices.ContainsFunc(p, func(h HookPlan) bool { return h.Hook == hook && h.Via != event.ViaNone })
}

// ErrNothingAttached is returned when no hook could attach at all.
var ErrNothingAttached = errors.New("no hook could be attached")

// Tracer is the loaded, attached kernel side.
type Tracer struct {
	Plan Plan

	spec *ebpf.CollectionSpec
	// btfCache keeps the kernel's and modules' BTF parsed once for all
	// the per-program loads.
	btfCache *btf.Cache
	maps     map[string]*ebpf.Map
	colls    []*ebpf.Collection
	links    []link.Link
	reader   *ringbuf.Reader
	waiter   *ringWaiter
	// readMu is held while a read uses the ring buffer; closing is set
	// before Close interrupts the read and takes readMu to unmap it.
	readMu  sync.Mutex
	closing atomic.Bool
	// detached is set once Detach has closed the links: the programs make
	// no more events, and a read that finds the ring empty ends.
	detached atomic.Bool
	// unread counts the records Close found in the ring buffer, which no
	// one will read; closed is closed once Close has counted them.
	unread uint64
	closed chan struct{}
	// lastLost and lastLostErr are the lost counters as Close read them
	// before closing their map: what Lost returns from then on.
	lastLost    map[event.Hook]uint64
	lastLostErr error
	rec         ringbuf.Record
	clock       event.Clock
	names       *ReasonNames
	// progs are the programs that attached, for their run statistics.
	// attachMu guards progs, links and Plan once Open has returned:
	// Reattach changes them while the pipeline runs.
	progs    []attachedProgram
	attachMu sync.Mutex
	only     []event.Via

	closeOnce sync.Once
	closeErr  error
}

// Open loads and attaches every hook. One hook failing never stops the
// others; the plan says what happened to each. It fails only when nothing
// attached or the shared maps cannot be created.
func Open(cfg Config) (*Tracer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("raise memlock limit: %w", err)
	}
	spec, err := loadTracer()
	if err != nil {
		return nil, fmt.Errorf("load bpf object: %w", err)
	}
	if err := configure(spec, cfg); err != nil {
		return nil, err
	}
	if ring := spec.Maps["events"]; ring != nil {
		ring.MaxEntries = uint32(cfg.ringBuffer())
	}
	t := &Tracer{spec: spec, maps: map[string]*ebpf.Map{}, btfCache: btf.NewCache(), only: cfg.Only, closed: make(chan struct{})}
	if err := t.createMaps(); err != nil {
		t.Close()
		return nil, err
	}
	t.attachAll(cfg)
	if t.Plan.Attached() == 0 {
		err := fmt.Errorf("attach: %w:\n%s", ErrNothingAttached, t.Plan.Reasons())
		t.Close()
		return nil, err
	}
	if t.reader, err = ringbuf.NewReader(t.maps["events"]); err != nil {
		t.Close()
		return nil, fmt.Errorf("open ring buffer: %w", err)
	}
	if t.waiter, err = newRingWaiter(t.maps["events"], t.readable); err != nil {
		t.Close()
		return nil, err
	}
	if t.clock, err = monotonicClock(); err != nil {
		t.Close()
		return nil, err
	}
	t.names = reasonNames(t.btfCache)
	return t, nil
}

// configure writes the load-time filters into the object's rodata.
func configure(spec *ebpf.CollectionSpec, cfg Config) error {
	set := func(name string, v any) error {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("configure: variable %s missing from object", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("configure %s: %w", name, err)
		}
		return nil
	}
	var netns, ctNetns [maxNetns]uint32
	copy(netns[:], cfg.Netns)
	copy(ctNetns[:], cfg.ConntrackNetns)
	var ports [maxPorts]uint16
	copy(ports[:], cfg.Ports)
	var prefixes [maxPrefixes]tracerPrefix
	for i, p := range cfg.Prefixes {
		prefixes[i] = prefixFilter(p)
	}
	var protoMask uint32
	for _, p := range cfg.Protos {
		protoMask |= protoClass(p)
	}
	for name, v := range map[string]any{
		"cfg_nnetns":     uint32(len(cfg.Netns)),
		"cfg_netns":      netns,
		"cfg_proto_mask": protoMask,
		"cfg_nports":     uint32(len(cfg.Ports)),
		"cfg_ports":      ports,
		"cfg_nprefixes":  uint32(len(cfg.Prefixes)),
		"cfg_prefixes":   prefixes,
		"cfg_ct_nnetns":  uint32(len(cfg.ConntrackNetns)),
		"cfg_ct_netns":   ctNetns,
	} {
		if err := set(name, v); err != nil {
			return err
		}
	}
	return nil
}

// protoClass mirrors proto_class in bpf/tracer.c.
func protoClass(p uint8) uint32 {
	switch p {
	case 6:
		return 1
	case 17:
		return 2
	case 1, 58:
		return 4
	case 132:
		return 8
	}
	return 16
}

func prefixFilter(p netip.Prefix) tracerPrefix {
	var f tracerPrefix
	p = p.Masked()
	a := p.Addr()
	n := 16
	f.Family = 10
	if a.Is4() {
		n, f.Family = 4, 2
	}
	raw := a.AsSlice()
	bits := p.Bits()
	for i := 0; i < n; i++ {
		m := byte(0)
		switch {
		case bits >= 8:
			m = 0xff
		case bits > 0:
			m = byte(0xff << (8 - bits))
		}
		bits -= 8
		f.Mask[i] = m
		f.Addr[i] = raw[i] & m
	}
	return f
}

// sharedMaps are created once and handed to every program's collection.
var sharedMaps = []string{"events", "lost", "followed", "answered", "follow_use"}

func (t *Tracer) createMaps() error {
	for _, name := range sharedMaps {
		ms, ok := t.spec.Maps[name]
		if !ok {
			return fmt.Errorf("create map %s: missing from object", name)
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			return fmt.Errorf("create map %s: %w", name, err)
		}
		t.maps[name] = m
	}
	return nil
}

// loadProgram loads one program of the object on its own, sharing the maps,
// so that a program this kernel rejects costs only its own rung. A tracing
// program is loaded for attachTo when it is set, instead of the function
// its section names.
func (t *Tracer) loadProgram(name, attachTo string, rodata map[string]any) (*ebpf.Program, error) {
	ps, ok := t.spec.Programs[name]
	if !ok {
		return nil, fmt.Errorf("program %s missing from object", name)
	}
	s := t.spec.Copy()
	if attachTo != "" {
		ps = ps.Copy()
		ps.AttachTo = attachTo
	}
	s.Programs = map[string]*ebpf.ProgramSpec{name: ps}
	for k, v := range rodata {
		if err := s.Variables[k].Set(v); err != nil {
			return nil, fmt.Errorf("configure %s: %w", k, err)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(s, ebpf.CollectionOptions{MapReplacements: t.maps, Cache: t.btfCache})
	if err != nil {
		return nil, err
	}
	t.colls = append(t.colls, coll)
	return coll.Programs[name], nil
}

// attachAll walks every ladder; hooks that fall through to the netfilter
// tier share one pair of netfilter programs attached at the end.
func (t *Tracer) attachAll(cfg Config) {
	var nfHooks []int
	var roles uint32
	for _, h := range event.Hooks {
		hp := HookPlan{Hook: h}
		if h == event.HookCTDestroy && len(cfg.ConntrackNetns) == 0 {
			hp.NotAsked = true
			t.Plan = append(t.Plan, hp)
			continue
		}
		for _, r := range ladders[h] {
			if len(cfg.Only) > 0 && !slices.Contains(cfg.Only, r.via) {
				continue
			}
			if r.attach == nil {
				roles |= r.nfRole
				nfHooks = append(nfHooks, len(t.Plan))
				hp.Target = r.target
				break
			}
			if t.climb(&hp, r) {
				break
			}
		}
		t.Plan = append(t.Plan, hp)
	}
	fentry := slices.ContainsFunc(t.Plan, func(h HookPlan) bool { return h.Via == event.ViaFentry })
	for i := range t.Plan {
		t.Plan[i].fentryElsewhere = fentry
	}
	if roles == 0 {
		return
	}
	err := t.attachNetfilter(cfg.NetnsPaths, roles)
	for _, i := range nfHooks {
		hp := &t.Plan[i]
		hp.Attempts = append(hp.Attempts, Attempt{Via: event.ViaNetfilter, Target: hp.Target, Err: err})
		if err == nil {
			hp.Via = event.ViaNetfilter
		} else {
			hp.Target = ""
		}
	}
}

// climb tries one rung for hp, recording the attempt; true when it attached.
func (t *Tracer) climb(hp *HookPlan, r rung) bool {
	err := t.tryRung(hp.Hook, r)
	hp.Attempts = append(hp.Attempts, Attempt{Via: r.via, Target: r.target, Err: err, Needs: r.needs})
	if err != nil {
		return false
	}
	hp.Via, hp.Target, hp.Program = r.via, r.target, r.prog
	return true
}

// Reattach detaches hook and walks its ladder again, for a hook whose
// function lives in a module that was loaded anew: a kprobe on the
// module's old copy never fires again, and fentry cannot attach to a
// module that is not loaded. Hooks served by the netfilter tier are left
// as they are. The returned plan says how the hook is attached now.
func (t *Tracer) Reattach(hook event.Hook) (HookPlan, error) {
	if t.closing.Load() {
		return HookPlan{}, os.ErrClosed
	}
	t.attachMu.Lock()
	defer t.attachMu.Unlock()
	if t.detached.Load() {
		return HookPlan{}, os.ErrClosed
	}
	i := slices.IndexFunc(t.Plan, func(hp HookPlan) bool { return hp.Hook == hook })
	if i < 0 {
		return HookPlan{}, fmt.Errorf("reattach %s: no such hook", hook)
	}
	if t.Plan[i].Via == event.ViaNetfilter {
		return t.Plan[i], nil
	}
	var errs []error
	t.progs = slices.DeleteFunc(t.progs, func(a attachedProgram) bool {
		if a.hook != hook || a.via == event.ViaNetfilter {
			return false
		}
		errs = append(errs, a.link.Close())
		t.links = slices.DeleteFunc(t.links, func(l link.Link) bool { return l == a.link })
		return true
	})
	hp := HookPlan{Hook: hook, fentryElsewhere: t.Plan[i].fentryElsewhere}
	for _, r := range ladders[hook] {
		if r.attach == nil || len(t.only) > 0 && !slices.Contains(t.only, r.via) {
			continue
		}
		if t.climb(&hp, r) {
			break
		}
	}
	t.Plan[i] = hp
	if err := errors.Join(errs...); err != nil {
		return hp, fmt.Errorf("reattach %s: detach the old link: %w", hook, err)
	}
	return hp, nil
}

func (t *Tracer) tryRung(h event.Hook, r rung) error {
	var attachTo string
	if r.via == event.ViaFentry {
		attachTo = r.target
	}
	var rodata map[string]any
	if r.families != 0 {
		rodata = map[string]any{"cfg_families": r.families}
	}
	p, err := t.loadProgram(r.prog, attachTo, rodata)
	if err != nil {
		return fmt.Errorf("load %s %s: %w", r.via, r.target, err)
	}
	l, err := r.attach(p, r.target)
	if err != nil {
		return fmt.Errorf("attach %s %s: %w", r.via, r.target, err)
	}
	t.links = append(t.links, l)
	t.progs = append(t.progs, attachedProgram{name: r.prog, via: r.via, hook: h, prog: p, link: l})
	return nil
}

// Lost returns, per hook, the events the kernel could not queue because
// the ring buffer was full.
func (t *Tracer) Lost() (map[event.Hook]uint64, error) {
	if t.closing.Load() {
		// Close read the counters before it closed their map.
		<-t.closed
		return maps.Clone(t.lastLost), t.lastLostErr
	}
	return t.readLost()
}

func (t *Tracer) readLost() (map[event.Hook]uint64, error) {
	out := map[event.Hook]uint64{}
	var perCPU []uint64
	for _, h := range event.Hooks {
		if err := t.maps["lost"].Lookup(uint32(h), &perCPU); err != nil {
			return nil, fmt.Errorf("read lost counter of %s: %w", h, err)
		}
		var sum uint64
		for _, n := range perCPU {
			sum += n
		}
		if sum > 0 {
			out[h] = sum
		}
	}
	return out, nil
}

// Next blocks for the next event. It returns os.ErrClosed after Close.
// Records that do not decode are returned as errors, never dropped
// silently. One goroutine reads: the record buffer is reused between calls.
func (t *Tracer) Next() (event.Event, error) {
	for {
		ev, err := t.NextOrEmpty()
		if !errors.Is(err, ErrEmpty) {
			return ev, err
		}
	}
}

// ErrEmpty says the ring buffer held no record for a while: every event
// the programs made before the Empty time it comes with has been read.
var ErrEmpty = errors.New("ring buffer empty")

// Empty is ErrEmpty with the time the ring buffer was found empty.
type Empty struct{ At time.Time }

func (e Empty) Error() string { return ErrEmpty.Error() }
func (Empty) Unwrap() error   { return ErrEmpty }

// NextOrEmpty is Next, but returns an Empty error when the ring buffer
// stayed empty for pollEvery: a consumer that orders its work by the
// events' own times (the joiner) learns that time has passed with nothing
// more to read.
func (t *Tracer) NextOrEmpty() (event.Event, error) {
	// Close waits for this to return before it unmaps the ring buffer.
	t.readMu.Lock()
	defer t.readMu.Unlock()
	// The programs wake the reader only when a backlog builds up
	// (bpf/tracer.c, submit): otherwise it looks on its own, often
	// enough that an event is never shown more than pollEvery late.
	deadline := time.Now().Add(pollEvery)
	for {
		if t.closing.Load() {
			return event.Event{}, os.ErrClosed
		}
		if t.readable() {
			if ev, ok, err := t.readOne(); ok || err != nil {
				return ev, err
			}
			continue
		}
		// Empty's time is read before the ring is seen empty once more:
		// every event made before it has been read.
		at := t.monotonicNow()
		if t.readable() {
			continue
		}
		if t.detached.Load() {
			// The links were closed before this look: nothing more comes.
			return event.Event{}, os.ErrClosed
		}
		if !time.Now().Before(deadline) {
			return event.Event{}, Empty{At: at}
		}
		err := t.waiter.wait(deadline)
		switch {
		case t.closing.Load():
			return event.Event{}, os.ErrClosed
		case err != nil && !errors.Is(err, os.ErrDeadlineExceeded):
			return event.Event{}, fmt.Errorf("wait for ring buffer: %w", err)
		}
	}
}

// countUnread reads the records left in the ring buffer without decoding
// them, and counts them.
func (t *Tracer) countUnread() uint64 {
	var n uint64
	for t.readable() {
		if ok, _ := t.readRecord(); !ok {
			break
		}
		n++
	}
	return n
}

// readable reports whether the ring buffer holds a record to read.
func (t *Tracer) readable() bool { return t.reader.AvailableBytes() > 0 }

// readOne reads a record the ring buffer holds without waiting; ok is
// false, with no error, when there was none to read after all.
func (t *Tracer) readOne() (ev event.Event, ok bool, err error) {
	if ok, err = t.readRecord(); !ok {
		return event.Event{}, false, err
	}
	ev, err = event.Decode(t.rec.RawSample, t.clock)
	return ev, true, err
}

// readRecord reads a record into t.rec without waiting; ok is false, with
// no error, when there was none to read after all.
func (t *Tracer) readRecord() (ok bool, err error) {
	t.reader.SetDeadline(time.Unix(0, 1)) // past: the reader's epoll_wait does not block
	err = t.reader.ReadInto(&t.rec)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, nil
	case errors.Is(err, ringbuf.ErrClosed):
		return false, os.ErrClosed
	}
	return false, fmt.Errorf("read ring buffer: %w", err)
}

// monotonicNow is now on the events' clock (CLOCK_MONOTONIC from the
// boot time Open read), so it compares with event times however the wall
// clock has been stepped or slewed since.
func (t *Tracer) monotonicNow() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now()
	}
	return t.clock.Wall(uint64(ts.Nano()))
}

// pollEvery bounds how late a quiet ring buffer is read.
const pollEvery = 20 * time.Millisecond

// Reasons names drop and RST reasons for this kernel.
func (t *Tracer) Reasons() *ReasonNames { return t.names }

// Detach closes every link, so the programs make no more events, and
// leaves the ring buffer to be read: Next returns what they queued before,
// then os.ErrClosed once the ring buffer is empty. A consumer stopping
// (SIGINT, the end of --duration) reads everything the kernel reported
// before it stopped instead of dropping it; Close still ends a read that
// takes too long, and counts what was left (Unread).
func (t *Tracer) Detach() error {
	t.attachMu.Lock()
	defer t.attachMu.Unlock()
	if t.detached.Swap(true) {
		return nil
	}
	// A read waiting for a record looks again within pollEvery, and ends
	// then if the ring buffer is empty.
	if err := t.closeLinks(); err != nil {
		return fmt.Errorf("detach: %w", err)
	}
	return nil
}

// closeLinks closes the links still open (under attachMu).
func (t *Tracer) closeLinks() error {
	var errs []error
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	t.links = nil
	return errors.Join(errs...)
}

// Unread is how many records Close found in the ring buffer: events the
// programs reported that no one read, lost as surely as those the ring
// buffer had no room for. It waits for a Close in progress.
func (t *Tracer) Unread() uint64 {
	if !t.closing.Load() {
		return 0
	}
	<-t.closed
	return t.unread
}

// Close detaches every link and frees everything. It is safe to call more
// than once and from a signal path while Next blocks.
func (t *Tracer) Close() error {
	t.closeOnce.Do(func() {
		var errs []error
		t.closing.Store(true)
		defer close(t.closed)
		t.attachMu.Lock()
		defer t.attachMu.Unlock()
		errs = append(errs, t.closeLinks())
		if t.waiter != nil {
			errs = append(errs, t.waiter.Close())
		}
		t.readMu.Lock()
		defer t.readMu.Unlock()
		if t.reader != nil {
			t.unread = t.countUnread()
			errs = append(errs, t.reader.Close())
		}
		if t.maps["lost"] != nil {
			t.lastLost, t.lastLostErr = t.readLost()
		}
		for _, c := range t.colls {
			c.Close()
		}
		for _, m := range t.maps {
			errs = append(errs, m.Close())
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}
