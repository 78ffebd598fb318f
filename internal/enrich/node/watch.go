package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudflare/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// WatchOptions tune a Watcher. Zero values take the defaults.
type WatchOptions struct {
	// Poll is how often rules, ipsets, nftables, IPVS and listeners are
	// re-read (they have no change notification the tracer can use
	// without loading modules). Default 2s.
	Poll time.Duration
	// Debounce coalesces a burst of address/route/link notifications
	// into one re-read. Default 20ms.
	Debounce time.Duration
	// Runner runs the read-only commands; default: started inside the
	// namespace (or directly for the caller's own).
	Runner Runner

	// OnPublish, when set, is called with each State the Watcher
	// publishes after the first, in order, before Current returns it. It
	// runs on the Watcher's goroutine and must not block.
	OnPublish func(*State)

	// moduleReady replaces the kernel module check (tests).
	moduleReady func(string) bool
	// nftGen and legacyTables replace the namespace's nftables
	// generation and its iptables-legacy check (tests).
	nftGen       func() (uint32, error)
	legacyTables func() (legacyTables, error)
	// pacedFrom replaces the shortest paced read (pacedFrom) for a
	// test's own Runner, whose reads are otherwise never paced: under
	// QEMU's emulation a fake read takes tens of milliseconds now and
	// then, and would put off the read the test waits for.
	pacedFrom time.Duration
}

// WatchStats count the Watcher's work.
type WatchStats struct {
	// Builds counts the States published (the first one included).
	Builds uint64
	// Polls counts polling rounds; a round that found nothing changed
	// publishes nothing.
	Polls uint64
	// RuleReads counts the rounds that ran iptables-save and
	// ip6tables-save. Under iptables-nft a round runs neither while the
	// nftables generation stands where the last read found it: on a node
	// with kube-proxy's rules for thousands of Services, each run costs
	// most of a second of CPU.
	RuleReads uint64
	// LinkEvents counts address/route/link notifications received.
	LinkEvents uint64
	// SubscribeErrors counts netlink notification errors; the poll
	// re-reads addresses too, so they are only late, never lost.
	SubscribeErrors uint64
	// LastPoll is how long the last polling round took (the commands
	// and sock_diag).
	LastPoll time.Duration
	// Deferred counts the part reads put off because reading the part
	// costs more than the tracer allows itself (readShare).
	Deferred uint64
}

// Watcher keeps the State of one namespace current.
type Watcher struct {
	path  string
	opts  WatchOptions
	run   Runner
	tools toolCheck
	// ready says whether a kernel module may be used without loading it.
	ready func(string) bool
	// nftGen reads the namespace's nftables generation; nil with a test's
	// own Runner, whose rulesets have none. gen is its reading at the
	// start of the poll round, before anything is listed: iptables-nft's
	// rules and native tables are both nf_tables rulesets, and both
	// reads compare with it. rulesRead and nftListed are the readings
	// the current rules and native tables were read at.
	nftGen                    func() (uint32, error)
	gen, rulesRead, nftListed generation
	// nftTables lists the namespace's nftables tables by netlink; nil
	// with a test's own Runner, where nft lists them.
	nftTables func() ([]string, error)
	// legacyTables says whether the namespace has iptables-legacy
	// tables, whose rules no nftables generation counts.
	legacyTables func() (legacyTables, error)

	nsh  netns.NsHandle
	h    *netlink.Handle
	diag *sockDiag
	ipvs ipvs.Client

	cur     atomic.Pointer[State]
	changed chan struct{}
	// mu serialises publishing (the link refresher and the poller both
	// build on the current state) and guards hashes.
	mu     sync.Mutex
	hashes map[string][32]byte
	// nftBackend is whether iptables is iptables-nft; it decides which
	// nftables tables are iptables'. Asked once: the binary does not
	// change under a running tracer.
	nftBackend, backendKnown bool
	lastPoll                 atomic.Int64

	builds, polls, ruleReads, linkEvents, subErrs atomic.Uint64
	// paces are when each paced part may be read again (pollPaced), and
	// deferred counts the reads they put off; under mu.
	paces     map[string]pace
	pacedFrom time.Duration
	deferred  atomic.Uint64

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// Watch builds the namespace's first State (netnsPath "" is the caller's
// namespace), then keeps it current: addresses, routes and links on their
// netlink notifications, everything else by polling, rebuilding only what
// changed.
func Watch(ctx context.Context, netnsPath string) (*Watcher, error) {
	return WatchWith(ctx, netnsPath, WatchOptions{})
}

// WatchWith is Watch with options.
func WatchWith(ctx context.Context, netnsPath string, opts WatchOptions) (*Watcher, error) {
	if opts.Poll <= 0 {
		opts.Poll = 2 * time.Second
	}
	if opts.Debounce <= 0 {
		opts.Debounce = 20 * time.Millisecond
	}
	w := &Watcher{path: netnsPath, opts: opts, run: opts.Runner, nsh: netns.None(), ready: moduleReady,
		changed: make(chan struct{}, 1), hashes: map[string][32]byte{}, paces: map[string]pace{}}
	if opts.moduleReady != nil {
		w.ready = opts.moduleReady
	}
	if w.run == nil {
		w.run = nsRunner(netnsPath)
		w.tools = lookPath
		w.nftGen = func() (uint32, error) { return nftGeneration(w.nsFD()) }
		w.nftTables = func() ([]string, error) { return nftTableNames(w.nsFD()) }
		w.legacyTables = func() (legacyTables, error) { return legacyTablesIn(netnsPath) }
	}
	if opts.nftGen != nil {
		w.nftGen = opts.nftGen
	}
	w.pacedFrom = pacedFrom
	if opts.Runner != nil {
		w.pacedFrom = opts.pacedFrom
		if w.pacedFrom == 0 {
			w.pacedFrom = math.MaxInt64
		}
	}
	if opts.legacyTables != nil {
		w.legacyTables = opts.legacyTables
	}
	if err := w.open(); err != nil {
		w.closeHandles()
		return nil, fmt.Errorf("watch node state: %w", err)
	}
	st := &State{notes: map[string]string{}, facts: map[string]bool{}, read: time.Now()}
	if err := w.refreshLinks(st); err != nil {
		w.closeHandles()
		return nil, fmt.Errorf("watch node state: %w", err)
	}
	w.changedHash("links", linksText(st))
	w.pollParts(ctx, st)
	st.finish()
	w.cur.Store(st)
	w.builds.Add(1)

	ctx, w.cancel = context.WithCancel(ctx)
	if err := w.subscribe(ctx); err != nil {
		w.cancel()
		w.closeHandles()
		return nil, fmt.Errorf("watch node state: %w", err)
	}
	w.wg.Add(1)
	go w.pollLoop(ctx)
	return w, nil
}

// nsFD is the watched namespace for a netlink socket; 0 is the caller's.
func (w *Watcher) nsFD() int {
	if w.nsh.IsOpen() {
		return int(w.nsh)
	}
	return 0
}

func (w *Watcher) open() error {
	if w.path != "" {
		h, err := netns.GetFromPath(w.path)
		if err != nil {
			return fmt.Errorf("open namespace %s: %w", w.path, err)
		}
		w.nsh = h
	}
	h, err := netlink.NewHandleAt(w.nsh, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("open rtnetlink in namespace: %w", err)
	}
	w.h = h
	fd := 0
	if w.nsh.IsOpen() {
		fd = int(w.nsh)
	}
	if w.diag, err = dialSockDiag(fd); err != nil {
		return err
	}
	return nil
}

// subscribe starts the address, route and link notifications, in the
// namespace, and the goroutine that turns them into refreshes.
func (w *Watcher) subscribe(ctx context.Context) error {
	var nsp *netns.NsHandle
	if w.nsh.IsOpen() {
		nsp = &w.nsh
	}
	onErr := func(error) { w.subErrs.Add(1) }
	addrCh := make(chan netlink.AddrUpdate, 256)
	routeCh := make(chan netlink.RouteUpdate, 256)
	linkCh := make(chan netlink.LinkUpdate, 256)
	done := ctx.Done()
	if err := netlink.AddrSubscribeWithOptions(addrCh, done, netlink.AddrSubscribeOptions{Namespace: nsp, ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("subscribe to address changes: %w", err)
	}
	if err := netlink.RouteSubscribeWithOptions(routeCh, done, netlink.RouteSubscribeOptions{Namespace: nsp, ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("subscribe to route changes: %w", err)
	}
	if err := netlink.LinkSubscribeWithOptions(linkCh, done, netlink.LinkSubscribeOptions{Namespace: nsp, ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("subscribe to link changes: %w", err)
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		armed := false
		arm := func() {
			w.linkEvents.Add(1)
			if !armed {
				timer.Reset(w.opts.Debounce)
				armed = true
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-addrCh:
				if !ok {
					addrCh = nil
					continue
				}
				arm()
			case _, ok := <-routeCh:
				if !ok {
					routeCh = nil
					continue
				}
				arm()
			case _, ok := <-linkCh:
				if !ok {
					linkCh = nil
					continue
				}
				arm()
			case <-timer.C:
				armed = false
				w.update(func(st *State) bool {
					return w.refreshLinks(st) == nil && w.changedHash("links", linksText(st))
				})
			}
		}
	}()
	return nil
}

func (w *Watcher) pollLoop(ctx context.Context) {
	defer w.wg.Done()
	t := time.NewTicker(w.opts.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.polls.Add(1)
			w.update(func(st *State) bool {
				changed := false
				// Addresses are re-read here too, in case a
				// notification was lost (ENOBUFS on the
				// subscription socket).
				if w.refreshLinks(st) == nil && w.changedHash("links", linksText(st)) {
					changed = true
				}
				if w.pollParts(ctx, st) {
					changed = true
				}
				return changed
			})
		}
	}
}

// update builds a candidate from a copy of the current State and publishes
// it only when fn says something changed, so readers holding the old
// pointer keep a consistent state and an idle node costs no allocation
// beyond the copy.
func (w *Watcher) update(fn func(st *State) bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.cur.Load().clone()
	st.read = time.Now()
	if !fn(st) {
		return
	}
	st.finish()
	if w.opts.OnPublish != nil {
		w.opts.OnPublish(st)
	}
	w.cur.Store(st)
	w.builds.Add(1)
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// changedHash records the hash of a part's text and reports whether it
// differs from the last one. Caller holds mu (or is the constructor).
func (w *Watcher) changedHash(part, text string) bool {
	h := sha256.Sum256([]byte(text))
	old, ok := w.hashes[part]
	w.hashes[part] = h
	return !ok || old != h
}

func (w *Watcher) refreshLinks(st *State) error {
	addrs, local, err := readLinks(w.h)
	if err != nil {
		st.notes["links"] = fmt.Sprintf("read addresses and local routes: %v", err)
		return err
	}
	delete(st.notes, "links")
	st.addrs, st.local = addrs, local
	return nil
}

func linksText(st *State) string {
	var b strings.Builder
	for _, a := range st.addrs {
		fmt.Fprintf(&b, "%s %s %v\n", a.Interface, a.Prefix, a.Up)
	}
	for _, p := range st.local {
		fmt.Fprintf(&b, "local %s\n", p)
	}
	return b.String()
}

// pollParts re-reads every polled part into st and reports whether any
// changed. A part whose text hashes the same is not parsed again.
func (w *Watcher) pollParts(ctx context.Context, st *State) bool {
	start := time.Now()
	defer func() { w.lastPoll.Store(int64(time.Since(start))) }()
	w.gen = w.readGeneration()
	changed := false
	for _, p := range []pacedPart{
		{"rules", "iptables rules", w.pollRules},
		{"ipsets", "ipsets", w.pollIPSets},
		{"nft", "native nftables tables", w.pollNFT},
	} {
		if w.pollPaced(ctx, st, p) {
			changed = true
		}
	}
	for _, p := range []func(context.Context, *State) bool{w.pollIPVS, w.pollListeners} {
		if p(ctx, st) {
			changed = true
		}
	}
	return changed
}

func (w *Watcher) setNote(st *State, part, note string) bool {
	return w.setNoteAs(st, part, note, false)
}

// setNoteAs sets part's note; fact says it leaves nothing unknown.
func (w *Watcher) setNoteAs(st *State, part, note string, fact bool) bool {
	if st.notes[part] == note && st.facts[part] == fact {
		return false
	}
	delete(st.facts, part)
	if note == "" {
		delete(st.notes, part)
		return true
	}
	st.notes[part] = note
	if fact {
		st.facts[part] = true
	}
	return true
}

// generation is one reading of the nftables generation; ok is false when
// there is none (nf_tables not loaded, a test's rules, an error).
type generation struct {
	n  uint32
	ok bool
}

// same says whether a part read at g would read the same now: no commit
// since, as far as the generation can tell.
func (g generation) same(now generation) bool { return now.ok && g == now }

func (w *Watcher) readGeneration() generation {
	if w.nftGen == nil || !w.ready("nf_tables") {
		return generation{}
	}
	n, err := w.nftGen()
	return generation{n: n, ok: err == nil}
}

// readLegacy is which iptables-legacy tables the namespace has, asked
// only under iptables-nft (iptables-legacy's own save shows them); known
// is false when it was not asked or could not tell.
func (w *Watcher) readLegacy() (l legacyTables, known bool) {
	if !w.nftBackend || w.legacyTables == nil {
		return l, false
	}
	l, err := w.legacyTables()
	return l, err == nil
}

// cleanRead says whether a read of the rules left nothing to read again:
// no command failed and no iptables-legacy tables were there.
func cleanRead(notes map[string]string, facts map[string]bool) bool {
	for part := range notes {
		if !facts[part] {
			return false
		}
	}
	return true
}

func (w *Watcher) pollRules(ctx context.Context, st *State) bool {
	if !w.backendKnown {
		w.nftBackend, w.backendKnown = iptablesIsNFT(ctx, w.run, w.tools)
	}
	// Under iptables-nft (the only backend legacyKnown is true under)
	// the rules are nf_tables rules: any change to them moves the
	// generation. The rules of iptables-legacy tables do not, so a
	// namespace that has them is read every round.
	legacy, legacyKnown := w.readLegacy()
	if w.rulesRead.same(w.gen) && legacyKnown && !legacy.any() {
		return false
	}
	texts, notes, facts := readRules(ctx, w.run, w.tools, w.nftBackend, w.ready)
	noteLegacy(notes, legacy)
	w.ruleReads.Add(1)
	w.rulesRead = generation{}
	if legacyKnown && cleanRead(notes, facts) {
		// The generation read before the commands ran: a change that
		// lands while they run moves it again, and the next round
		// reads once more.
		w.rulesRead = w.gen
	}
	noteChanged := w.setNoteAs(st, "rules", notes["rules"], facts["rules"])
	if w.setNoteAs(st, "rules6", notes["rules6"], facts["rules6"]) {
		noteChanged = true
	}
	for _, k := range []string{"rules-legacy", "rules6-legacy"} {
		if w.setNote(st, k, notes[k]) {
			noteChanged = true
		}
	}
	keys := make([]string, 0, len(texts))
	for k := range texts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var all strings.Builder
	for _, k := range keys {
		all.WriteString(k + "\n" + texts[k])
	}
	if !w.changedHash("rules", all.String()) {
		return noteChanged
	}
	// The rules parsed last time are shared where a line is unchanged.
	v4, v6, err := parseRulesText(texts, st.rules4, st.rules6)
	if err != nil {
		// Text that does not parse is left out of the state and the
		// snapshot: a trace must re-load, and attribution with half
		// the rules would be wrong.
		st.rulesText, st.rules4, st.rules6 = nil, nil, nil
		w.setNote(st, "rules-parse", err.Error())
		return true
	}
	w.setNote(st, "rules-parse", "")
	st.rulesText, st.rules4, st.rules6 = texts, v4, v6
	return true
}

func (w *Watcher) pollIPSets(ctx context.Context, st *State) bool {
	var text string
	var err error
	loaded := w.ready("ip_set")
	if loaded {
		text, err = readIPSets(ctx, w.run, w.tools)
	} else {
		err = errors.New("module ip_set is not loaded, so there are no ipsets (not loading it)")
	}
	if err != nil {
		note := fmt.Sprintf("ipsets not read: %v", err)
		if errors.Is(err, errNoTool) {
			note = fmt.Sprintf("%v: ipset members are not known", err)
		}
		ch := w.setNoteAs(st, "ipsets", note, !loaded)
		if w.changedHash("ipsets", "") {
			st.ipsetText, st.sets = "", nil
			ch = true
		}
		return ch
	}
	noteChanged := w.setNote(st, "ipsets", "")
	if !w.changedHash("ipsets", text) {
		return noteChanged
	}
	sets, err := rules.ParseIPSetSave(strings.NewReader(text))
	if err != nil {
		st.ipsetText, st.sets = "", nil
		w.setNote(st, "ipsets", fmt.Sprintf("ipsets not parsed: %v", err))
		return true
	}
	st.ipsetText, st.sets = text, sets
	return true
}

func (w *Watcher) pollNFT(ctx context.Context, st *State) bool {
	var tables []NFTable
	var ruleset *trace.NFTRuleset
	var err error
	if w.nftListed.same(w.gen) && st.notes["nft"] == "" {
		return false // nothing committed since the last listing
	}
	loaded := w.ready("nf_tables")
	if loaded {
		tables, ruleset, err = readNFT(ctx, w.run, w.tools, w.nftBackend, w.nftTables)
	} else {
		err = errors.New("module nf_tables is not loaded, so there are no nftables tables (not loading it)")
	}
	if err != nil {
		note := fmt.Sprintf("native nftables tables not read: %v", err)
		if errors.Is(err, errNoTool) {
			note = fmt.Sprintf("%v: native nftables tables (e.g. portmap's cni_hostport) are not shown", err)
		}
		ch := w.setNoteAs(st, "nft", note, !loaded)
		if w.changedHash("nft", "") {
			st.nft, st.nftRuleset = nil, nil
			ch = true
		}
		return ch
	}
	// The generation was read before listing: a change that lands during
	// the listing moves it again, and the next poll lists once more.
	w.nftListed = w.gen
	noteChanged := w.setNote(st, "nft", "")
	var b strings.Builder
	for _, t := range tables {
		b.WriteString(t.Text)
	}
	if !w.changedHash("nft", b.String()) {
		return noteChanged
	}
	st.nft, st.nftRuleset = tables, ruleset
	return true
}

func (w *Watcher) pollIPVS(_ context.Context, st *State) bool {
	if !ipvsLoaded() {
		ch := w.setNoteAs(st, "ipvs", "IPVS: the kernel has no ip_vs module loaded, so there are no IPVS virtual servers (not loading it: the tracer changes nothing)", true)
		if w.changedHash("ipvs", "") {
			st.ipvs = nil
			ch = true
		}
		return ch
	}
	if w.ipvs == nil {
		c, err := dialIPVS(w.path)
		if err != nil {
			return w.setNote(st, "ipvs", fmt.Sprintf("IPVS not read: %v", err))
		}
		w.ipvs = c
	}
	svcs, err := readIPVS(w.ipvs)
	if err != nil {
		return w.setNote(st, "ipvs", fmt.Sprintf("IPVS not read: %v", err))
	}
	noteChanged := w.setNote(st, "ipvs", "")
	if !w.changedHash("ipvs", ipvsText(svcs)) {
		return noteChanged
	}
	st.ipvs = svcs
	return true
}

func (w *Watcher) pollListeners(_ context.Context, st *State) bool {
	ls, err := w.diag.listeners()
	if err != nil {
		return w.setNote(st, "listeners", fmt.Sprintf("listening sockets not read: %v", err))
	}
	noteChanged := w.setNote(st, "listeners", "")
	sortListeners(ls)
	if !w.changedHash("listeners", listenersText(ls)) {
		return noteChanged
	}
	inodes := map[uint32]bool{}
	for _, l := range ls {
		inodes[l.Inode] = true
	}
	names := processNames(inodes)
	for i := range ls {
		ls[i].Process = names[ls[i].Inode]
	}
	st.listeners = ls
	return true
}

// Current is the latest State; it never blocks.
func (w *Watcher) Current() *State { return w.cur.Load() }

// Changed receives a signal (coalesced) after each new State.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

// Stats returns the counters.
func (w *Watcher) Stats() WatchStats {
	return WatchStats{Builds: w.builds.Load(), Polls: w.polls.Load(), RuleReads: w.ruleReads.Load(), LinkEvents: w.linkEvents.Load(), SubscribeErrors: w.subErrs.Load(),
		LastPoll: time.Duration(w.lastPoll.Load()), Deferred: w.deferred.Load()}
}

// Close stops refreshing and releases the sockets. Current keeps returning
// the last State.
func (w *Watcher) Close() error {
	w.closeOnce.Do(func() {
		if w.cancel != nil {
			w.cancel()
		}
		w.wg.Wait()
		w.closeHandles()
	})
	return nil
}

func (w *Watcher) closeHandles() {
	if w.h != nil {
		w.h.Close()
	}
	if w.diag != nil {
		w.diag.Close()
	}
	if c, ok := w.ipvs.(interface{ Close() error }); ok {
		c.Close()
	}
	if w.nsh.IsOpen() {
		w.nsh.Close()
	}
}
