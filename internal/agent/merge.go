package agent

import (
	"container/heap"
	"time"

	"github.com/tracer-dev/tracer/internal/diagnose"
	"github.com/tracer-dev/tracer/internal/trace"
)

// DefaultWindow is how long a merged flow waits for flows of other nodes
// that happened before it, or that are the same connection. A node emits a
// flow once it has been quiet for its linger (1.5 s by default; 3.5 s,
// join.UnansweredLinger, for a connection nothing answered yet, which the
// return path's DNAT node has), and up to a poll interval (2 s) more when
// its rule needs the next reading of the node's state: parts of one
// connection reach the client within about 4 s of each other.
const DefaultWindow = 5 * time.Second

// Merger orders the flows of several nodes by their time, and joins the
// flows of one connection seen on several nodes into one. Each flow waits
// Window after the first of its connection arrived; the flows that have
// waited leave in time order. A flow that arrives more than Window after
// a later one has left comes out of order, and is counted.
type Merger struct {
	Window time.Duration
	queue  groupHeap
	// byTuple leads the tuples of every queued flow (as it arrived at its
	// node, and as it left it) to its group.
	byTuple map[tupleKey]*group
	seq     uint64
	last    time.Time // the time of the last flow out
	// OutOfOrder counts the flows that left after a later one; Joined the
	// flows that were joined into another node's flow of the connection.
	OutOfOrder uint64
	Joined     uint64
}

// group is one connection's flows from different nodes.
type group struct {
	parts   []*trace.Flow
	time    time.Time // the earliest part's
	arrived time.Time // when the first part arrived
	seq     uint64    // arrival order: equal times leave as they came
	index   int       // in the heap
}

type tupleKey struct{ proto, src, dst string }

// arrivedAs is a flow's connection as it reached its node; leftAs as it
// left, after the node's NAT: its conntrack reply tuple reversed;
// answeredAs the answer the node's conntrack expects, which is how that
// answer reaches another node when it bypasses this one.
func arrivedAs(f *trace.Flow) tupleKey { return tupleKey{f.Proto, f.Orig.Src, f.Orig.Dst} }

func leftAs(f *trace.Flow) tupleKey {
	if f.Reply == nil {
		return arrivedAs(f)
	}
	return tupleKey{f.Proto, f.Reply.Dst, f.Reply.Src}
}

func answeredAs(f *trace.Flow) (tupleKey, bool) {
	if f.Reply == nil {
		return tupleKey{}, false
	}
	return tupleKey{f.Proto, f.Reply.Src, f.Reply.Dst}, true
}

func keysOf(f *trace.Flow) []tupleKey {
	keys := []tupleKey{arrivedAs(f), leftAs(f)}
	if k, ok := answeredAs(f); ok {
		keys = append(keys, k)
	}
	return keys
}

// Add queues f, which arrived at now, with the flows of its connection
// other nodes saw within the window, if any are queued.
func (m *Merger) Add(f *trace.Flow, now time.Time) {
	if m.byTuple == nil {
		m.byTuple = map[tupleKey]*group{}
	}
	if g := m.sameConnection(f); g != nil {
		g.parts = append(g.parts, f)
		if f.Time.Before(g.time) {
			g.time = f.Time
			heap.Fix(&m.queue, g.index)
		}
		m.Joined++
		m.index(g, f)
		return
	}
	m.seq++
	g := &group{parts: []*trace.Flow{f}, time: f.Time, arrived: now, seq: m.seq}
	heap.Push(&m.queue, g)
	m.index(g, f)
}

// sameConnection is the queued group of f's connection, if another node
// saw it close enough in time: a flow that left its node as f arrived at
// f's (or arrived as f left), or whose answer is what reached f's node
// (the answer bypassed the node that translated the connection).
func (m *Merger) sameConnection(f *trace.Flow) *group {
	for _, k := range keysOf(f) {
		g := m.byTuple[k]
		if g == nil || !m.near(g, f) || g.has(f.Node) && diagnose.Translated(f) {
			// A flow with its own NAT decision from a node already in
			// the group is a new connection of the same tuple; a
			// stray answer repeats (retransmissions).
			continue
		}
		for _, p := range g.parts {
			if p.Node != f.Node && continues(p, f) {
				return g
			}
		}
	}
	return nil
}

// continues says whether a (on one node) and b (on another) are one
// connection, whichever came first on its way.
func continues(a, b *trace.Flow) bool {
	if leftAs(a) == arrivedAs(b) || arrivedAs(a) == leftAs(b) {
		return true
	}
	ka, okA := answeredAs(a)
	kb, okB := answeredAs(b)
	return okA && ka == arrivedAs(b) || okB && kb == arrivedAs(a)
}

func (m *Merger) near(g *group, f *trace.Flow) bool {
	for _, p := range g.parts {
		if p.Time.Sub(f.Time).Abs() <= m.window() {
			return true
		}
	}
	return false
}

func (g *group) has(node string) bool {
	for _, p := range g.parts {
		if p.Node == node {
			return true
		}
	}
	return false
}

func (m *Merger) index(g *group, f *trace.Flow) {
	for _, k := range keysOf(f) {
		if _, taken := m.byTuple[k]; !taken {
			m.byTuple[k] = g
		}
	}
}

// Ready appends to out the flows whose wait is over at now, in order.
func (m *Merger) Ready(now time.Time, out []*trace.Flow) []*trace.Flow {
	for len(m.queue) > 0 && !now.Before(m.queue[0].arrived.Add(m.window())) {
		out = m.pop(out)
	}
	return out
}

// Drain appends every queued flow in order (the streams have ended).
func (m *Merger) Drain(out []*trace.Flow) []*trace.Flow {
	for len(m.queue) > 0 {
		out = m.pop(out)
	}
	return out
}

func (m *Merger) pop(out []*trace.Flow) []*trace.Flow {
	g := heap.Pop(&m.queue).(*group)
	for _, p := range g.parts {
		for _, k := range keysOf(p) {
			if m.byTuple[k] == g {
				delete(m.byTuple, k)
			}
		}
	}
	f := g.parts[0]
	if len(g.parts) > 1 {
		f = joinFlows(g.parts)
	}
	if f.Time.Before(m.last) {
		m.OutOfOrder++
	} else {
		m.last = f.Time
	}
	return append(out, f)
}

func (m *Merger) window() time.Duration {
	if m.Window > 0 {
		return m.Window
	}
	return DefaultWindow
}

// groupHeap is ordered by the groups' time, then arrival.
type groupHeap []*group

func (h groupHeap) Len() int { return len(h) }
func (h groupHeap) Less(i, j int) bool {
	if c := h[i].time.Compare(h[j].time); c != 0 {
		return c < 0
	}
	return h[i].seq < h[j].seq
}
func (h groupHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *groupHeap) Push(x any) {
	g := x.(*group)
	g.index = len(*h)
	*h = append(*h, g)
}
func (h *groupHeap) Pop() any {
	old := *h
	g := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return g
}

// Skew tracks how far a node's clock is from this machine's, from the
// send times of its messages: the largest (send - receive) seen is the
// offset with the least network delay in it.
type Skew struct {
	best time.Duration
	seen bool
}

// Observe notes a message the agent sent at sent and that arrived at recv.
func (s *Skew) Observe(sent, recv time.Time) {
	if d := sent.Sub(recv); !s.seen || d > s.best {
		s.best, s.seen = d, true
	}
}

// Offset is the node's clock minus this machine's, as far as seen; ok is
// false before any message.
func (s *Skew) Offset() (time.Duration, bool) { return s.best, s.seen }
