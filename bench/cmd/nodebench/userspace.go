package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/trace"
)

// childResult is what a child process measured, as one JSON line.
type childResult struct {
	Kind      string  `json:"kind"`
	N         int     `json:"n,omitempty"`
	RSS       uint64  `json:"rss"`
	HeapInuse uint64  `json:"heap_inuse"`
	BaseRSS   uint64  `json:"base_rss"`
	BaseHeap  uint64  `json:"base_heap"`
	Events    int     `json:"events,omitempty"`
	Flows     int     `json:"flows,omitempty"`
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"rate,omitempty"`
	// Samples are a feed's store over its clock.
	Samples []feedSample `json:"samples,omitempty"`
}

// runChild measures in this process (a fresh one, so RSS is its own) and
// prints the result.
func runChild(spec string) error {
	var r childResult
	var err error
	switch {
	case spec == "throughput":
		r, err = throughput(5*time.Second, 50_000_000)
	case strings.HasPrefix(spec, "feed:"):
		fs, perr := parseFeed(strings.TrimPrefix(spec, "feed:"))
		if perr != nil {
			return perr
		}
		r, err = feed(fs)
	case strings.HasPrefix(spec, "mem:"):
		parts := strings.Split(spec, ":")
		if len(parts) != 3 {
			return fmt.Errorf("bad child spec %q", spec)
		}
		n, perr := strconv.Atoi(parts[2])
		if perr != nil {
			return fmt.Errorf("bad child spec %q: %w", spec, perr)
		}
		r, err = memory(parts[1], n)
	default:
		return fmt.Errorf("unknown child %q", spec)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

// child runs this binary as a child measuring spec.
func child(spec string, env ...string) (childResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return childResult{}, fmt.Errorf("find own binary: %w", err)
	}
	cmd := exec.Command(exe, "-child", spec)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return childResult{}, fmt.Errorf("child %s: %w", spec, err)
	}
	var r childResult
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("child %s output %q: %w", spec, out, err)
	}
	return r, nil
}

// throughputGap is how far apart the events of the throughput run are in
// their own clock: 100,000 events/s, as BenchmarkPipeline.
const throughputGap = 10 * time.Microsecond

// throughput runs the generated mix through decode -> join -> enrich and
// diagnose -> encode on one core until d has passed or max events.
func throughput(d time.Duration, max int) (childResult, error) {
	runtime.GOMAXPROCS(1)
	env, err := mix.Env()
	if err != nil {
		return childResult{}, err
	}
	replay := mix.NewReplay(mix.Records(200_000, throughputGap), throughputGap)
	p, err := mix.NewPipeline(io.Discard, env)
	if err != nil {
		return childResult{}, err
	}
	start := time.Now()
	for n := 0; n < max; n++ {
		if n%4096 == 0 && time.Since(start) > d {
			break
		}
		p.Feed(replay.Next())
	}
	el := time.Since(start)
	if p.Errors > 0 {
		return childResult{}, fmt.Errorf("pipeline: %d errors", p.Errors)
	}
	return childResult{Kind: "throughput", Events: p.Events, Flows: p.Flows, Seconds: el.Seconds(),
		Rate: float64(p.Events) / el.Seconds()}, nil
}

// memory holds n flows: open in the joiner ("joiner"), finished in a
// trace.Store ("store"), or n of each ("both"), and reads the resident
// set once the garbage is collected.
func memory(kind string, n int) (childResult, error) {
	src, err := newMixSource()
	if err != nil {
		return childResult{}, err
	}
	baseRSS, baseHeap := measure()
	start := time.Now()
	t0 := mix.Clock.BootWall
	var j *join.Joiner
	var store *trace.Store
	if kind == "joiner" || kind == "both" {
		j = &join.Joiner{Linger: time.Hour, Names: mix.Names{}}
		for i := range n {
			at := t0.Add(time.Duration(i) * time.Microsecond)
			for _, e := range mix.Generate(i) {
				e.Time = at
				j.Add(e, at)
			}
		}
		if j.Open() != n {
			return childResult{}, fmt.Errorf("joiner holds %d flows, want %d", j.Open(), n)
		}
	}
	if kind == "store" || kind == "both" {
		store = trace.NewStore()
		for i := 0; store.Len() < n; i++ {
			fs, err := src.flows(i, t0.Add(time.Duration(i)*time.Microsecond))
			if err != nil {
				return childResult{}, err
			}
			for _, f := range fs[:min(len(fs), n-store.Len())] {
				store.Append(f)
			}
		}
		if store.Len() != n {
			return childResult{}, fmt.Errorf("store holds %d flows, want %d", store.Len(), n)
		}
	}
	el := time.Since(start)
	rss, heap := measure()
	if path := os.Getenv("NODEBENCH_HEAPPROFILE"); path != "" {
		if err := writeHeapProfile(path); err != nil {
			return childResult{}, err
		}
	}
	runtime.KeepAlive(j)
	runtime.KeepAlive(store)
	return childResult{Kind: kind, N: n, RSS: rss, HeapInuse: heap, BaseRSS: baseRSS, BaseHeap: baseHeap, Seconds: el.Seconds()}, nil
}

// mixSource makes the generated mix's flows as the live pipeline makes
// them: joined and diagnosed against the mix's node one by one, so each
// has its own tuples, events, pods and explanation (about 460 bytes), and
// shares what the pipeline shares (its rule, its names).
type mixSource struct {
	j   *enrich.Stages
	out []*trace.Flow
}

func newMixSource() (*mixSource, error) {
	env, err := mix.Env()
	if err != nil {
		return nil, err
	}
	s := &mixSource{}
	s.j = enrich.NewStages(&join.Joiner{Names: mix.Names{}}, &enrich.Enricher{Env: func(time.Time) enrich.Env { return env },
		Emit: func(f *trace.Flow) { s.out = append(s.out, f) }})
	return s, nil
}

// flows are the flows the mix's connection i makes at at (one, for each
// of its shapes).
func (s *mixSource) flows(i int, at time.Time) ([]*trace.Flow, error) {
	s.out = s.out[:0]
	for _, e := range mix.Generate(i) {
		e.Time = at
		s.j.Add(e, at)
	}
	s.j.Flush()
	if len(s.out) == 0 {
		return nil, fmt.Errorf("connection %d of the mix made no flow", i)
	}
	return s.out, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("heap profile: %w", err)
	}
	return f.Close()
}

// measure collects garbage, returns freed memory to the kernel, and reads
// VmRSS and HeapInuse.
func measure() (rss, heapInuse uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return live.ReadSelfUsage().RSS, ms.HeapInuse
}

// goBench is one line of `go test -bench` output.
type goBench struct {
	Name    string
	NsOp    float64
	Metric  float64 // the first custom rate (events/s, flows/s), else the first custom metric
	Unit    string
	BytesOp float64
	Allocs  float64
	// Extra is every custom metric by unit.
	Extra map[string]float64
}

// goBenchmarks runs the per-stage Go benchmarks on one core, then the
// live pipeline's stages as Run wires them (BenchmarkStages) on one core
// and on two (BenchmarkStages-2).
func goBenchmarks(benchtime string) ([]goBench, string, error) {
	runs := [][]string{
		{"test", "-run", "^$", "-bench", ".", "-benchtime", benchtime, "-count", "1",
			"./internal/event", "./internal/join", "./internal/enrich", "./internal/trace", "./bench/mix"},
		{"test", "-run", "^$", "-bench", "^BenchmarkStages$", "-benchtime", benchtime, "-count", "1", "-cpu", "1,2", "./internal/live"},
	}
	var res []goBench
	var cmdlines []string
	for _, args := range runs {
		cmdlines = append(cmdlines, "GOMAXPROCS=1 go "+shellWords(args))
		r, err := runGoBench(args)
		if err != nil {
			return nil, "", err
		}
		res = append(res, r...)
	}
	return res, strings.Join(cmdlines, "; "), nil
}

// shellWords is args as a shell reads them back: the patterns quoted.
func shellWords(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, "^$") {
			a = "'" + a + "'"
		}
		quoted[i] = a
	}
	return strings.Join(quoted, " ")
}

// runGoBench runs `go test -bench` on one core and reads its lines.
func runGoBench(args []string) ([]goBench, error) {
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go test -bench: %w: %s", err, out)
	}
	return parseGoBench(string(out)), nil
}

// parseGoBench reads the benchmark lines of `go test -bench` output.
func parseGoBench(out string) []goBench {
	var res []goBench
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		b := goBench{Name: strings.TrimSuffix(f[0], "-1"), Extra: map[string]float64{}}
		rate := false
		for k := 2; k+1 < len(f); k += 2 {
			v, _ := strconv.ParseFloat(f[k], 64)
			switch u := f[k+1]; u {
			case "ns/op":
				b.NsOp = v
			case "B/op":
				b.BytesOp = v
			case "allocs/op":
				b.Allocs = v
			default:
				if isRate := strings.HasSuffix(u, "/s"); b.Unit == "" || isRate && !rate {
					b.Metric, b.Unit, rate = v, u, isRate
				}
				b.Extra[u] = v
			}
		}
		res = append(res, b)
	}
	return res
}
