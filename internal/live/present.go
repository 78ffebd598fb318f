package live

import (
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// handoff is what Run's goroutine, which reads and joins, hands the
// presenter at each expiry round (every 100 ms), when full, and at the
// end: the flows the join finished since the last, and the events read
// for Sink.Event.
type handoff struct {
	flows join.Batch
	// release: the round ended in an Expire at now. added of flows were
	// finished by Adds before it: the held flows are released between
	// those and the Expire's, as Stages.Expire does.
	release bool
	added   int
	now     time.Time
	events  []event.Event
}

// presenter is the pipeline's last stages on a goroutine of their own:
// it enriches the joined flows (attribution, names, diagnosis) and hands
// them and the events to the sink, beside the goroutine that reads and
// joins. Enrichment and writing are about half of the pipeline's work a
// flow; on one goroutine they held up the reading of the next events,
// so the pipeline could never use more than one core. Every call to the
// sink is made on the presenter's goroutine.
type presenter struct {
	enrich *enrich.Enricher
	sink   Sink
	work   chan *handoff
	// back returns handoffs to Run's goroutine: their flows' records
	// for the join to reuse (join.Joiner.Recycle), their memory for the
	// next round.
	back chan *handoff
	done chan struct{}
	// flows and verdicts are the summary's counts of the flows emitted.
	flows    int
	verdicts map[string]int
}

// A round is handed over at each expiry and whenever it holds roundMax
// flows and events; the presenter may fall presenterQueue rounds behind
// before Run's goroutine waits for it, leaving the events behind them in
// the ring buffer. What the two hold between them stays about what Run's
// channel from the reader held alone, so a stop that cannot drain the
// ring buffer in time still counts what it could not read (drainLimit).
const (
	roundMax       = 256
	presenterQueue = 2
)

func newPresenter(e *enrich.Enricher, sink Sink, count func()) *presenter {
	pr := &presenter{sink: sink, work: make(chan *handoff, presenterQueue), back: make(chan *handoff, presenterQueue+2),
		done: make(chan struct{}), verdicts: map[string]int{}}
	e.Emit = func(f *trace.Flow) {
		count()
		pr.flows++
		pr.verdicts[f.Verdict]++
		sink.Flow(f)
	}
	pr.enrich = e
	go pr.run()
	return pr
}

// run presents each round as it comes; once Run has handed over its last
// (and closed work), it emits every held flow.
func (pr *presenter) run() {
	defer close(pr.done)
	for h := range pr.work {
		pr.present(h)
		pr.sink.flush()
		select {
		case pr.back <- h:
		default:
		}
	}
	pr.enrich.Flush()
	pr.sink.flush()
}

// present runs one round as Stages did on one goroutine: the flows Adds
// finished, the release of held flows, then the Expire's flows.
func (pr *presenter) present(h *handoff) {
	if pr.sink.Event != nil {
		for _, ev := range h.events {
			pr.sink.Event(ev)
		}
	}
	n, added := h.flows.Len(), h.flows.Len()
	if h.release {
		added = h.added
	}
	for i := range added {
		pr.enrich.Take(h.flows.Flow(i))
	}
	if h.release {
		pr.enrich.Release(h.now)
	}
	for i := added; i < n; i++ {
		pr.enrich.Take(h.flows.Flow(i))
	}
}

// next is an empty handoff for Run's goroutine to fill: one the presenter
// is done with, its flows given back to the join, or a new one.
func (pr *presenter) next(j *join.Joiner) *handoff {
	select {
	case h := <-pr.back:
		j.Recycle(&h.flows)
		clear(h.events)
		*h = handoff{flows: h.flows, events: h.events[:0]}
		return h
	default:
		return new(handoff)
	}
}

// full says h is to be handed over now, its round not yet over.
func (h *handoff) full() bool { return h.flows.Len()+len(h.events) >= roundMax }

// stages are the join, on the goroutine that calls them, and the
// presenter on its own.
type stages struct {
	join   *join.Joiner
	pr     *presenter
	round  *handoff
	events bool // the sink takes events
}

// newStages wires j to a presenter of e and sink; count is told of each
// flow emitted.
func newStages(j *join.Joiner, e *enrich.Enricher, sink Sink, count func()) *stages {
	s := &stages{join: j, pr: newPresenter(e, sink, count), events: sink.Event != nil}
	s.round = s.pr.next(j)
	j.Emit = func(f *join.Flow) {
		if s.round.flows.Add(f); s.round.full() {
			s.handOver()
		}
	}
	return s
}

// handOver sends the round, waiting while the presenter is
// presenterQueue rounds behind, and starts the next.
func (s *stages) handOver() {
	s.pr.work <- s.round
	s.round = s.pr.next(s.join)
}

// Add joins one event at now, the pipeline's clock.
func (s *stages) Add(ev event.Event, now time.Time) {
	s.join.Add(ev, now)
	if s.events {
		if s.round.events = append(s.round.events, ev); s.round.full() {
			s.handOver()
		}
	}
}

// Expire ends a round: the held flows are released, then the flows
// quiet since their deadline finish.
func (s *stages) Expire(now time.Time) {
	s.round.release, s.round.added, s.round.now = true, s.round.flows.Len(), now
	s.join.Expire(now)
	s.handOver()
}

// stop finishes every open flow, then every held one, and waits for the
// presenter to have handed them all to the sink; it returns the counts
// of the flows emitted.
func (s *stages) stop() (flows int, verdicts map[string]int) {
	s.join.Flush()
	s.pr.work <- s.round
	close(s.pr.work)
	<-s.pr.done
	return s.pr.flows, s.pr.verdicts
}
