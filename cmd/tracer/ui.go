package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/meta"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/internal/tui"
)

func init() {
	commands["ui"] = command{
		summary: "live terminal UI on this node (the default command)",
		run:     runUI,
	}
}

func runUI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o traceOptions
	var sc storeCaps
	fs := newFlagSet("ui", stderr)
	o.register(fs)
	sc.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	caps, err := sc.caps()
	if err != nil {
		return err
	}
	// client-go logs watch errors to stderr, which would tear the screen;
	// the UI shows the metadata warnings instead.
	meta.SilenceClientLogs()
	p, _, err := o.start(ctx, "ui", stderr, requireTerminal)
	if err != nil {
		return err
	}
	defer p.Close()
	return showLive(ctx, p, o, caps, "live", stderr)
}

// requireTerminal: the UI needs a terminal; pipes and files get a pointer
// to the command that streams instead.
func requireTerminal() error {
	if !term.IsTerminal(int(os.Stdout.Fd())) || !term.IsTerminal(int(os.Stdin.Fd())) {
		return usageError{tui.ErrNotTerminal} // it says to use `tracer trace`
	}
	return nil
}

// showLive runs the pipeline into the UI's store until the user quits,
// the context ends or --duration passes; --record gets the whole trace.
func showLive(ctx context.Context, p *live.Pipeline, o traceOptions, caps trace.Caps, title string, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.duration > 0 {
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	var rec *trace.Writer
	if o.record != "" {
		var err error
		if rec, err = trace.Create(o.record, p.Header()); err != nil {
			return usagef("--record %s: %v", o.record, err)
		}
		rec.Batch()
	}
	if o.readyFile != "" {
		if err := os.WriteFile(o.readyFile, []byte("ready\n"), 0o644); err != nil {
			return fmt.Errorf("write ready file: %w", err)
		}
	}
	store := trace.NewCappedStore(caps)
	var wg sync.WaitGroup
	var sum trace.Summary
	var runErr, recErr, stateErr error
	header := p.Header()
	states := trace.NewStateLog(header.Snapshot)
	p.RecordStates(func(c *trace.StateChange) {
		states.Add(c, keepStatesFrom(store))
		if rec != nil && stateErr == nil {
			stateErr = rec.WriteState(c)
		}
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		sum, runErr = p.Run(ctx, live.Sink{Flow: func(f *trace.Flow) {
			store.Append(f)
			if rec != nil && recErr == nil {
				recErr = rec.WriteFlow(f)
			}
		}, Flush: func() {
			if rec != nil && recErr == nil {
				recErr = rec.Flush()
			}
		}})
	}()
	src := tui.Source{Header: header, Title: title, Store: store, States: states, Live: true, Stats: headerStats(p.Stats)}
	uiErr := tui.Run(ctx, src, tui.Options{Filter: o.filter})
	cancel()
	wg.Wait()
	p.RecordStates(nil)
	if rec != nil {
		rec.SetLoss(sum)
		recErr = errors.Join(recErr, stateErr, rec.Close())
	}
	if errors.Is(uiErr, tui.ErrNotTerminal) {
		uiErr = usageError{uiErr}
	}
	return errors.Join(uiErr, runErr, recErr)
}

// keepStatesFrom is from when the UI may still export flows: the oldest it
// holds, less the slack of flows written when their linger ends, not in
// the order they began.
func keepStatesFrom(store *trace.Store) time.Time {
	oldest, ok := store.Oldest()
	if !ok {
		return time.Now().Add(-time.Minute)
	}
	return oldest.Add(-time.Minute)
}

// headerStats turns counters, read on every draw, into the header's
// figures: events per second and the process's share of a CPU, each over
// the last second or more, and its resident size.
func headerStats(counters func() live.Stats) func() tui.Stats {
	var mu sync.Mutex
	last, self, lastAt := uint64(0), live.ReadSelfUsage(), time.Now()
	rate, cpu := 0.0, 0.0
	return func() tui.Stats {
		s := counters()
		mu.Lock()
		defer mu.Unlock()
		// The header is drawn many times a second; the process's usage
		// is read once a window.
		if dt := time.Since(lastAt); dt >= time.Second {
			now := live.ReadSelfUsage()
			rate = float64(s.Events-last) / dt.Seconds()
			cpu = float64(now.CPU-self.CPU) / float64(dt)
			last, self, lastAt = s.Events, now, time.Now()
		}
		return tui.Stats{EventsPerSec: rate, LostEvents: s.Lost, ConntrackOverruns: s.ConntrackOverruns, ConntrackEndsEvicted: s.ConntrackEndsEvicted,
			ConntrackDrops: s.ConntrackDrops, TracerCPU: cpu, TracerRSS: self.RSS}
	}
}
