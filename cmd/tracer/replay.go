package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/internal/tui"
)

func init() {
	commands["replay"] = command{
		summary: "open a recorded trace in the UI; with -o json, re-emit it re-diagnosed",
		run:     runReplay,
	}
}

// rediagnose runs on every flow a replay reads, before filtering, so a
// trace recorded by an older tracer, or on another machine, is shown with
// today's diagnosis against the node state and the pods and Services in
// force when each flow was decided: the header's snapshot, then each
// recorded change from its time on.
func rediagnose(tr *trace.File) error {
	h := tr.Header
	// The node's states: the header's, then each line that changed a node
	// part. Pods and Services come from one time-aware index of the whole
	// trace instead, so a busy cluster's metadata lines neither copy the
	// pods into a state each nor rebuild the rules.
	timeline := trace.NewTimeline(h.Snapshot)
	lineOf := []int{0} // the state line of each node state, for errors
	for i, c := range tr.States {
		if slices.Contains(c.Changed, trace.PartWarnings) {
			for _, w := range c.Warnings {
				tr.Header.Warnings = appendNew(tr.Header.Warnings, "from "+c.Time.Format(time.RFC3339)+": "+w)
			}
		}
		if node := c.NodeParts(); node != nil {
			timeline.Add(node)
			lineOf = append(lineOf, i+1)
		}
	}
	meta := enrich.NewTimelineMetadata(h.Snapshot, tr.States)
	envs := make([]*enrich.NodeEnv, timeline.Len())
	envOf := func(i int) (*enrich.NodeEnv, error) {
		if envs[i] == nil {
			env, err := enrich.NewNodeEnv(h.Node, timeline.Snapshot(i), meta)
			if err != nil {
				if i == 0 {
					return nil, usagef("trace header: %v", err)
				}
				return nil, usagef("node state from %s (state line %d): %v", tr.States[lineOf[i]-1].Time.Format(time.RFC3339Nano), lineOf[i], err)
			}
			envs[i] = env
			tr.Header.Warnings = appendNew(tr.Header.Warnings, env.Warnings()...)
		}
		return envs[i], nil
	}
	if _, err := envOf(0); err != nil {
		return err
	}
	for _, f := range tr.Flows {
		at, _ := timeline.At(f.Time)
		env, err := envOf(at)
		if err != nil {
			return err
		}
		// The node state read next settles a flow decided while the rules
		// were being rewritten, as it did live (enrich.EnrichBetween).
		var next enrich.Env
		if i := timeline.After(f.Time); i > 0 {
			n, err := envOf(i)
			if err != nil {
				return err
			}
			next = n
		}
		enrich.EnrichBetween(f, env, next)
	}
	return nil
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("replay", stderr)
	output := fs.String("o", "ui", "output: ui (the terminal UI) or json (NDJSON on stdout)")
	filterExpr := fs.String("filter", "", "show only flows matching `EXPR` (pod:, ns:, port:, ip:, verdict:, proto:, node:, words, !term)")
	var sc storeCaps
	sc.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tracer replay [-o ui|json] [--filter EXPR] [--max-flows N] [--max-memory SIZE] FILE")
		fs.PrintDefaults()
	}
	path, err := parseReplayArgs(fs, args)
	if err != nil {
		return err
	}
	if *output != "ui" && *output != "json" {
		return usagef("-o %q: use ui or json", *output)
	}
	flt, err := filter.Parse(*filterExpr)
	if err != nil {
		return usagef("--filter: %w", err)
	}
	caps, err := sc.caps()
	if err != nil {
		return err
	}
	tr, err := readTrace(path)
	if err != nil {
		return err
	}
	for _, w := range tr.Warnings {
		fmt.Fprintf(stderr, "tracer: warning: %s\n", w)
	}
	if err := rediagnose(tr); err != nil {
		return err
	}
	flt = flt.OnNode(tr.Header.Node)
	if *output == "json" {
		return emitJSON(stdout, tr, flt)
	}
	return replayUI(ctx, path, tr, *filterExpr, caps)
}

// parseReplayArgs takes the one trace FILE among the flags.
func parseReplayArgs(fs *flag.FlagSet, args []string) (string, error) {
	files, err := parseArgs(fs, args)
	if err != nil {
		return "", err
	}
	switch len(files) {
	case 0:
		return "", usagef("replay needs a trace FILE: tracer replay FILE")
	case 1:
		return files[0], nil
	default:
		return "", usagef("replay takes one trace FILE, got %d: %q", len(files), files)
	}
}

// readTrace reads the whole trace; a malformed file is bad input (exit 2)
// and the error names the file and line.
func readTrace(path string) (*trace.File, error) {
	tr, err := trace.ReadFile(path)
	var pe *trace.ParseError
	switch {
	case errors.As(err, &pe):
		return nil, usageError{fmt.Errorf("malformed trace %w", err)}
	case errors.Is(err, os.ErrNotExist):
		return nil, usagef("%w", err)
	case err != nil:
		return nil, fmt.Errorf("read trace: %w", err)
	}
	return tr, nil
}

// emitJSON re-emits the trace: its header, the flows that pass the filter,
// and a summary counting what was emitted (lost events as recorded).
func emitJSON(stdout io.Writer, tr *trace.File, flt filter.Filter) error {
	h := tr.Header
	if !flt.Empty() {
		h.Filter = flt.String()
	}
	w, err := trace.NewWriter(stdout, h)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	// Each state change goes before the first flow decided after it; a
	// reader finds a flow's state by time, wherever the line is.
	states := tr.States
	writeStates := func(until func(*trace.StateChange) bool) error {
		for len(states) > 0 && until(states[0]) {
			if err := w.WriteState(states[0]); err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			states = states[1:]
		}
		return nil
	}
	for _, f := range tr.Flows {
		if !flt.Match(f) {
			continue
		}
		if err := writeStates(func(c *trace.StateChange) bool { return !c.Time.After(f.Time) }); err != nil {
			return err
		}
		if err := w.WriteFlow(f); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
	}
	if err := writeStates(func(*trace.StateChange) bool { return true }); err != nil {
		return err
	}
	if s := tr.Summary; s != nil {
		w.SetLoss(*s)
		w.Now = func() time.Time { return s.Ended }
	}
	return w.Close()
}

// replayUI shows the trace; beyond caps the UI keeps its newest flows.
func replayUI(ctx context.Context, path string, tr *trace.File, filterExpr string, caps trace.Caps) error {
	store := trace.NewCappedStore(caps)
	for _, f := range tr.Flows {
		store.Append(f)
	}
	states := trace.NewStateLog(tr.Header.Snapshot)
	for _, c := range tr.States {
		states.Add(c, time.Time{})
	}
	src := tui.Source{Header: tr.Header, Title: "replay " + path, Store: store, States: states}
	if tr.Summary != nil {
		src.LostEvents = tr.Summary.LostEvents
	}
	err := tui.Run(ctx, src, tui.Options{Filter: filterExpr})
	if errors.Is(err, tui.ErrNotTerminal) {
		return usageError{err}
	}
	return err
}

// appendNew adds the warnings a re-read of the snapshot gives that the
// header does not already carry (a recorded trace has them from its run).
func appendNew(have []string, more ...string) []string {
	for _, w := range more {
		if !slices.Contains(have, w) {
			have = append(have, w)
		}
	}
	return have
}
