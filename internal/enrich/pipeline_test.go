package enrich

import (
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
)

// pipeline is the join and the enricher wired as internal/live wires
// them: the enricher takes what the joiner emits, and releases the flows
// it held before each of the joiner's Expires.
type pipeline struct {
	j *join.Joiner
	e *Enricher
}

func newPipeline(j join.Joiner, e Enricher) *pipeline {
	p := &pipeline{j: &j, e: &e}
	p.j.Emit = p.e.Take
	return p
}

func (p *pipeline) Add(ev event.Event, now time.Time) { p.j.Add(ev, now) }

func (p *pipeline) Expire(now time.Time) {
	p.e.Release(now)
	p.j.Expire(now)
}

func (p *pipeline) Flush() {
	p.j.Flush()
	p.e.Flush()
}

func (p *pipeline) Open() int { return p.j.Open() + p.e.Held() }
