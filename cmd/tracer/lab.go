package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/lab"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/meta"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/internal/tui"
)

func init() {
	commands["lab"] = command{
		summary: "build the incident lab in throwaway network namespaces, make its traffic, and trace it",
		run:     runLab,
	}
}

// labResult is the "lab" record closing each scenario's trace: every
// attempt with what the lab proved and what the tracer reported, and the
// flows no attempt accounts for.
type labResult struct {
	Type     string `json:"type"` // "lab"
	Scenario string `json:"scenario"`
	Mode     string `json:"mode,omitempty"`
	Skipped  string `json:"skipped,omitempty"`
	lab.Report
	// Predictions are what `tracer explain` said of each attempt, and
	// Audit what `tracer audit` found on the node, from its state at
	// attach time, before any traffic.
	Predictions []labPrediction `json:"predictions,omitempty"`
	Audit       *labAudit       `json:"audit,omitempty"`
	// Phases is how long each step of the run took, in milliseconds: the
	// lab's cost is build, attach and traffic, not the tracer's.
	Phases *labPhases `json:"phases,omitempty"`
}

type labPhases struct {
	BuildMS   int64 `json:"build_ms"`
	AttachMS  int64 `json:"attach_ms"`
	TrafficMS int64 `json:"traffic_ms"`
	SettleMS  int64 `json:"settle_ms"`
}

type labOptions struct {
	output string
	list   bool
	record string
	linger time.Duration
	caps   trace.Caps
}

func runLab(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o labOptions
	fs := newFlagSet("lab", stderr)
	fs.StringVar(&o.output, "o", "ui", "output: ui (watch the lab in the terminal UI) or json (NDJSON: each scenario's trace and a lab record of what was checked)")
	fs.BoolVar(&o.list, "list", false, "list the scenarios")
	fs.StringVar(&o.record, "record", "", "also write the flows of every scenario as one trace to `FILE`")
	fs.DurationVar(&o.linger, "linger", join.DefaultLinger, "how long a flow waits for more of its events")
	var sc storeCaps
	sc.register(fs)
	names, err := parseLabArgs(fs, args)
	if err != nil {
		return err
	}
	if o.caps, err = sc.caps(); err != nil {
		return err
	}
	if o.list {
		return listScenarios(stdout)
	}
	if o.output != "ui" && o.output != "json" {
		return usagef("-o %q: want ui or json", o.output)
	}
	if o.linger < 0 {
		return usagef("--linger %s: must not be negative", o.linger)
	}
	if err := probeRecord(o.record); err != nil {
		return err
	}
	scenarios, err := pickScenarios(names)
	if err != nil {
		return err
	}
	if o.output == "ui" {
		if err := requireTerminal(); err != nil {
			return err
		}
	}
	if err := preflight(labNeeds); err != nil {
		return err
	}
	// A crashed run leaves namespaces behind: remove them first.
	if err := lab.Cleanup(); err != nil {
		return fmt.Errorf("remove an earlier lab: %w", err)
	}
	env, err := lab.NewEnv()
	if err != nil {
		return err
	}
	if o.output == "json" {
		return labJSON(ctx, env, scenarios, o, stdout, stderr)
	}
	return labUI(ctx, env, scenarios, o, stderr)
}

// labNeeds: the lab builds its nodes and pods as network namespaces.
var labNeeds = loader.Needs{
	SysAdmin:    "the lab creates network namespaces and mounts them",
	SysAdminFix: "run tracer lab as root",
}

func parseLabArgs(fs interface {
	Parse([]string) error
	Args() []string
}, args []string) ([]string, error) {
	var names []string
	for {
		if err := fs.Parse(args); err != nil {
			if strings.Contains(err.Error(), "help requested") {
				return nil, errHelp
			}
			return nil, usageError{err}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return names, nil
		}
		names, args = append(names, rest[0]), rest[1:]
	}
}

func listScenarios(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tSHOWS")
	for _, s := range lab.Scenarios() {
		shows := s.Title
		if s.NeedsIPVS {
			shows += " (needs IPVS)"
		}
		fmt.Fprintf(tw, "%s\t%s\n", s.Name, shows)
	}
	return tw.Flush()
}

func pickScenarios(names []string) ([]lab.Scenario, error) {
	if len(names) == 0 {
		return lab.Scenarios(), nil
	}
	var out []lab.Scenario
	for _, n := range names {
		s, ok := lab.Lookup(n)
		if !ok {
			return nil, usagef("no scenario %q: `tracer lab --list` lists them", n)
		}
		out = append(out, s)
	}
	return out, nil
}

// labRun is one scenario built, traced and checked.
type labRun struct {
	header  trace.Header
	flows   []*trace.Flow
	summary trace.Summary
	result  labResult
}

// runScenario builds a scenario, traces its namespaces while its traffic
// runs, waits for the last flows to be diagnosed, and checks them against
// what the scenario expects. emit sees each flow as it is diagnosed; st,
// when not nil, counts the pipeline's events and losses for the UI.
func runScenario(ctx context.Context, env *lab.Env, sc lab.Scenario, o labOptions, emit func(*trace.Flow), st *labStatus) (*labRun, error) {
	run := &labRun{result: labResult{Type: "lab", Scenario: sc.Name}}
	phases := &labPhases{}
	mark := time.Now()
	lap := func(d *int64) {
		now := time.Now()
		*d, mark = now.Sub(mark).Milliseconds(), now
	}
	built, err := sc.Build(ctx, env)
	if errors.Is(err, lab.ErrNeedsIPVS) || errors.Is(err, lab.ErrNeedsBridgeNetfilter) {
		run.result.Skipped = err.Error()
		run.result.OK = true
		return run, nil
	}
	if err != nil {
		return nil, fmt.Errorf("build scenario %s: %w", sc.Name, err)
	}
	defer built.Close()
	run.result.Mode = built.Mode
	lap(&phases.BuildMS)
	cfg, err := labConfig(built, o)
	if err != nil {
		return nil, err
	}
	p, err := live.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if st != nil {
		st.tracing(p)
		defer st.traced(p)
	}
	run.header = p.Header()
	run.result.Predictions, run.result.Audit = predictLab(run.header, built.Planned)
	lap(&phases.AttachMS)

	tctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		run.summary, runErr = p.Run(tctx, live.Sink{Flow: func(f *trace.Flow) {
			reported := []*trace.Flow{f}
			if brokenTracer != nil {
				reported = brokenTracer(f)
			}
			for _, f := range reported {
				run.flows = append(run.flows, f)
				if emit != nil {
					emit(f)
				}
			}
		}})
	}()
	exps, trafficErr := built.Traffic(ctx)
	lap(&phases.TrafficMS)
	// Unreplied connections are only known to be unreplied once their
	// linger has passed: wait it out, plus a margin for late events.
	select {
	case <-time.After(o.linger + 1500*time.Millisecond):
	case <-ctx.Done():
	}
	stop()
	wg.Wait()
	lap(&phases.SettleMS)
	run.result.Phases = phases
	if err := errors.Join(trafficErr, runErr); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	run.result.Report = lab.Check(exps, run.flows, p.Plan().DropReasons())
	return run, nil
}

// brokenTracer stands for a tracer with a bug, set only by tests: the lab's
// checks must catch what it reports in place of each flow.
var brokenTracer func(*trace.Flow) []*trace.Flow

// labConfig observes the scenario's node and the other namespaces it names
// (a client's, for the return path), with its pods and Services as
// metadata.
func labConfig(b *lab.Built, o labOptions) (live.Config, error) {
	cfg := live.Config{NetnsPath: b.Node.Path(), NodeName: b.NodeName, Linger: o.linger, Command: "lab"}
	for _, ns := range b.Observe {
		ino, err := ns.Inode()
		if err != nil {
			return cfg, err
		}
		cfg.Loader.Netns = append(cfg.Loader.Netns, ino)
		cfg.Loader.NetnsPaths = append(cfg.Loader.NetnsPaths, ns.Path())
		if ns.Path() != b.Node.Path() {
			cfg.PeerNetns = append(cfg.PeerNetns, ns.Path())
		}
	}
	idx, err := meta.LoadJSON(b.MetadataJSON, "of the lab")
	if err != nil {
		return cfg, fmt.Errorf("lab metadata: %w", err)
	}
	cfg.Metadata = enrich.NewIndexMetadata(idx)
	cfg.MetadataSnapshot, cfg.MetadataOnChange = idx.Snapshot, idx.OnChange
	return cfg, nil
}

// labJSON runs each scenario and writes its trace (header, flows, summary)
// and its lab record. It fails when any expectation was not met.
func labJSON(ctx context.Context, env *lab.Env, scs []lab.Scenario, o labOptions, stdout, stderr io.Writer) error {
	enc := json.NewEncoder(stdout)
	rec := &labRecorder{path: o.record}
	failed := 0
	for _, sc := range scs {
		run, err := runScenario(ctx, env, sc, o, nil, nil)
		if err != nil {
			return errors.Join(err, rec.close())
		}
		if err := rec.add(run); err != nil {
			return errors.Join(err, rec.close())
		}
		if run.result.Skipped == "" {
			if err := writeTrace(stdout, run); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(stderr, "tracer: lab %s skipped: %s\n", sc.Name, run.result.Skipped)
		}
		if err := enc.Encode(run.result); err != nil {
			return err
		}
		if !run.result.OK {
			failed++
		}
		if ctx.Err() != nil {
			return errors.Join(ctx.Err(), rec.close())
		}
	}
	if err := rec.close(); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("lab: %d scenario(s) did not show what they should", failed)
	}
	return nil
}

func writeTrace(w io.Writer, run *labRun) error {
	tw, err := trace.NewWriter(w, run.header)
	if err != nil {
		return err
	}
	for _, f := range run.flows {
		if err := tw.WriteFlow(f); err != nil {
			return err
		}
	}
	tw.SetLoss(run.summary)
	return tw.Close()
}

// labUI runs the scenarios one after another into one UI, which stays
// open until the user quits; `make demo` runs this. The title shows the
// checks' results so far; a failed check or record file is also returned.
func labUI(ctx context.Context, env *lab.Env, scs []lab.Scenario, o labOptions, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	store := trace.NewCappedStore(o.caps)
	hdr := trace.Header{Type: trace.TypeHeader, Schema: trace.Schema, Node: "lab", Kernel: live.KernelRelease(), Started: time.Now().UTC(), Command: "lab"}
	// The scenarios attach one after another; the header shows the plan
	// every one of them gets.
	if t, err := loader.Open(loader.Config{}); err == nil {
		hdr.Hooks = live.HookRecords(t.Plan)
		t.Close()
	}
	st := &labStatus{total: len(scs)}
	done := make(chan struct{})
	var labErr error // read once done is closed
	go func() {
		defer close(done)
		labErr = runLabScenarios(ctx, env, scs, o, store, st)
	}()
	src := tui.Source{Header: hdr, Title: "lab " + scenarioNames(scs), Store: store, Live: true, Status: st.line, Stats: headerStats(st.counters)}
	uiErr := tui.Run(ctx, src, tui.Options{})
	cancel()
	<-done
	if errors.Is(uiErr, tui.ErrNotTerminal) {
		uiErr = usageError{uiErr}
	}
	return errors.Join(uiErr, labErr)
}

// runLabScenarios runs scs into store, counting their checks in st and
// recording their flows to o.record. A recording that fails stops; the
// scenarios go on, and the title says why.
func runLabScenarios(ctx context.Context, env *lab.Env, scs []lab.Scenario, o labOptions, store *trace.Store, st *labStatus) error {
	rec := &labRecorder{path: o.record}
	var errs []error
	var failed []string
	for _, sc := range scs {
		st.start(sc.Name)
		run, err := runScenario(ctx, env, sc, o, func(f *trace.Flow) { store.Append(f) }, st)
		if errors.Is(err, context.Canceled) || ctx.Err() != nil {
			break
		}
		outcome := labFailed
		if err == nil {
			outcome = outcomeOf(run.result)
		}
		st.finish(sc.Name, outcome)
		if outcome == labFailed {
			failed = append(failed, sc.Name)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := rec.add(run); err != nil {
			st.recordFailed(err)
			errs = append(errs, err)
		}
	}
	if err := rec.close(); err != nil {
		st.recordFailed(err)
		errs = append(errs, err)
	}
	if len(failed) > 0 {
		errs = append(errs, fmt.Errorf("lab: %d scenario(s) did not show what they should: %s", len(failed), strings.Join(failed, ", ")))
	}
	return errors.Join(errs...)
}

// probeRecord fails early, as bad usage, when no file can be created
// beside path; it leaves a file already at path alone until the first
// scenario's header is there to start the real one.
func probeRecord(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".probe*")
	if err != nil {
		return usagef("--record %s: %v", path, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// labRecorder writes the flows of every scenario into one trace; its
// header is the first scenario's. After an error it records nothing more.
type labRecorder struct {
	path   string
	w      *trace.Writer
	failed bool
}

func (r *labRecorder) add(run *labRun) error {
	if r.path == "" || r.failed || run.result.Skipped != "" {
		return nil
	}
	if r.w == nil {
		w, err := trace.Create(r.path, run.header)
		if err != nil {
			r.failed = true
			return fmt.Errorf("record %s: %w", r.path, err)
		}
		r.w = w
	}
	for _, f := range run.flows {
		if err := r.w.WriteFlow(f); err != nil {
			r.failed = true
			return fmt.Errorf("record %s: %w", r.path, errors.Join(err, r.w.Close()))
		}
	}
	return nil
}

func (r *labRecorder) close() error {
	if r.w == nil || r.failed {
		return nil
	}
	if err := r.w.Close(); err != nil {
		r.failed = true
		return fmt.Errorf("record %s: %w", r.path, err)
	}
	return nil
}

type labOutcome int

const (
	labPassed labOutcome = iota
	labFailed
	labSkipped
)

func outcomeOf(r labResult) labOutcome {
	switch {
	case r.Skipped != "":
		return labSkipped
	case r.OK:
		return labPassed
	}
	return labFailed
}

// labStatus is what the UI's title says of the lab's checks.
type labStatus struct {
	mu                     sync.Mutex
	total, passed, skipped int
	failed                 []string
	running, recordErr     string
	// ended are the counters of the scenarios' pipelines that have ended,
	// summed; current is the one tracing now (nil between scenarios).
	ended   live.Stats
	current counted
}

// counted is what counts a pipeline's events and losses: a live.Pipeline.
type counted interface{ Stats() live.Stats }

func (s *labStatus) tracing(p counted) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = p
}

// traced adds an ended pipeline's counters to the lab's; its tracer is
// still open, so they are its last.
func (s *labStatus) traced(p counted) {
	last := p.Stats()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = addCounters(s.ended, last)
	s.current = nil
}

// counters are the lab's pipelines' counters so far, the one tracing now
// included: what the header shows.
func (s *labStatus) counters() live.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		return s.ended
	}
	return addCounters(s.ended, s.current.Stats())
}

// addCounters sums the counters the header shows.
func addCounters(a, b live.Stats) live.Stats {
	a.Events += b.Events
	a.Lost += b.Lost
	a.ConntrackOverruns += b.ConntrackOverruns
	a.ConntrackEndsEvicted += b.ConntrackEndsEvicted
	a.ConntrackDrops += b.ConntrackDrops
	return a
}

func (s *labStatus) start(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running = name
}

func (s *labStatus) finish(name string, o labOutcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running = ""
	switch o {
	case labPassed:
		s.passed++
	case labSkipped:
		s.skipped++
	default:
		s.failed = append(s.failed, name)
	}
}

func (s *labStatus) recordFailed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recordErr = err.Error()
}

// line is the title's status: "lab 5/8: 4 passed, 1 failed (x) · running y".
func (s *labStatus) line() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	done := s.passed + s.skipped + len(s.failed)
	text := fmt.Sprintf("lab %d/%d: %d passed", done, s.total, s.passed)
	if len(s.failed) > 0 {
		text += fmt.Sprintf(", %d FAILED (%s)", len(s.failed), strings.Join(s.failed, ", "))
	}
	if s.skipped > 0 {
		text += fmt.Sprintf(", %d skipped", s.skipped)
	}
	if s.running != "" {
		text += " · running " + s.running
	}
	if s.recordErr != "" {
		text += " · " + s.recordErr
	}
	return text, len(s.failed) > 0 || s.recordErr != ""
}

func scenarioNames(scs []lab.Scenario) string {
	var n []string
	for _, s := range scs {
		n = append(n, s.Name)
	}
	return strings.Join(n, ", ")
}
