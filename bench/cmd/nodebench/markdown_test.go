package main

import (
	"strings"
	"testing"
	"time"
)

// fakeReport is a run's figures made up for the test: every observer for
// two rounds, BPF statistics, a ramp, stages and memory.
func fakeReport(wholeRate float64) *report {
	r := &report{cfg: config{rounds: 2, round: 5 * time.Second, workers: 8, rampStep: 5 * time.Second, userside: true, kernel: true},
		started: time.Unix(0, 0), ended: time.Unix(300, 0), loadStart: "1.00 1.00 1.00", loadEnd: "2.00 2.00 2.00"}
	perConnCPU := map[string]time.Duration{"none": 100, kernelName: 120, statsName: 125, ctName: 190, "tracer (full live pipeline)": 220,
		"conntrack -E -e NEW": 110, "nft monitor trace": 180}
	rate := map[string]uint64{"none": 40000, kernelName: 35000, statsName: 34000, ctName: 24000, "tracer (full live pipeline)": 20000,
		"conntrack -E -e NEW": 38000, "nft monitor trace": 32000}
	for round := 1; round <= 2; round++ {
		for _, name := range []string{"none", kernelName, statsName, ctName, "tracer (full live pipeline)", "conntrack -E -e NEW", "nft monitor trace"} {
			ok := rate[name] + uint64(round)*100
			x := roundResult{Round: round, Variant: name, Load: load{OK: ok, Elapsed: 5 * time.Second},
				Obs: observed{NAT: int64(ok), Lost: 0, Events: int64(ok)}, CPU: time.Duration(ok) * perConnCPU[name] * time.Microsecond,
				Machine: machineCPU{Busy: 990, Total: 1000}}
			if name == "none" || strings.HasPrefix(name, "conntrack") || strings.HasPrefix(name, "nft") {
				x.Obs = observed{NAT: -1, Lost: -1, Events: -1}
			}
			if name == statsName {
				x.Obs.Programs = []programRun{
					{Program: "tr_nf_dnat", Via: "netfilter", Hooks: "nf_nat_setup_info", Runs: 8 * ok, RunTime: time.Duration(8*ok) * 380},
					{Program: "tr_drop_tp3", Via: "tracepoint", Hooks: "kfree_skb", Runs: ok, RunTime: time.Duration(ok) * 600},
				}
			}
			r.rounds = append(r.rounds, x)
		}
	}
	r.ramp = []rampStep{{Workers: 1, Load: load{OK: 20000, Elapsed: 5 * time.Second}, Tracer: observed{NAT: 20000}, CT: observed{NAT: 19900}}}
	r.attach = []attachTime{{90 * time.Millisecond, time.Millisecond}}
	r.throughput = childResult{Kind: "throughput", Events: int(wholeRate * 5), Flows: int(wholeRate * 5 * 0.7), Seconds: 5, Rate: wholeRate}
	r.stages = []goBench{{Name: "BenchmarkDecode", NsOp: 100}, {Name: "BenchmarkRecord", NsOp: 500}, {Name: "BenchmarkJoin", NsOp: 3000},
		{Name: "BenchmarkEnrich", NsOp: 10000}, {Name: "BenchmarkEncode", NsOp: 3000},
		{Name: "BenchmarkPipeline", NsOp: 14000, Extra: map[string]float64{"flows/event": 0.7}}}
	r.memory = []childResult{{Kind: "joiner", N: 100000, RSS: 200 << 20, HeapInuse: 190 << 20}, {Kind: "joiner", N: 1000000, RSS: 2000 << 20, HeapInuse: 1980 << 20}}
	return r
}

// The report is made from the figures alone: no formatting error, no NaN,
// and the wording follows the comparison of the figures.
func TestMarkdownFromFigures(t *testing.T) {
	for _, c := range []struct {
		rate float64
		want string
	}{
		{100000, "less than that sum, so the sum is not a bound on it"}, // 10000 ns per event, below the 13600 ns sum
		{50000, "more than that sum"},                                   // 20000 ns per event
	} {
		md := fakeReport(c.rate).markdown()
		for _, bad := range []string{"%!", "NaN", "attached, not read", "recorded mix"} {
			if strings.Contains(md, bad) {
				t.Errorf("rate %.0f: report contains %q", c.rate, bad)
			}
		}
		for _, want := range []string{c.want, "the tracer's programs ran 3.64 µs per connection", "conntrack -E first missed connections at 4000 conn/s (1 worker)",
			"the tracker alone, without lookups, adds 70 µs per connection to the kernel side + drain", "the rest of the pipeline, its lookups included, 30 µs"} {
			if !strings.Contains(md, want) {
				t.Errorf("rate %.0f: report lacks %q", c.rate, want)
			}
		}
	}
}

// A new report shows the previous report's target figures beside its own,
// read from the previous BENCHMARKS.md, and a target the old one lacked
// says so.
func TestMarkdownKeepsPreviousFigures(t *testing.T) {
	old := fakeReport(50000)
	old.started = time.Date(2026, 11, 30, 13, 58, 0, 0, time.UTC)
	old.speedStart, old.speedEnd = 150*time.Millisecond, 152*time.Millisecond
	oldMD := old.markdown()
	prev := readPrevious(oldMD)
	if prev.When == "" || len(prev.Results) == 0 || prev.Speed != "150ms at the start, 152ms at the end" {
		t.Fatalf("nothing read from the previous report: %+v", prev)
	}
	r := fakeReport(100000)
	r.speedStart, r.speedEnd = 260*time.Millisecond, 262*time.Millisecond
	r.previous = prev
	r.previous.Results["userspace throughput, one core"] = "missed: 7.4% of the target (14x short): 73948 events/s"
	delete(r.previous.Results, "attach + detach")
	md := r.markdown()
	for _, want := range []string{"previous run's (" + prev.When + ")", "| missed: 7.4% of the target (14x short): 73948 events/s |", "| not measured |",
		"its machine's " + speedRow + " was 150ms at the start, 152ms at the end, this one's 260ms at the start, 262ms at the end"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if got := readPrevious(md); len(got.Results) != len(r.targets()) || got.Results["attach + detach"] == "" {
		t.Errorf("a report with a previous column reads back %d targets %v, want its %d", len(got.Results), got.Results, len(r.targets()))
	}
}

// The feed's table and its comparison come from its samples: the heap
// range is taken over the samples once the store evicts, and a heap that
// grows by more than 10% misses the target.
func TestFeedMarkdown(t *testing.T) {
	r := fakeReport(100000)
	r.feed = childResult{Kind: "feed", N: 18_000_000, Rate: 5000, Seconds: 200, BaseHeap: 2 << 20, BaseRSS: 20 << 20, Samples: []feedSample{
		{Minute: 1, Seen: 300_000, Retained: 200_000, Evicted: 100_000, Estimate: 150 << 20, HeapInuse: 160 << 20, RSS: 180 << 20},
		{Minute: 5, Seen: 1_500_000, Retained: 200_000, Evicted: 1_300_000, Estimate: 150 << 20, HeapInuse: 170 << 20, RSS: 190 << 20},
		{Minute: 60, Seen: 18_000_000, Retained: 200_000, Evicted: 17_800_000, Estimate: 150 << 20, HeapInuse: 168 << 20, RSS: 185 << 20},
	}}
	md := r.markdown()
	for _, want := range []string{"### The UI's store under a 60-minute feed", "| 5 | 1500000 | 200000 | 1300000 | 150.0 MiB | 170.0 MiB | 190.0 MiB | 1.12 |",
		"HeapInuse stays between 160.0 MiB (minute 1) and 170.0 MiB (minute 5), the highest +6.3% over the lowest", "| UI store under a long feed | flat: HeapInuse within 10% once full | 160.0 to 170.0 MiB over 3 samples | met |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	r.feed.Samples[2].HeapInuse = 200 << 20
	if md := r.markdown(); !strings.Contains(md, "missed: the highest +25.0% over the lowest") {
		t.Error("a heap 25% up does not miss the target")
	}
}

// The ramp goes on past its listed steps while nothing is lost and the
// rate still rises, and stops at the first loss or at the machine's limit.
func TestRampExtends(t *testing.T) {
	step := func(w int, rate float64, lost int64) rampStep {
		ok := uint64(rate * 5)
		return rampStep{Workers: w, Load: load{OK: ok, Elapsed: 5 * time.Second}, Tracer: observed{NAT: int64(ok), Lost: lost}}
	}
	listed := []int{1, 2}
	if w, ok := nextRampWorkers(listed, []rampStep{step(1, 1000, 0)}); !ok || w != 2 {
		t.Errorf("listed step: %d %v", w, ok)
	}
	rising := []rampStep{step(1, 1000, 0), step(2, 2000, 0)}
	if w, ok := nextRampWorkers(listed, rising); !ok || w != 4 {
		t.Errorf("rising: %d %v, want 4 workers", w, ok)
	}
	flat := append(rising, step(4, 2040, 0))
	if _, ok := nextRampWorkers(listed, flat); ok {
		t.Error("the ramp goes on where the rate stopped rising")
	}
	if got := rampEnd(flat); !strings.Contains(got, "never lost") || !strings.Contains(got, "4 workers") {
		t.Errorf("rampEnd(flat) = %q", got)
	}
	lossy := append(rising, step(4, 4000, 3))
	if _, ok := nextRampWorkers(listed, lossy); ok {
		t.Error("the ramp goes on after the tracer lost")
	}
	if got := rampEnd(lossy); !strings.Contains(got, "first lost at 4000 conn/s") {
		t.Errorf("rampEnd(lossy) = %q", got)
	}
}

// The flood ramp doubles past its listed rates while the kernel side
// loses nothing and the machine keeps up; its loss verdict names who lost
// first, and what the tracer lost where conntrack -E first missed.
func TestFloodRamp(t *testing.T) {
	step := func(asked int, made float64, ctNAT, krLost, liveNAT int64) rampStep {
		ok := uint64(made * 5)
		s := rampStep{Rate: asked, Load: load{OK: ok, Elapsed: 5 * time.Second}, Tracer: observed{NAT: int64(ok) - krLost}, CT: observed{NAT: ctNAT, Lost: -1}}
		if liveNAT >= 0 {
			s.LiveLoad, s.Live = load{OK: ok, Elapsed: 5 * time.Second}, observed{NAT: liveNAT}
		}
		return s
	}
	listed := []int{20000, 40000}
	clean := []rampStep{step(20000, 20000, 100000, 0, 100000), step(40000, 40000, 199000, 0, 200000)}
	if r, ok := nextFloodRate(listed, clean); !ok || r != 80000 {
		t.Errorf("after a clean listed ramp: %d %v, want 80000", r, ok)
	}
	if _, ok := nextFloodRate(listed, append(clean, step(80000, 50000, 0, 0, -1))); ok {
		t.Error("the flood goes on where the machine made 62% of the rate")
	}
	if _, ok := nextFloodRate(listed, append(clean, step(80000, 80000, 0, 5, -1))); ok {
		t.Error("the flood goes on after the kernel side lost")
	}
	if liveLost(clean) {
		t.Error("liveLost on a clean ramp")
	}
	lossy := append(clean, step(80000, 80000, 380000, 0, 390000))
	if !liveLost(lossy) {
		t.Error("liveLost misses the full live pipeline's 10,000 missed")
	}
	got, verdict := floodLoss(lossy)
	for _, want := range []string{"conntrack -E first missed at 40000 conn/s (1000 of 200000)", "the tracer's kernel side lost or missed 0, the full live pipeline 0 of 200000",
		"the full live pipeline first lost at 80000 conn/s (10000 of 400000 NAT decisions missed; its lost counters say 0 events)"} {
		if !strings.Contains(got, want) {
			t.Errorf("floodLoss: %q lacks %q", got, want)
		}
	}
	if verdict != "missed: the full live pipeline lost from 80000 conn/s, conntrack -E from 40000" {
		t.Errorf("verdict %q", verdict)
	}
	if _, verdict := floodLoss(clean); verdict != "met" {
		t.Errorf("clean ramp where conntrack -E missed: verdict %q, want met", verdict)
	}
}
