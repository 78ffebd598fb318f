package enrich

import (
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Enricher is the stage after the join: it attributes each joined flow's
// decision to a rule, names its pods and Service, diagnoses it and hands
// it to Emit. Its Take is the joiner's Emit, or takes the flows of a
// join.Batch. It is not safe for concurrent use: one goroutine runs it,
// the joiner's or the one the joiner hands its flows to.
type Enricher struct {
	// Env is the node and cluster state in force at a flow's decision
	// (its first event), which the rules may have changed since.
	Env func(at time.Time) Env
	// EnvAfter, when set, is the first node state read after at, nil when
	// none is yet: it settles a flow whose rules changed between two
	// readings (EnrichBetween).
	EnvAfter func(at time.Time) Env
	// HoldFor, with EnvAfter, is how long a flow whose rule is uncertain
	// and that no reading after its decision can settle yet waits for one
	// (about a poll interval): the rules are polled, so a rewrite just
	// before the decision shows only in the next reading.
	HoldFor time.Duration
	Emit    func(*trace.Flow)

	// held are finished flows waiting for the next reading (HoldFor), in
	// the order they finished, which is their deadlines' order.
	held []heldFlow
}

type heldFlow struct {
	f     *trace.Flow
	until time.Time
}

// Take enriches f and emits it, or holds it when its rule is uncertain
// and no reading after its decision exists yet.
func (e *Enricher) Take(f *join.Flow) {
	var next Env
	if e.EnvAfter != nil {
		next = e.EnvAfter(f.Record.Time)
	}
	a := joinedAddrs(f)
	if testHookJoinedAddrs != nil {
		testHookJoinedAddrs(f.Record, a)
	}
	enrichBetween(f.Record, &a, e.Env(f.Record.Time), next)
	if e.hold(f.Record, next, f.At) {
		f.Keep()
		return
	}
	e.Emit(f.Record)
}

// hold keeps f for the next reading when its rule is uncertain and none
// after its decision exists yet; finished at now, zero at the join's
// Flush, when nothing waits.
func (e *Enricher) hold(f *trace.Flow, next Env, now time.Time) bool {
	if next != nil || e.HoldFor <= 0 || e.EnvAfter == nil || now.IsZero() || f.Rule == nil || f.Rule.Uncertain == "" {
		return false
	}
	e.held = append(e.held, heldFlow{f: f, until: now.Add(e.HoldFor)})
	return true
}

// Release emits the held flows a reading now settles, and those whose
// wait is over (all of them when now is zero, at Flush), with the rule
// they have. The pipeline calls it before each of the joiner's Expires.
func (e *Enricher) Release(now time.Time) {
	kept := e.held[:0]
	for _, h := range e.held {
		next := e.EnvAfter(h.f.Time)
		switch {
		case next != nil:
			EnrichBetween(h.f, e.Env(h.f.Time), next)
		case !now.IsZero() && now.Before(h.until):
			kept = append(kept, h)
			continue
		}
		e.Emit(h.f)
	}
	clear(e.held[len(kept):])
	e.held = kept
}

// Flush emits every held flow, settled by a reading when one exists
// (at exit, after the joiner's Flush).
func (e *Enricher) Flush() { e.Release(time.Time{}) }

// Held is the number of flows waiting for a reading.
func (e *Enricher) Held() int { return len(e.held) }

// testHookJoinedAddrs, set by tests, sees every flow the enricher takes
// with the addresses it made of its typed events.
var testHookJoinedAddrs func(*trace.Flow, flowAddrs)

// Stages are the join and the enricher wired on one goroutine: the
// enricher takes what the joiner emits, and releases the flows it held
// before each of the joiner's Expires and after its Flush. internal/live
// keeps that order with the enricher on a goroutine of its own.
type Stages struct {
	Join   *join.Joiner
	Enrich *Enricher
}

// NewStages sets j's Emit to e's Take.
func NewStages(j *join.Joiner, e *Enricher) *Stages {
	j.Emit = e.Take
	return &Stages{Join: j, Enrich: e}
}

// Add joins one decoded event at now, the pipeline's clock.
func (s *Stages) Add(ev event.Event, now time.Time) { s.Join.Add(ev, now) }

// Expire releases the held flows whose reading or wait has come, then
// finishes the flows quiet since their deadline.
func (s *Stages) Expire(now time.Time) {
	s.Enrich.Release(now)
	s.Join.Expire(now)
}

// Flush finishes every open flow and then every held one (at exit).
func (s *Stages) Flush() {
	s.Join.Flush()
	s.Enrich.Flush()
}

// Open is the number of flows not emitted yet: open in the join or held.
func (s *Stages) Open() int { return s.Join.Open() + s.Enrich.Held() }
