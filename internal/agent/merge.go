package agent

import (
	"container/heap"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// DefaultWindow is how long a merged flow waits for flows of other nodes
// that happened before it. A node emits a flow once it has been quiet for
// its linger (1.5 s by default), or up to a poll interval more when its
// rule needs the next reading of the node's state: flows of one moment
// reach the client within about 3 s of each other.
const DefaultWindow = 3 * time.Second

// Merger orders the flows of several nodes by their time. Each flow waits
// Window after it arrives; the flows that have waited leave in time
// order. A flow that arrives more than Window after a later one has left
// comes out of order, and is counted.
type Merger struct {
	Window time.Duration
	queue  flowHeap
	seq    uint64
	last   time.Time // the time of the last flow out
	// OutOfOrder counts the flows that left after a later one.
	OutOfOrder uint64
}

// Add queues f, which arrived at now.
func (m *Merger) Add(f *trace.Flow, now time.Time) {
	m.seq++
	heap.Push(&m.queue, queued{f: f, arrived: now, seq: m.seq})
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

// Queued is how many flows wait.
func (m *Merger) Queued() int { return len(m.queue) }

func (m *Merger) pop(out []*trace.Flow) []*trace.Flow {
	q := heap.Pop(&m.queue).(queued)
	if q.f.Time.Before(m.last) {
		m.OutOfOrder++
	} else {
		m.last = q.f.Time
	}
	return append(out, q.f)
}

func (m *Merger) window() time.Duration {
	if m.Window > 0 {
		return m.Window
	}
	return DefaultWindow
}

type queued struct {
	f       *trace.Flow
	arrived time.Time
	seq     uint64 // arrival order: equal times leave as they came
}

// flowHeap is ordered by flow time, then arrival.
type flowHeap []queued

func (h flowHeap) Len() int { return len(h) }
func (h flowHeap) Less(i, j int) bool {
	if c := h[i].f.Time.Compare(h[j].f.Time); c != 0 {
		return c < 0
	}
	return h[i].seq < h[j].seq
}
func (h flowHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *flowHeap) Push(x any)   { *h = append(*h, x.(queued)) }
func (h *flowHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = queued{}
	*h = old[:len(old)-1]
	return q
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
