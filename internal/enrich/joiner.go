package enrich

import (
	"net/netip"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich/conntrack"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Conntrack is the conntrack table the join reads (conntrack.Tracker).
type Conntrack interface {
	Lookup(event.Tuple) (conntrack.Entry, bool)
}

// SourceIndex finds a client's connections by their source endpoint; it is
// how a reply from the wrong five-tuple is tied to the connection it
// answers. Optional: a Conntrack that has it is used for it.
type SourceIndex interface {
	BySource(proto uint8, src netip.AddrPort) []conntrack.Entry
}

// DefaultLinger is how long a flow stays open after its last event: long
// enough for the rest of its decisions (SNAT after DNAT, the drop after a
// REJECT) and for a reply to show in conntrack, short enough to read live.
const DefaultLinger = 1500 * time.Millisecond

// Joiner groups events into flows by connection and hands each flow,
// enriched and diagnosed, to Emit once it has been quiet for Linger.
// It is not safe for concurrent use: one goroutine feeds it.
type Joiner struct {
	Linger time.Duration
	CT     Conntrack  // nil: no conntrack (flows carry what events say)
	Env    func() Env // the current node and cluster state
	Emit   func(*trace.Flow)

	open    map[event.Tuple]*pending
	byTuple map[event.Tuple]event.Tuple
}

type pending struct {
	key      event.Tuple
	flow     *trace.Flow
	tuples   []event.Tuple
	deadline time.Time
	reply    event.Tuple
}

// Add joins one decoded event (rec is its trace form).
func (j *Joiner) Add(ev event.Event, rec trace.Event, now time.Time) {
	if j.open == nil {
		j.open = map[event.Tuple]*pending{}
		j.byTuple = map[event.Tuple]event.Tuple{}
	}
	tu := ev.Packet
	if ev.Kind == event.KindDNAT || ev.Kind == event.KindSNAT || ev.Kind == event.KindIPVS || !tu.Valid() {
		tu = ev.Orig
	}
	if !tu.Valid() {
		return
	}
	key, reply := j.resolve(tu, ev)
	p := j.open[key]
	if p == nil {
		p = &pending{key: key, flow: newFlow(key, rec)}
		j.open[key] = p
		j.index(p, key)
	}
	if reply.Valid() && !p.reply.Valid() {
		p.reply = reply
		j.index(p, reply, reply.Reverse())
	}
	p.flow.Events = append(p.flow.Events, rec)
	p.deadline = now.Add(j.linger())
}

func (j *Joiner) linger() time.Duration {
	if j.Linger > 0 {
		return j.Linger
	}
	return DefaultLinger
}

// resolve finds the connection a tuple belongs to: an open flow that has
// seen it, else the conntrack entry holding it, else the tuple itself.
func (j *Joiner) resolve(tu event.Tuple, ev event.Event) (key, reply event.Tuple) {
	if ev.Reply.Valid() {
		reply = ev.Reply
	}
	if k, ok := j.byTuple[tu]; ok {
		return k, reply
	}
	// A NAT decision carries both tuples of its connection, read from
	// nf_conn: the original one is the key, conntrack has nothing to add.
	if (ev.Kind == event.KindDNAT || ev.Kind == event.KindSNAT) && reply.Valid() {
		return tu, reply
	}
	if j.CT != nil {
		if e, ok := j.CT.Lookup(tu); ok {
			if k, ok := j.byTuple[e.Orig]; ok {
				return k, e.Reply
			}
			return e.Orig, e.Reply
		}
	}
	return tu, reply
}

func (j *Joiner) index(p *pending, tuples ...event.Tuple) {
	for _, t := range tuples {
		if _, taken := j.byTuple[t]; !taken {
			j.byTuple[t] = p.key
			p.tuples = append(p.tuples, t)
		}
	}
}

func newFlow(key event.Tuple, rec trace.Event) *trace.Flow {
	return &trace.Flow{Type: trace.TypeFlow, Time: rec.Time, Proto: event.ProtoName(key.Proto), Orig: *event.TupleRecord(key)}
}

// Expire finishes every flow quiet since its deadline.
func (j *Joiner) Expire(now time.Time) {
	for key, p := range j.open {
		if !now.Before(p.deadline) {
			j.finish(key, p)
		}
	}
}

// Flush finishes every open flow (at exit).
func (j *Joiner) Flush() {
	for key, p := range j.open {
		j.finish(key, p)
	}
}

// Open is the number of flows still collecting events.
func (j *Joiner) Open() int { return len(j.open) }

func (j *Joiner) finish(key event.Tuple, p *pending) {
	delete(j.open, key)
	for _, t := range p.tuples {
		delete(j.byTuple, t)
	}
	f := p.flow
	j.addConntrack(f, p)
	if j.Env != nil {
		Enrich(f, j.Env())
	}
	if j.Emit != nil {
		j.Emit(f)
	}
}

// addConntrack records the connection's entry as it stands now, and ties
// a stray reply (a packet nobody's conntrack entry holds) to the client
// connection it answers.
func (j *Joiner) addConntrack(f *trace.Flow, p *pending) {
	if j.CT == nil {
		if p.reply.Valid() {
			f.Reply = event.TupleRecord(p.reply)
		}
		return
	}
	e, ok := j.CT.Lookup(p.key)
	if !ok {
		e, ok = j.strayReplyOwner(p.key)
		if ok {
			f.Orig = *event.TupleRecord(e.Orig)
			f.Proto = event.ProtoName(e.Orig.Proto)
		}
	}
	switch {
	case ok:
		f.Reply = event.TupleRecord(e.Reply)
		f.Conntrack = &trace.Conntrack{State: e.State, Status: conntrack.FormatStatus(e.Status), Mark: e.Mark, Replied: e.Replied}
	case p.reply.Valid():
		f.Reply = event.TupleRecord(p.reply)
	}
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
