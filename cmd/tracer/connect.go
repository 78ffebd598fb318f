package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/tracer-dev/tracer/internal/agent"
	"github.com/tracer-dev/tracer/internal/filter"
)

func init() {
	commands["connect"] = command{
		summary: "merge the flows of running agents (tracer agent), ordered by time, each with its node",
		run:     runConnect,
	}
}

type connectOptions struct {
	output   string
	filter   string
	window   time.Duration
	buffer   int
	duration time.Duration
}

func runConnect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o connectOptions
	fs := newFlagSet("connect", stderr)
	o.registerOutput(fs)
	o.registerStream(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tracer connect [FLAGS] AGENT...\n\nAGENT: HOST:PORT (tracer agent --listen) or unix:PATH (--socket).")
		fs.PrintDefaults()
	}
	agents, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := o.validate(agents); err != nil {
		return err
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	targets := make([]mergeTarget, len(agents))
	for i, a := range agents {
		targets[i] = mergeTarget{addr: a}
	}
	return newMerge(o, targets, stdout, stderr).run(ctx, "connect")
}

func (o *connectOptions) registerOutput(fs *flag.FlagSet) {
	fs.StringVar(&o.output, "o", "text", "output: text, json (NDJSON, a trace whose flows name their node) or ui (the live terminal UI, with a node column)")
}

// registerStream: the flags of following agents' streams.
func (o *connectOptions) registerStream(fs *flag.FlagSet) {
	fs.StringVar(&o.filter, "filter", "", "filter `EXPR`, applied in each agent (the language of tracer trace --filter)")
	fs.DurationVar(&o.window, "window", agent.DefaultWindow, "how long a flow waits for earlier flows of other nodes before it is shown")
	fs.IntVar(&o.buffer, "buffer", 0, fmt.Sprintf("flows each agent holds for this client while it reads slowly (0: %d, at most %d)", agent.DefaultBuffer, agent.MaxBuffer))
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long; 0 runs until interrupted or every agent ends")
}

func (o connectOptions) validate(agents []string) error {
	if len(agents) == 0 {
		return usagef("no agent given: tracer connect HOST:PORT|unix:PATH ...")
	}
	seen := map[string]bool{}
	for _, a := range agents {
		if seen[a] {
			return usagef("agent %s given twice", a)
		}
		seen[a] = true
	}
	return o.validateFlags()
}

func (o connectOptions) validateFlags() error {
	switch o.output {
	case "text", "json":
	case "ui":
		if err := requireTerminal(); err != nil {
			return err
		}
	default:
		return usagef("-o %q: want text, json or ui", o.output)
	}
	if _, err := filter.Parse(o.filter); err != nil {
		return usagef("--filter: %v", err)
	}
	if o.window < 0 || o.duration < 0 {
		return usagef("--window and --duration must not be negative")
	}
	if o.buffer < 0 || o.buffer > agent.MaxBuffer {
		return usagef("--buffer %d: want 0 to %d", o.buffer, agent.MaxBuffer)
	}
	return nil
}
