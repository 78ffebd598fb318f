package join

import "github.com/tracer-dev/tracer/internal/event"

// Batch carries finished flows from the joiner's goroutine to a consumer
// on another, so that the stages after the join run beside it rather
// than between its events. Add, the joiner's Emit, keeps each record from
// reuse until the joiner takes the batch back (Recycle) and copies the
// flow's typed events, which are the joiner's scratch. It is not safe for
// concurrent use: it changes hands whole, over a channel.
type Batch struct {
	flows []Flow
	// spans are each flow's events in events; a flow's Events slice is
	// set from them when it is read, as events may move while it grows.
	spans  [][2]int
	events []event.Event
}

// Add takes f in (the joiner's Emit).
func (b *Batch) Add(f *Flow) {
	f.Keep()
	start := len(b.events)
	b.events = append(b.events, f.Events...)
	b.spans = append(b.spans, [2]int{start, len(b.events)})
	in := *f
	in.kept = false
	in.Events = nil
	b.flows = append(b.flows, in)
}

// Len is the number of flows in b.
func (b *Batch) Len() int { return len(b.flows) }

// Flow is b's flow i, with its events; the consumer may Keep it, as it
// would an Emit's.
func (b *Batch) Flow(i int) *Flow {
	f := &b.flows[i]
	s := b.spans[i]
	f.Events = b.events[s[0]:s[1]:s[1]]
	return f
}

// Recycle takes back a batch its consumer is done with, on the joiner's
// goroutine: the records nobody kept are reused (ReuseFlows), and b is
// empty, its memory kept for the next.
func (j *Joiner) Recycle(b *Batch) {
	for i := range b.flows {
		if !b.flows[i].kept {
			j.reuse(b.flows[i].block)
		}
	}
	clear(b.flows)
	clear(b.events)
	b.flows, b.spans, b.events = b.flows[:0], b.spans[:0], b.events[:0]
}
