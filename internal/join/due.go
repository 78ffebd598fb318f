package join

import "time"

// dueQueue holds every open flow once until it finishes, by deadline. A
// new flow's deadline is nearly always the latest yet (the clock moves on
// and the linger is fixed), so new flows wait in a FIFO of pointers, 8
// bytes a flow where a heap entry takes 16. A flow whose deadline moved
// on since it was queued (a later event set moved) goes to a heap by
// deadline once it reaches the FIFO's front, and a flow that comes out of
// order goes there at once; Expire takes from whichever is due first.
type dueQueue struct {
	fifo []*pending
	head int
	last time.Duration // deadline of the FIFO's newest flow
	heap deadlines
}

func (q *dueQueue) len() int { return len(q.fifo) - q.head + len(q.heap) }

func (q *dueQueue) push(p *pending) {
	if q.head < len(q.fifo) && p.deadline < q.last {
		q.heap.push(p.deadline, p)
		return
	}
	q.fifo = append(q.fifo, p)
	q.last = p.deadline
}

// peek is when the next flow is due: a FIFO flow's deadline, or a heap
// entry's, which the flow's deadline may have moved on from. fromFIFO
// says where pop takes it from; ok is false when the queue is empty.
func (q *dueQueue) peek() (at time.Duration, fromFIFO, ok bool) {
	for q.head < len(q.fifo) && q.fifo[q.head].moved {
		p := q.popFIFO()
		p.moved = false
		q.heap.push(p.deadline, p)
	}
	switch {
	case q.head < len(q.fifo) && (len(q.heap) == 0 || q.fifo[q.head].deadline <= q.heap[0].at):
		return q.fifo[q.head].deadline, true, true
	case len(q.heap) > 0:
		return q.heap[0].at, false, true
	}
	return 0, false, false
}

// pop takes the flow peek named.
func (q *dueQueue) pop(fromFIFO bool) *pending {
	if fromFIFO {
		return q.popFIFO()
	}
	return q.heap.pop()
}

func (q *dueQueue) popFIFO() *pending {
	p := q.fifo[q.head]
	q.fifo[q.head] = nil
	q.head++
	switch {
	case q.head == len(q.fifo):
		q.fifo, q.head = q.fifo[:0], 0
	case q.head >= 1024 && 2*q.head >= len(q.fifo):
		// Slide the live half down rather than let the slice's front
		// grow without bound.
		n := copy(q.fifo, q.fifo[q.head:])
		clear(q.fifo[n:])
		q.fifo, q.head = q.fifo[:n], 0
	}
	return p
}

// deadlines is a min-heap of open flows by the deadline each had when it
// was queued; a flow's deadline only moves later, so a flow is never due
// before its entry comes up.
type deadlines []deadline

type deadline struct {
	at time.Duration // since the joiner's epoch
	p  *pending
}

func (h *deadlines) push(at time.Duration, p *pending) {
	*h = append(*h, deadline{at, p})
	d := *h
	for i := len(d) - 1; i > 0; {
		parent := (i - 1) / 2
		if d[i].at >= d[parent].at {
			break
		}
		d[i], d[parent] = d[parent], d[i]
		i = parent
	}
}

func (h *deadlines) pop() *pending {
	d := *h
	top := d[0].p
	last := len(d) - 1
	d[0] = d[last]
	d[last] = deadline{}
	d = d[:last]
	for i := 0; ; {
		small, l, r := i, 2*i+1, 2*i+2
		if l < len(d) && d[l].at < d[small].at {
			small = l
		}
		if r < len(d) && d[r].at < d[small].at {
			small = r
		}
		if small == i {
			break
		}
		d[i], d[small] = d[small], d[i]
		i = small
	}
	*h = d
	return top
}
