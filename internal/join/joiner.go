// Package join groups the kernel's decoded events into flows, one per
// connection, and adds each flow's conntrack entry: the stage between the
// loader's events (internal/event) and the rules (internal/enrich), which
// it knows nothing of.
package join

import (
	"net/netip"
	"slices"
	"time"

	"github.com/tracer-dev/tracer/internal/conntrack"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Conntrack is the conntrack table the join reads (conntrack.Tracker).
type Conntrack interface {
	Lookup(event.Tuple) (conntrack.Entry, bool)
}

// BatchConntrack answers many lookups at once (conntrack's
// Tracker.LookupAll): found[i] and entries[i] are Lookup of tus[i].
// Optional: a Conntrack that has it is asked once for the live entries of
// all the flows an Expire finishes together.
type BatchConntrack interface {
	LookupAll(tus []event.Tuple, entries []conntrack.Entry, found []bool)
}

// SourceIndex finds a client's connections by their source endpoint; it is
// how a reply from the wrong five-tuple is tied to the connection it
// answers. Optional: a Conntrack that has it is used for it.
type SourceIndex interface {
	BySource(proto uint8, src netip.AddrPort) []conntrack.Entry
}

// Destroyed lists the destroyed entries of a reused tuple, newest first
// (conntrack's Tracker.Destroyed). Optional: without it, a flow a newer
// connection of the same tuple replaced gets no conntrack entry rather
// than the newer one's.
type Destroyed interface {
	Destroyed(event.Tuple) []conntrack.Entry
}

// Progress is told the join's clock after each Expire (conntrack's
// Tracker.Progress): the flows quiet since then less the linger have
// asked for their entries, and a join reading late asks late. Optional.
type Progress interface {
	Progress(now time.Time)
}

// ReadDestroyed is Destroyed, appended to dst, of a BatchConntrack whose
// LookupAll reads the DESTROYs queued by the time it returns (conntrack's
// Tracker.AppendDestroyedRead): the flows finished after it are answered
// from that read, not one more each.
type ReadDestroyed interface {
	AppendDestroyedRead(dst []conntrack.Entry, tu event.Tuple) []conntrack.Entry
}

// DefaultLinger is how long a flow stays open after its last event: long
// enough for the rest of its decisions (SNAT after DNAT, the drop after a
// REJECT) and for a reply to show in conntrack, short enough to read live.
const DefaultLinger = 1500 * time.Millisecond

// UnansweredLinger is how long a connection nothing has answered (a TCP
// one still at its SYN) stays open after its last event, while its events
// say nothing else happened to it: NAT decisions, or the kernel giving up
// on the next hop's neighbour. A packet DNAT'd to an address nothing
// answers ARP or neighbour discovery for waits in the neighbour's queue
// until the kernel gives up, 3 s after the first solicitation (3 probes a
// second apart, both families' default), and is then dropped and
// answered with host-unreachable, which fails a TCP client's connect (a
// DNS query to a Service whose endpoint is gone fails the same way): that
// belongs in the connection's one flow. A packet queued meanwhile (a
// retransmitted SYN) starts the next resolution, and is rejected 3 s
// after that.
const UnansweredLinger = 3500 * time.Millisecond

// Joiner groups events into flows by connection and hands each flow to
// Emit once it has been quiet for Linger, with its conntrack entry: the
// join stage, which knows nothing of rules (internal/enrich is the next).
// It is not safe for concurrent use: one goroutine feeds it.
type Joiner struct {
	Linger time.Duration
	CT     Conntrack // nil: no conntrack (flows carry what events say)
	Emit   func(*Flow)
	// ReuseFlows lets the joiner write a later flow into a flow's record
	// once Emit has returned, unless Emit called Keep: set it only when
	// Emit otherwise keeps neither the record nor a pointer into it (its
	// events, their tuples, its reply or its conntrack entry). Its strings
	// and its rule, pods and Service are never reused. A flow is otherwise
	// an allocation of about 1 KiB a connection, most of what a busy node
	// makes its garbage collector sweep.
	ReuseFlows bool
	// Names names drop and reset reasons when a finished flow's events
	// are written in the trace format; nil leaves them numbers' names out.
	Names event.ReasonNamer
	// Counters are conntrack's own counters around a time, of the
	// namespace whose inode is CountersNetns; nil: no evidence is added to
	// the drops of packets without a conntrack entry.
	Counters      ConntrackCounters
	CountersNetns uint32

	// byTuple leads every tuple an open flow has seen to the flow: its
	// key, its reply tuple and that reversed. A flow's own key always
	// leads to it (a tuple is a flow's key only when no open flow had it),
	// until a newer connection of the same tuple replaces it.
	byTuple tupleIndex
	// due holds every flow not yet finished, each once, by deadline, so
	// Expire looks only at the flows whose time has come. It also holds
	// the flows a newer connection of the same tuple took the key from:
	// they take no more events and finish at their deadline.
	due dueQueue
	// epoch is the clock's reading at the first event: deadlines are
	// offsets from it, half a time.Time and still monotonic.
	epoch time.Time
	// packer packs open flows' events.
	packer eventPacker
	// enc writes finished flows' tuples and events in the trace format.
	enc trace.Encoder
	// joined is flowOf's scratch: the finishing flow's events.
	joined []event.Event
	// finishing, and the rest, are finishAll's scratch: the flows an
	// Expire finishes, their index entries and their conntrack lookups.
	finishing  []*pending
	unindexing []indexEntry
	lookupTus  []event.Tuple
	lookupCT   []conntrack.Entry
	lookupOK   []bool
	answers    []ctAnswer
	// destroyed is entryOf's scratch: a replaced flow's destroyed entries.
	destroyed []conntrack.Entry
	// out is the flow being emitted: Emit's argument.
	out Flow
	// free are finished flows' states, which nothing refers to any more,
	// for new flows: a flow's state is otherwise an allocation a flow.
	free []*pending
	// emitted are flows of one and of two events that Emit has returned
	// from, for flowOf to reuse (ReuseFlows).
	emitted1 []*flowBlock1
	emitted2 []*flowBlock2
}

// maxFree bounds free: an Expire finishes the flows of a tick (100 ms in
// internal/live) at once, and the next tick's new flows take their states
// back. 16,384 states are about 2 MiB, a tick at 160,000 flows/s.
const maxFree = 1 << 14

// newPending is the state of a new flow keyed by key: a finished flow's
// when one is free.
func (j *Joiner) newPending(key ptuple) *pending {
	n := len(j.free)
	if n == 0 {
		return newPending(key)
	}
	p := j.free[n-1]
	j.free[n-1] = nil
	j.free = j.free[:n-1]
	*p = pending{}
	p.start(key)
	return p
}

// recycle keeps p, finished, for a new flow: finish has unindexed it (or
// retire did) and taken it out of due.
func (j *Joiner) recycle(p *pending) {
	if len(j.free) < maxFree {
		j.free = append(j.free, p)
	}
}

// Flow is a finished connection as the join made it: its record in the
// trace format, with the typed values it was made of, which the next
// stage reads instead of the record's text.
type Flow struct {
	Record *trace.Flow
	// Events are Record's events, typed, in the same order. They are the
	// joiner's scratch: valid until Emit returns, even when kept.
	Events []event.Event
	// Orig is Record.Orig; Reply is Record.Reply when HasReply.
	Orig, Reply event.Tuple
	HasReply    bool
	// At is the pipeline's clock when the join finished the flow; zero at
	// Flush, when nothing waits for later.
	At   time.Time
	kept bool
	// block is the memory the record was made in, for a later flow once
	// its consumer is done (ReuseFlows).
	block blockRef
}

// Keep tells the joiner that the consumer holds f's record after Emit
// returns, so it is not reused (ReuseFlows).
func (f *Flow) Keep() { f.kept = true }

// natDecision is a decision the kernel makes once per connection and
// namespace: conntrack sets up each NAT manipulation of an entry once, and
// IPVS creates one connection per client connection.
type natDecision struct {
	netns uint32
	kind  event.Kind
}

// answerOf is what a connection's NAT decisions say its conntrack reply
// tuple holds: where the DNAT (or IPVS) sent it, and what address the SNAT
// gave it. Zero fields are unknown. It is read from the targets rather
// than from the events' reply tuples, which the kprobe and fentry tiers
// read before the translation.
type answerOf struct {
	from, to netip.AddrPort // reply.src, reply.dst; port 0: any
}

func (a *answerOf) note(ev event.Event) {
	r := ev.To
	if !r.MinAddr.IsValid() || r.MinAddr != r.MaxAddr {
		return
	}
	var port uint16
	if r.MinPort == r.MaxPort {
		port = r.MinPort
	}
	switch ev.Kind {
	case event.KindDNAT, event.KindIPVS:
		a.from = netip.AddrPortFrom(r.MinAddr, port)
	case event.KindSNAT:
		a.to = netip.AddrPortFrom(r.MinAddr, port)
	}
}

func (a answerOf) matches(reply event.Tuple) bool {
	return endpointMatches(a.from, reply.SrcAddrPort()) && endpointMatches(a.to, reply.DstAddrPort())
}

// endpointMatches: an unknown want matches anything, port 0 any port.
func endpointMatches(want, got netip.AddrPort) bool {
	if !want.IsValid() {
		return true
	}
	return want.Addr() == got.Addr() && (want.Port() == 0 || want.Port() == got.Port())
}

func natDecisionOf(ev event.Event) (natDecision, bool) {
	switch ev.Kind {
	case event.KindDNAT, event.KindSNAT, event.KindIPVS:
		return natDecision{ev.Netns, ev.Kind}, true
	}
	return natDecision{}, false
}

// newConnection says whether decision d, made again for p's tuple, is a
// new connection's: the client reused its source port, and the kernel made
// a new connection of it. It is not when p's last decision d was followed
// by a drop of the connection's packet with the entry that decision made,
// unconfirmed: that entry went with the packet, so d is for the
// connection's next packet (a retransmitted SYN, a resent datagram), to
// which conntrack gives a new entry. A reused source port's connection
// follows one whose entry was confirmed.
func (j *Joiner) newConnection(p *pending, d natDecision) bool {
	key := p.key().tuple()
	var decidedAt, droppedAt time.Time
	decided := false
	j.eachEvent(p, func(ev event.Event) bool {
		if got, ok := natDecisionOf(ev); ok && got == d {
			decided = true
			if ev.Time.After(decidedAt) {
				decidedAt = ev.Time
			}
		}
		if unconfirmedEntry(ev) && ev.Orig == key && ev.Time.After(droppedAt) {
			droppedAt = ev.Time
		}
		return true
	})
	return decided && (droppedAt.IsZero() || droppedAt.Before(decidedAt))
}

// carriesEntry: ev is a drop of a packet that had a conntrack entry, whose
// tuples (and status) the drop program read from it.
func carriesEntry(ev event.Event) bool {
	return ev.Kind == event.KindDrop && ev.Orig.Valid() && ev.Reply.Valid()
}

// unconfirmedEntry: ev is a drop of a packet whose entry conntrack had not
// confirmed; it went with the packet and was in no table.
func unconfirmedEntry(ev event.Event) bool {
	return carriesEntry(ev) && ev.CTStatus&conntrack.StatusConfirmed == 0
}

// answer is what p's NAT decisions say of its reply tuple.
func (j *Joiner) answer(p *pending) answerOf {
	var a answerOf
	j.eachEvent(p, func(ev event.Event) bool {
		if _, ok := natDecisionOf(ev); ok {
			a.note(ev)
		}
		return true
	})
	return a
}

// Add joins one decoded event at now, the pipeline's clock.
func (j *Joiner) Add(ev event.Event, now time.Time) {
	if j.byTuple.slots == nil {
		j.byTuple = newTupleIndex()
		j.epoch = now
	}
	tu := ev.Packet
	if ev.Kind == event.KindDNAT || ev.Kind == event.KindSNAT || ev.Kind == event.KindIPVS || !tu.Valid() {
		tu = ev.Orig
	}
	if !tu.Valid() {
		return
	}
	p, key, reply := j.resolve(tu, ev)
	unseen := p == nil && key == tu // no open flow holds tu
	d, isNAT := natDecisionOf(ev)
	if p != nil && isNAT && j.newConnection(p, d) {
		j.retire(p)
		p = nil
	}
	created := p == nil
	if created {
		p = j.newPending(packTuple(key))
		if unseen {
			j.byTuple.claimUnseen(p, p.key())
		} else {
			j.byTuple.claim(p, p.key())
		}
	}
	if r := packTuple(reply); r.valid() && r != p.reply() {
		p.setReply(r)
		j.byTuple.claim(p, r)
	}
	j.addEvent(p, ev)
	p.deadline = now.Sub(j.epoch) + j.linger()
	p.held = false
	if created {
		j.due.push(p)
	} else {
		p.moved = true
	}
}

// retire takes the key from old, which a new connection of the same tuple
// replaces: old keeps its deadline, but no tuple leads to it any more.
func (j *Joiner) retire(old *pending) {
	j.unindex(old)
	old.replaced = true
}

// unindex removes every tuple that leads to p.
func (j *Joiner) unindex(p *pending) {
	j.unindexing = j.indexEntries(j.unindexing[:0], p)
	j.byTuple.releaseAll(j.unindexing)
}

// indexEntries appends the entries p may have: under its key, its reply
// and its earlier replies (a reply reversed is found through the reply);
// only those still leading to p are its own.
func (j *Joiner) indexEntries(es []indexEntry, p *pending) []indexEntry {
	es = append(es, j.byTuple.entry(p, p.key()))
	if r := p.reply(); r.valid() {
		es = append(es, j.byTuple.entry(p, r))
	}
	for _, r := range p.oldReplies() {
		es = append(es, j.byTuple.entry(p, r))
	}
	return es
}

func (j *Joiner) linger() time.Duration {
	if j.Linger > 0 {
		return j.Linger
	}
	return DefaultLinger
}

// resolve finds the connection a tuple belongs to: an open flow that has
// seen it (p), else the conntrack entry holding it, else the tuple itself;
// key is the connection's original tuple.
func (j *Joiner) resolve(tu event.Tuple, ev event.Event) (p *pending, key, reply event.Tuple) {
	if ev.Reply.Valid() {
		reply = ev.Reply
	}
	if p := j.byTuple.get(packTuple(tu)); p != nil {
		return p, p.key().tuple(), reply
	}
	// A NAT decision carries both tuples of its connection, read from
	// nf_conn: the original one is the key, conntrack has nothing to add.
	if (ev.Kind == event.KindDNAT || ev.Kind == event.KindSNAT) && reply.Valid() {
		return nil, tu, reply
	}
	if e, ok := j.entryHolding(tu, ev); ok {
		if p := j.byTuple.get(packTuple(e.Orig)); p != nil {
			return p, p.key().tuple(), e.Reply
		}
		return nil, e.Orig, e.Reply
	}
	return nil, tu, reply
}

// entryHolding is the conntrack entry of tu's connection. A drop carries
// the entry its packet had (a new one, dropped before it was confirmed,
// is in no table); else conntrack is asked for tu.
func (j *Joiner) entryHolding(tu event.Tuple, ev event.Event) (conntrack.Entry, bool) {
	if carriesEntry(ev) {
		return conntrack.Entry{Orig: ev.Orig, Reply: ev.Reply}, true
	}
	if j.CT == nil {
		return conntrack.Entry{}, false
	}
	if e, ok := j.CT.Lookup(tu); ok {
		return e, true
	}
	// A packet conntrack has translated carries the other direction's
	// tuple reversed: a DNAT'd packet rejected on its way to the
	// endpoint, seconds after the DNAT's flow was done.
	return j.CT.Lookup(tu.Reverse())
}

// flowOf is p in the trace format, its events in time order; they stay
// in joined, typed, in the same order. in is where the flow's reply
// tuple and conntrack entry go (addConntrack). A flow of one or two
// events, nearly all of them, is one block with its events, their
// tuples, reply and entry: an emitted flow's (ReuseFlows), else a new
// allocation.
func (j *Joiner) flowOf(p *pending) (f *trace.Flow, in flowSlots, block blockRef) {
	joined := j.joined[:0]
	j.eachEvent(p, func(ev event.Event) bool {
		joined = append(joined, ev)
		return true
	})
	slices.SortStableFunc(joined, func(a, b event.Event) int { return a.Time.Compare(b.Time) })
	j.joined = joined
	var tuples [][3]trace.Tuple
	switch len(joined) {
	case 1:
		b := takeBlock(&j.emitted1)
		f, in, tuples, block.one = &b.flow, b.slots(), b.tuples[:], b
		f.Events = b.events[:]
	case 2:
		b := takeBlock(&j.emitted2)
		f, in, tuples, block.two = &b.flow, b.slots(), b.tuples[:], b
		f.Events = b.events[:]
	default:
		b := new(flowBlock[struct{}, struct{}])
		f, in = &b.flow, b.slots()
		f.Events = make([]trace.Event, len(joined))
	}
	for i, ev := range joined {
		var room *[3]trace.Tuple // nil: EventIn allocates the tuples
		if i < len(tuples) {
			room = &tuples[i]
		}
		f.Events[i] = j.enc.EventIn(ev, j.Names, room)
	}
	f.Type, f.Proto, f.Orig = trace.TypeFlow, event.ProtoName(p.key().proto), *j.enc.Tuple(p.key().tuple())
	if len(f.Events) > 0 {
		f.Time = f.Events[0].Time
	}
	return f, in, block
}

// flowBlock is a finished flow with room for its events (E, an array),
// their tuples (T, an array of one [3]trace.Tuple an event), its reply
// tuple and its conntrack entry.
type flowBlock[E, T any] struct {
	flow   trace.Flow
	events E
	tuples T
	reply  trace.Tuple
	ct     trace.Conntrack
}

func (b *flowBlock[E, T]) slots() flowSlots { return flowSlots{reply: &b.reply, ct: &b.ct} }

type (
	flowBlock1 = flowBlock[[1]trace.Event, [1][3]trace.Tuple]
	flowBlock2 = flowBlock[[2]trace.Event, [2][3]trace.Tuple]
)

// blockRef is the block a flow of one or two events was made in; both
// nil for a longer flow, which is made as it comes and never reused.
type blockRef struct {
	one *flowBlock1
	two *flowBlock2
}

// maxEmitted bounds each list of emitted blocks. A flow's block goes back
// as soon as Emit returns and the next flow takes it, or, handed to
// another goroutine (Batch), with the rest of its tick's flows: 4,096
// blocks of each size are a tick of flows at 40,000 a second, about 8 MiB.
const maxEmitted = 1 << 12

// takeBlock is an emitted block, cleared, or a new one.
func takeBlock[E, T any](emitted *[]*flowBlock[E, T]) *flowBlock[E, T] {
	n := len(*emitted)
	if n == 0 {
		return new(flowBlock[E, T])
	}
	b := (*emitted)[n-1]
	(*emitted)[n-1] = nil
	*emitted = (*emitted)[:n-1]
	*b = flowBlock[E, T]{}
	return b
}

// reuse keeps an emitted flow's block for a later flow (ReuseFlows).
func (j *Joiner) reuse(block blockRef) {
	if !j.ReuseFlows {
		return
	}
	switch {
	case block.one != nil && len(j.emitted1) < maxEmitted:
		j.emitted1 = append(j.emitted1, block.one)
	case block.two != nil && len(j.emitted2) < maxEmitted:
		j.emitted2 = append(j.emitted2, block.two)
	}
}

// flowSlots are where a flow's reply tuple and conntrack entry go.
type flowSlots struct {
	reply *trace.Tuple
	ct    *trace.Conntrack
}

// Expire finishes every flow quiet since its deadline, oldest deadline
// first. A flow whose deadline moved on since it was queued is queued
// again at its new one.
func (j *Joiner) Expire(now time.Time) {
	at := now.Sub(j.epoch)
	for {
		due, fromFIFO, ok := j.due.peek()
		if !ok || at < due {
			break
		}
		p := j.due.pop(fromFIFO)
		if at < p.deadline {
			j.due.heap.push(p.deadline, p)
			continue
		}
		j.finishing = append(j.finishing, p)
		if len(j.finishing) == finishChunk {
			j.finishAll(now)
		}
	}
	j.finishAll(now)
	if pr, ok := j.CT.(Progress); ok {
		pr.Progress(now)
	}
}

// Flush finishes every open flow (at exit), oldest deadline first.
func (j *Joiner) Flush() {
	for {
		_, fromFIFO, ok := j.due.peek()
		if !ok {
			break
		}
		j.finishing = append(j.finishing, j.due.pop(fromFIFO))
		if len(j.finishing) == finishChunk {
			j.finishAll(time.Time{})
		}
	}
	j.finishAll(time.Time{})
}

// finishChunk is how many flows finishAll finishes at a time: enough to
// ask conntrack for their entries in full batches, few enough that their
// answers take little memory when a Flush finishes a million flows.
const finishChunk = 256

// ctAnswer is a flow's live conntrack entry when it was asked for before
// finish, together with the other flows finishing then; batched: the flow
// finishes right after a LookupAll, replaced flows too.
type ctAnswer struct {
	entry                 conntrack.Entry
	found, asked, batched bool
}

// finishAll finishes the flows in finishing, in order, having asked a
// BatchConntrack for the live entries of all of them that still hold
// their tuple (entryOf reads a replaced flow's history), in that order.
func (j *Joiner) finishAll(now time.Time) {
	j.lookUpFinishing()
	j.holdUnanswered(now)
	j.unindexing = j.unindexing[:0]
	for _, p := range j.finishing {
		if !p.replaced {
			j.unindexing = j.indexEntries(j.unindexing, p)
		}
	}
	j.byTuple.releaseAll(j.unindexing)
	for i, p := range j.finishing {
		j.finish(p, j.answers[i], now)
	}
	clear(j.finishing)
	j.finishing = j.finishing[:0]
}

// lookUpFinishing sets answers, one a finishing flow: from one LookupAll
// of every flow that still holds its tuple when the conntrack answers
// batches, else left for entryOf to ask.
func (j *Joiner) lookUpFinishing() {
	j.answers = slices.Grow(j.answers[:0], len(j.finishing))[:len(j.finishing)]
	clear(j.answers)
	batch, batched := j.CT.(BatchConntrack)
	if !batched || len(j.finishing) == 0 {
		return
	}
	j.lookupTus = j.lookupTus[:0]
	for _, p := range j.finishing {
		if !p.replaced {
			j.lookupTus = append(j.lookupTus, p.key().tuple())
		}
	}
	n := len(j.lookupTus)
	j.lookupCT = slices.Grow(j.lookupCT[:0], n)[:n]
	j.lookupOK = slices.Grow(j.lookupOK[:0], n)[:n]
	// Even with no tuple: the replaced flows' ends are read from the
	// DESTROYs LookupAll drains (ReadDestroyed).
	batch.LookupAll(j.lookupTus, j.lookupCT, j.lookupOK)
	asked := 0
	for i, p := range j.finishing {
		j.answers[i] = ctAnswer{batched: true}
		if !p.replaced {
			j.answers[i] = ctAnswer{entry: j.lookupCT[asked], found: j.lookupOK[asked], asked: true, batched: true}
			asked++
		}
	}
}

// holdUnanswered takes out of finishing, and queues again until
// UnansweredLinger after their last event, the flows whose connection
// still waits for its first answer (awaitsAnswer); at Flush (now zero)
// every flow finishes.
func (j *Joiner) holdUnanswered(now time.Time) {
	if now.IsZero() || j.CT == nil || UnansweredLinger <= j.linger() {
		return
	}
	n := 0
	for i, p := range j.finishing {
		if j.awaitsAnswer(p, &j.answers[i]) {
			p.held = true
			p.deadline += UnansweredLinger - j.linger()
			j.due.heap.push(p.deadline, p)
			continue
		}
		j.finishing[n], j.answers[n] = p, j.answers[i]
		n++
	}
	clear(j.finishing[n:])
	j.finishing, j.answers = j.finishing[:n], j.answers[:n]
}

// awaitsAnswer says whether p's conntrack entry is in the table and has
// seen no reply (a TCP one is still SYN_SENT), and p's events have not
// told its story yet (storyGoesOn). An entry that ended (a one-way UDP
// flood's, on a short timeout) has no more to say, and its end may not be
// kept past the flow's linger for a second lookup. A flow is held once
// after its last event. The entry is asked for first, and kept in live
// for the flow's finish when it is not held: most flows are answered, and
// leave before their events are read again.
func (j *Joiner) awaitsAnswer(p *pending, live *ctAnswer) bool {
	if p.held || p.replaced {
		return false
	}
	if !live.asked {
		live.entry, live.found = j.CT.Lookup(p.key().tuple())
		live.asked = true
	}
	e := live.entry
	if !live.found || e.Destroyed || e.Replied || p.key().proto == protoTCP && e.State != "SYN_SENT" {
		return false
	}
	return j.storyGoesOn(p)
}

// storyGoesOn: p's events are NAT decisions, or the kernel giving up on
// the next hop's neighbour: a host-unreachable and the packet's free.
func (j *Joiner) storyGoesOn(p *pending) bool {
	goesOn := true
	var unreachable event.Tuple // the packet of the last host-unreachable
	j.eachEvent(p, func(ev event.Event) bool {
		_, nat := natDecisionOf(ev)
		switch {
		case nat:
		case ev.Kind == event.KindReject && hostUnreachable(ev):
			unreachable = ev.Packet
		case ev.Kind == event.KindDrop:
			// The free of the packet it answered: NEIGH_FAILED where
			// the kernel says so (IPv4); IPv6 frees it without a
			// reason (6.18).
			goesOn = unreachable.Valid() && ev.Packet == unreachable || ev.HasReason && j.Names != nil && j.Names.DropReason(ev.Reason) == "NEIGH_FAILED"
		default:
			goesOn = false
		}
		return goesOn
	})
	return goesOn
}

// hostUnreachable: a reject's ICMP error is host-unreachable (IPv4) or
// address-unreachable (IPv6), what the kernel answers a packet whose next
// hop's neighbour never answered.
func hostUnreachable(ev event.Event) bool {
	switch event.ICMPName(ev.Packet.Src.Is4(), ev.ICMPType, ev.ICMPCode) {
	case "icmp-host-unreachable", "icmp6-addr-unreachable":
		return true
	}
	return false
}

// Open is the number of flows still collecting events or waiting out
// their linger.
func (j *Joiner) Open() int { return j.due.len() }

// finish emits p, which has left due, at now (zero at Flush); live is its
// conntrack entry when finishAll asked for it.
func (j *Joiner) finish(p *pending, live ctAnswer, now time.Time) {
	f, in, block := j.flowOf(p)
	orig, reply, hasReply := j.addConntrack(f, in, p, live)
	j.recycle(p) // the flow no longer needs it
	j.addCounters(f)
	if j.Emit == nil {
		return
	}
	j.out = Flow{Record: f, Events: j.joined, Orig: orig, Reply: reply, HasReply: hasReply, At: now, block: block}
	j.Emit(&j.out)
	if !j.out.kept {
		j.reuse(j.out.block)
	}
	j.out = Flow{}
}

// ConntrackCounters tells what conntrack's counters did around a time.
type ConntrackCounters interface {
	Around(t time.Time) (trace.ConntrackTable, bool)
}

// addCounters sets conntrack's counters beside each netfilter drop of a
// packet that carried no conntrack entry: whether conntrack itself
// dropped packets then, and how full its table was.
func (j *Joiner) addCounters(f *trace.Flow) {
	if j.Counters == nil {
		return
	}
	for i := range f.Events {
		e := &f.Events[i]
		if e.Kind != trace.KindDrop || !e.NoConntrack || e.Reason != "NETFILTER_DROP" {
			continue
		}
		if e.Netns != j.CountersNetns {
			continue // another namespace's table
		}
		if c, ok := j.Counters.Around(e.Time); ok {
			e.ConntrackTable = &c
		}
	}
}

// entryOf is the conntrack entry of p's connection: the tuple's entry,
// unless its reply tuple is not what p's NAT decisions made it, which
// means a newer connection of the tuple made it (one whose decisions are
// not read yet) and p's own is among the destroyed ones.
func (j *Joiner) entryOf(p *pending, live ctAnswer) (conntrack.Entry, bool) {
	answer := j.answer(p)
	key := p.key().tuple()
	if !p.replaced {
		e, ok := live.entry, live.found
		if !live.asked {
			e, ok = j.CT.Lookup(key)
		}
		if !ok || answer.matches(e.Reply) {
			return e, ok
		}
	}
	if h, ok := j.CT.(ReadDestroyed); ok && live.batched {
		j.destroyed = h.AppendDestroyedRead(j.destroyed[:0], key)
		e, ok := agreedEntry(j.destroyed, answer)
		clear(j.destroyed)
		return e, ok
	}
	h, ok := j.CT.(Destroyed)
	if !ok {
		return conntrack.Entry{}, false
	}
	return agreedEntry(h.Destroyed(key), answer)
}

// agreedEntry picks a replaced connection's entry from its tuple's
// destroyed entries (the kernel destroyed it to make the newer one): one
// whose reply tuple is what the connection's own NAT decisions made it.
// Conntrack's events and the kernel's decisions arrive apart, so which of
// several such entries is this connection's cannot be told; one is taken
// only when all of them say the same of the connection, since an entry of
// another connection is worse than none.
func agreedEntry(destroyed []conntrack.Entry, answer answerOf) (conntrack.Entry, bool) {
	var got conntrack.Entry
	found := false
	for _, e := range destroyed {
		if !answer.matches(e.Reply) {
			continue
		}
		if found && !sameConnectionState(got, e) {
			return conntrack.Entry{}, false
		}
		got, found = e, true
	}
	return got, found
}

func sameConnectionState(a, b conntrack.Entry) bool {
	// DYING may be set on one and not yet on another destroyed entry.
	return a.State == b.State && a.Replied == b.Replied && a.Mark == b.Mark &&
		a.Status&^conntrack.StatusDying == b.Status&^conntrack.StatusDying
}

// addConntrack records the connection's entry as it stands now, and ties
// a stray reply (a packet nobody's conntrack entry holds) to the client
// connection it answers, into in's slots. It gives the
// flow's original tuple and, when the flow has one, its reply tuple:
// f.Orig and f.Reply as values.
func (j *Joiner) addConntrack(f *trace.Flow, in flowSlots, p *pending, live ctAnswer) (orig, reply event.Tuple, hasReply bool) {
	orig = p.key().tuple()
	setReply := func(t event.Tuple) {
		reply = t
		*in.reply = *j.enc.Tuple(t)
		f.Reply = in.reply
	}
	if j.CT == nil {
		if p.reply().valid() {
			setReply(p.reply().tuple())
		}
		return orig, reply, f.Reply != nil
	}
	e, ok := j.entryOf(p, live)
	if !ok && !p.replaced && mayBeStrayReply(j.joined) {
		e, ok = j.strayReplyOwner(orig)
		if ok {
			orig = e.Orig
			f.Orig = *j.enc.Tuple(orig)
			f.Proto = event.ProtoName(orig.Proto)
		}
	}
	switch {
	case ok:
		setReply(e.Reply)
		*in.ct = trace.Conntrack{State: e.State, Status: conntrack.FormatStatus(e.Status), Mark: e.Mark, Replied: e.Replied}
		f.Conntrack = in.ct
	case p.reply().valid():
		setReply(p.reply().tuple())
	}
	if !ok {
		if ev, dropped := unconfirmedDrop(j.joined); dropped {
			status := ev.CTStatus
			*in.ct = trace.Conntrack{Status: conntrack.FormatStatus(status), Mark: ev.CTMark, Unconfirmed: true,
				Replied: status&conntrack.StatusSeenReply != 0}
			f.Conntrack = in.ct
		}
	}
	return orig, reply, f.Reply != nil
}

// unconfirmedDrop is the last drop of events whose packet carried an
// entry conntrack had not confirmed. A connection none of whose entries
// is in the table (asked when it finished, and among the ended ones), and
// whose packet was dropped with such an entry, never had its entry
// confirmed: the drop's entry is the only one it had, gone with the
// packet.
func unconfirmedDrop(events []event.Event) (event.Event, bool) {
	for i := len(events) - 1; i >= 0; i-- {
		if unconfirmedEntry(events[i]) {
			return events[i], true
		}
	}
	return event.Event{}, false
}

// mayBeStrayReply says whether a flow without a conntrack entry may be a
// stray reply, which strayReplyOwner looks for with a dump of the kernel's
// table by source: only a packet the kernel reset or dropped, in a flow
// without a NAT decision (a NAT decision's tuple is its own entry's).
// Every other flow skips that dump: a flood of connections whose entries
// are gone by the time they finish (a table overrun, early drops when it
// is full, a flush) would otherwise ask for a dump of the whole table per
// flow.
func mayBeStrayReply(events []event.Event) bool {
	stray := false
	for _, ev := range events {
		if _, ok := natDecisionOf(ev); ok {
			return false
		}
		stray = stray || ev.Kind == event.KindReset || ev.Kind == event.KindDrop
	}
	return stray
}

// strayReplyOwner: a packet to one of our sockets from a peer it never
// addressed (the return-path incident) belongs to the client connection
// with that source endpoint whose peer is someone else.
func (j *Joiner) strayReplyOwner(pkt event.Tuple) (conntrack.Entry, bool) {
	idx, ok := j.CT.(SourceIndex)
	if !ok {
		return conntrack.Entry{}, false
	}
	for _, e := range idx.BySource(pkt.Proto, pkt.DstAddrPort()) {
		if e.Orig.Dst != pkt.Src && e.Reply.Src != pkt.Src {
			return e, true
		}
	}
	return conntrack.Entry{}, false
}

const protoTCP = 6 // IPPROTO_TCP
