package main

import (
	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/trace"
)

// parseFilter parses --filter; a bad expression is bad usage.
func parseFilter(expr string) (filter.Filter, error) {
	f, err := filter.Parse(expr)
	if err != nil {
		return f, usagef("--filter: %v", err)
	}
	return f, nil
}

// applyKernelFilter pushes the simple terms of a filter into the kernel
// side, so a busy node sends only what was asked for; userspace still
// applies the whole filter.
func applyKernelFilter(cfg *loader.Config, f filter.Filter) {
	ports, prefixes, protos, ok := f.KernelTerms()
	if !ok {
		return
	}
	trial := *cfg
	trial.Ports, trial.Prefixes, trial.Protos = ports, prefixes, protos
	if trial.Validate() == nil {
		*cfg = trial
	}
}

// eventFlow wraps a lone event as a flow so the filter language applies to
// it as it will to joined flows.
func eventFlow(e *trace.Event) *trace.Flow {
	f := &trace.Flow{Type: trace.TypeFlow, Time: e.Time, Proto: e.Proto, Events: []trace.Event{*e}}
	switch {
	case e.Orig != nil:
		f.Orig, f.Reply = *e.Orig, e.Reply
	case e.Packet != nil:
		f.Orig = *e.Packet
	}
	return f
}
