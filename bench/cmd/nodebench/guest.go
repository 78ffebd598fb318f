package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/tracer-dev/tracer/internal/loader"
)

// guestResult is what a nodebench run writes with -json: the overhead
// rounds with the BPF statistics, and how each hook attached. The VM
// driver (-vm) reads it back from each guest's results directory.
type guestResult struct {
	Kernel    string        `json:"kernel"`
	Machine   machine       `json:"machine"`
	Started   time.Time     `json:"started"`
	Ended     time.Time     `json:"ended"`
	LoadStart string        `json:"load_start"`
	LoadEnd   string        `json:"load_end"`
	Rounds    int           `json:"rounds"`
	Round     time.Duration `json:"round_ns"`
	Workers   int           `json:"workers"`
	// Only is the tiers the tracer was restricted to ("" for any).
	Only string `json:"only,omitempty"`
	// Skipped is why the kernel side was not measured ("" when it was).
	Skipped string        `json:"skipped,omitempty"`
	Plan    []hookTier    `json:"plan"`
	Attach  []attachTime  `json:"attach"`
	Results []roundResult `json:"results"`
}

// hookTier is how one hook attached: the tier and the kernel function or
// tracepoint it went through.
type hookTier struct {
	Hook    string `json:"hook"`
	Via     string `json:"via"`
	Target  string `json:"target,omitempty"`
	Program string `json:"program,omitempty"`
}

func tiersOf(plan loader.Plan) []hookTier {
	var out []hookTier
	for _, h := range plan {
		out = append(out, hookTier{Hook: h.Hook.String(), Via: h.Via.String(), Target: h.Target, Program: h.Program})
	}
	return out
}

func (r *report) guestResult() guestResult {
	return guestResult{Kernel: r.machine.Kernel, Machine: r.machine, Started: r.started, Ended: r.ended,
		LoadStart: r.loadStart, LoadEnd: r.loadEnd, Rounds: r.cfg.rounds, Round: r.cfg.round, Workers: r.cfg.workers, Only: tierList(r.cfg.only),
		Skipped: r.skippedKernel, Plan: tiersOf(r.plan), Attach: r.attach, Results: r.rounds}
}

func writeGuestResult(path string, g guestResult) error {
	b, err := json.MarshalIndent(g, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

func readGuestResult(path string) (guestResult, error) {
	var g guestResult
	b, err := os.ReadFile(path)
	if err != nil {
		return g, fmt.Errorf("read results: %w", err)
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return g, fmt.Errorf("decode results %s: %w", path, err)
	}
	return g, nil
}

// asReport is the guest's figures as a report, so the host's summaries
// (variants, programCost) compute the same figures from them.
func (g guestResult) asReport() *report {
	return &report{cfg: config{rounds: g.Rounds, round: g.Round, workers: g.Workers}, machine: g.Machine,
		started: g.Started, ended: g.Ended, rounds: g.Results, attach: g.Attach}
}
