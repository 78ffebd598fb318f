package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// variantSummary is one observer over every round.
type variantSummary struct {
	Name        string
	OK, Failed  uint64
	Elapsed     time.Duration
	Rate        float64
	Ratio       float64 // total rate / total rate with nothing attached
	RoundRatios []float64
	MedianRatio float64
	NAT, Lost   int64
	Events      int64
	CPU         time.Duration
	// OwnCPU is the CPU time of the observer's own process.
	OwnCPU  time.Duration
	Machine machineCPU
	// RoundCPU is the CPU per connection of each round, in µs.
	RoundCPU []float64
	// RoundRates is the conn/s of each round.
	RoundRates []float64
	// RoundAddedCPU is, for each round that also ran nothing attached,
	// the CPU per connection above that run's: paired by round, so the
	// machine's drift between rounds cancels.
	RoundAddedCPU []float64
	Extra         []string
}

// overheadIntervals are the intervals of v's rounds' cost, paired with
// the same rounds' runs of nothing attached; false with fewer than three
// such rounds.
func (v variantSummary) overheadIntervals() (overheadIntervals, bool) {
	fewer, ok1 := meanInterval(fewerPercent(v.RoundRatios))
	added, ok2 := meanInterval(v.RoundAddedCPU)
	return overheadIntervals{fewer: fewer, added: added}, ok1 && ok2
}

// cpuPerConn is a round's CPU per connection made, in µs.
func cpuPerConn(x roundResult) float64 {
	return float64(x.CPU.Microseconds()) / float64(max(x.Load.OK, 1))
}

// CPUPerConn is the CPU time (this process and its children) per
// connection made, in microseconds.
func (v variantSummary) CPUPerConn() float64 {
	return float64(v.CPU.Microseconds()) / float64(max(v.OK, 1))
}

func (r *report) variants() []variantSummary {
	var order []string
	by := map[string]*variantSummary{}
	baseByRound := map[int]float64{}
	baseCPUByRound := map[int]float64{}
	for _, x := range r.rounds {
		if x.Variant == (none{}).name() {
			baseByRound[x.Round] = x.Load.rate()
			baseCPUByRound[x.Round] = cpuPerConn(x)
		}
	}
	for _, x := range r.rounds {
		v := by[x.Variant]
		if v == nil {
			v = &variantSummary{Name: x.Variant}
			by[x.Variant] = v
			order = append(order, x.Variant)
		}
		v.OK += x.Load.OK
		v.Failed += x.Load.Failed
		v.Elapsed += x.Load.Elapsed
		v.NAT += x.Obs.NAT
		v.Lost += x.Obs.Lost
		v.Events += x.Obs.Events
		v.CPU += x.CPU
		v.OwnCPU += x.Obs.OwnCPU
		v.Machine.Busy += x.Machine.Busy
		v.Machine.Total += x.Machine.Total
		v.RoundCPU = append(v.RoundCPU, cpuPerConn(x))
		v.RoundRates = append(v.RoundRates, x.Load.rate())
		if x.Obs.Extra != "" {
			v.Extra = append(v.Extra, x.Obs.Extra)
		}
		if base := baseByRound[x.Round]; base > 0 {
			v.RoundRatios = append(v.RoundRatios, x.Load.rate()/base)
			v.RoundAddedCPU = append(v.RoundAddedCPU, cpuPerConn(x)-baseCPUByRound[x.Round])
		}
	}
	var out []variantSummary
	var base float64
	for _, name := range order {
		v := by[name]
		v.Rate = float64(v.OK) / v.Elapsed.Seconds()
		if name == (none{}).name() {
			base = v.Rate
		}
		out = append(out, *v)
	}
	for i := range out {
		if base > 0 {
			out[i].Ratio = out[i].Rate / base
		}
		out[i].MedianRatio = median(out[i].RoundRatios)
	}
	// nothing first, then in the order they ran in round 1
	slices.SortStableFunc(out, func(a, b variantSummary) int {
		return index(order, a.Name) - index(order, b.Name)
	})
	return out
}

func index(xs []string, x string) int { return slices.Index(xs, x) }

// find is the summary of the named observer, nil when it did not run.
func find(vs []variantSummary, name string) *variantSummary {
	for i := range vs {
		if vs[i].Name == name {
			return &vs[i]
		}
	}
	return nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// pct is the change a ratio means, in percent.
func pct(ratio float64) string {
	d := math.Round((ratio-1)*1000) / 10
	if d == 0 {
		d = 0 // no "-0.0%"
	}
	return fmt.Sprintf("%+.1f%%", d)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// missed is how many of ok connections an observer did not report.
func missed(ok uint64, seen int64) int64 {
	if seen < 0 {
		return -1
	}
	return max(int64(ok)-seen, 0)
}

// plural is n and the word, an s added unless n is 1.
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func counted(n int64) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

type target struct {
	What, Goal, Got, Verdict string
}

// overheadGoals are issue 14's: what each observer may cost the node.
var overheadGoals = []struct {
	name               string
	percent, cpuMicros float64
}{{kernelName, 3, 3}, {(&fullLive{}).name(), 5, 10}}

func (r *report) targets() []target {
	var ts []target
	vs := r.variants()
	if r.skippedKernel == "" && len(vs) > 0 {
		nft := find(vs, (&nftTrace{}).name())
		for _, goal := range overheadGoals {
			v := find(vs, goal.name)
			if v == nil {
				continue
			}
			over := (1 - v.Ratio) * 100
			cpu := v.CPUPerConn() - vs[0].CPUPerConn()
			t := target{What: "overhead, " + goal.name, Goal: fmt.Sprintf("<= %.0f%% fewer conn/s, <= %.0f µs CPU/conn", goal.percent, goal.cpuMicros),
				Got: fmt.Sprintf("%.1f%% (median of rounds %.1f%%); CPU %s µs/conn", over, (1-v.MedianRatio)*100, extraCPU(*v, vs[0]))}
			met := over <= goal.percent && cpu <= goal.cpuMicros
			switch {
			case met:
				t.Verdict = "met"
			case over <= goal.percent:
				t.Verdict = fmt.Sprintf("missed by %.0f µs CPU/conn", cpu-goal.cpuMicros)
			default:
				t.Verdict = fmt.Sprintf("missed by %.1f points", over-goal.percent)
			}
			if iv, ok := v.overheadIntervals(); ok {
				t.Got += "; " + iv.String()
				switch decided, ivMet := iv.decides(goal.percent, goal.cpuMicros); {
				case !decided:
					t.Verdict += "; not decided by this run: its rounds' intervals reach both sides of the target"
				case ivMet && !met:
					t.Verdict += "; its rounds' intervals lie within the target"
				case !ivMet && met:
					t.Verdict += "; its rounds' intervals lie beyond the target"
				}
			}
			if nft != nil {
				t.Got += fmt.Sprintf(". nft trace: %.1f%% fewer conn/s, CPU %s µs/conn, and it missed %d of %d NAT decisions",
					(1-nft.Ratio)*100, extraCPU(*nft, vs[0]), missed(nft.OK, nft.NAT), nft.OK)
			}
			ts = append(ts, t)
		}
		ts = append(ts, r.lossTarget(), r.flowsTarget())
		if len(r.attach) > 0 {
			worst := time.Duration(0)
			for _, a := range r.attach {
				worst = max(worst, a.Attach+a.Detach)
			}
			t := target{What: "attach + detach", Goal: "< 1 s", Got: fmt.Sprintf("worst of %d: %s", len(r.attach), worst.Round(time.Millisecond))}
			if worst < time.Second {
				t.Verdict = "met"
			} else {
				t.Verdict = fmt.Sprintf("missed by %s", (worst - time.Second).Round(time.Millisecond))
			}
			ts = append(ts, t)
		}
	}
	if r.throughput.Rate > 0 {
		t := target{What: "userspace throughput, one core", Goal: ">= 1,000,000 events/s", Got: fmt.Sprintf("%.0f events/s", r.throughput.Rate)}
		if r.throughput.Rate >= 1e6 {
			t.Verdict = "met"
		} else {
			t.Verdict = fmt.Sprintf("missed: %.1f%% of the target (%.0fx short)", r.throughput.Rate/1e4, 1e6/r.throughput.Rate)
		}
		ts = append(ts, t)
	}
	if bp, ok := r.stage("BenchmarkPipeline"); ok && bp.Extra["allocs/event"] > 0 {
		allocs := bp.Extra["allocs/event"]
		t := target{What: "allocations per event, steady path", Goal: "<= 2 (BenchmarkPipeline)", Got: fmt.Sprintf("%.2f", allocs)}
		if allocs <= 2 {
			t.Verdict = "met"
		} else {
			t.Verdict = fmt.Sprintf("missed by %.2f", allocs-2)
		}
		ts = append(ts, t)
	}
	ts = append(ts, r.memoryTargets()...)
	if t, ok := r.feedTarget(); ok {
		ts = append(ts, t)
	}
	if t, ok := r.vmTarget(); ok {
		ts = append(ts, t)
	}
	return ts
}

// table is the plain-text summary printed at the end of a run.
func (r *report) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nnodebench  %s  kernel %s  %d cores  load average %s (start) / %s (end)\n\n", r.started.Format(time.RFC3339),
		r.machine.Kernel, r.machine.Cores, r.loadStart, r.loadEnd)
	if r.skippedKernel != "" {
		fmt.Fprintf(&b, "kernel side skipped: %s\n\n", r.skippedKernel)
	} else {
		vs := r.variants()
		fmt.Fprintf(&b, "%-42s %8s %7s %7s %9s %9s %9s %6s %9s %9s %9s\n", "observer", "conn/s", "ratio", "median", "NAT seen", "missed", "lost", "ev/conn", "CPU µs/c", "+µs/conn", "own µs/c")
		for _, v := range vs {
			fmt.Fprintf(&b, "%-42s %8.0f %7.3f %7.3f %9s %9s %9s %6s %9.0f %9s %9s\n", v.Name, v.Rate, v.Ratio, v.MedianRatio,
				counted(v.NAT), counted(missed(v.OK, v.NAT)), counted(v.Lost), perConn(v.Events, v.OK), v.CPUPerConn(), extraCPU(v, vs[0]), ownCPU(v))
		}
		fmt.Fprintf(&b, "\n%-8s %10s %12s %12s %12s %14s\n", "workers", "conn/s", "tracer seen", "tracer lost", "ct -E seen", "ct -E missed")
		for _, s := range r.ramp {
			fmt.Fprintf(&b, "%-8d %10.0f %12d %12d %12d %14d\n", s.Workers, s.Load.rate(), s.Tracer.NAT, s.Tracer.Lost, s.CT.NAT, missed(s.Load.OK, s.CT.NAT))
		}
		if c := r.programCost(); len(c.Programs) > 0 {
			fmt.Fprintf(&b, "\nBPF statistics, %d rounds, %d connections:\n", c.Rounds, c.Conns)
			for _, pr := range append(c.Programs, c.total()) {
				fmt.Fprintf(&b, "  %-14s %-10s %10d runs %7.2f runs/conn %6.0f ns/run %7.3f µs/conn\n", pr.Program, pr.Via, pr.Runs,
					c.runsPerConn(pr), nsPerRun(pr), c.usPerConn(pr))
			}
		}
		if len(r.attach) > 0 {
			var at, de []float64
			for _, a := range r.attach {
				at, de = append(at, float64(a.Attach.Milliseconds())), append(de, float64(a.Detach.Milliseconds()))
			}
			fmt.Fprintf(&b, "\nattach median %.0f ms, detach median %.0f ms (%d runs)\n", median(at), median(de), len(r.attach))
		}
	}
	if r.cfg.userside {
		fmt.Fprintf(&b, "\nuserspace pipeline, one core: %.0f events/s (%d events, %d flows in %.1f s)\n", r.throughput.Rate,
			r.throughput.Events, r.throughput.Flows, r.throughput.Seconds)
	}
	for _, s := range r.stages {
		fmt.Fprintf(&b, "  %-22s %10.0f ns/op %12.0f %-9s %8.0f B/op %6.0f allocs/op\n", s.Name, s.NsOp, s.Metric, s.Unit, s.BytesOp, s.Allocs)
	}
	fmt.Fprintln(&b)
	for _, m := range r.memory {
		fmt.Fprintf(&b, "memory %-7s %8d flows: VmRSS %7.1f MiB (base %.1f), HeapInuse %7.1f MiB (base %.1f)\n", m.Kind, m.N,
			mib(m.RSS), mib(m.BaseRSS), mib(m.HeapInuse), mib(m.BaseHeap))
	}
	for _, s := range r.feed.Samples {
		fmt.Fprintf(&b, "store feed minute %3d: %9d seen, %7d retained, estimate %6.1f MiB, HeapInuse %6.1f MiB, VmRSS %6.1f MiB\n", s.Minute, s.Seen,
			s.Retained, mib(uint64(s.Estimate)), mib(s.HeapInuse), mib(s.RSS))
	}
	fmt.Fprintln(&b)
	for _, t := range r.targets() {
		fmt.Fprintf(&b, "%-40s %-30s %s: %s\n", t.What, t.Goal, t.Verdict, t.Got)
	}
	return b.String()
}

func perConn(events int64, ok uint64) string {
	if events < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(events)/float64(max(ok, 1)))
}

// ownCPU is the observer process's own CPU time per connection, in µs.
func ownCPU(v variantSummary) string {
	if v.OwnCPU == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(v.OwnCPU.Microseconds())/float64(max(v.OK, 1)))
}

// extraCPU is the CPU per connection an observer adds to running nothing.
func extraCPU(v, base variantSummary) string {
	if v.Name == base.Name {
		return "-"
	}
	d := math.Round(v.CPUPerConn() - base.CPUPerConn())
	if d == 0 {
		d = 0 // no "-0"
	}
	return fmt.Sprintf("%+.0f", d)
}

// flowsTarget holds the full live pipeline's flows against the connections
// made, in every round: each connection must be its own flow.
func (r *report) flowsTarget() target {
	t := target{What: "one flow per connection (full live pipeline)", Goal: ">= 99.9% of connections, every round"}
	var made, flows uint64
	worst, worstRate := 2.0, 0.0
	for _, x := range r.rounds {
		if x.Variant != (&fullLive{}).name() || x.Load.OK == 0 {
			continue
		}
		made += x.Load.OK
		flows += uint64(max(x.Obs.Flows, 0))
		if ratio := float64(x.Obs.Flows) / float64(x.Load.OK); ratio < worst {
			worst, worstRate = ratio, x.Load.rate()
		}
	}
	if made == 0 {
		t.Got, t.Verdict = "no round of the full live pipeline", "not measured"
		return t
	}
	t.Got = fmt.Sprintf("%d flows for %d connections (%.2f%%); worst round %.2f%% at %.0f conn/s",
		flows, made, 100*float64(flows)/float64(made), 100*worst, worstRate)
	t.Verdict = "met"
	if worst < 0.999 || worst > 1.001 {
		t.Verdict = fmt.Sprintf("missed: worst round %.2f%%", 100*worst)
	}
	return t
}

// lossTarget compares the tracer's losses with conntrack -E's: in the ramp,
// where both were attached at once, and in the rounds, each alone.
func (r *report) lossTarget() target {
	t := target{What: "loss", Goal: "0 lost where conntrack -E loses some"}
	var where *rampStep // the first ramp step where conntrack -E missed some
	top, rampLost := 0.0, int64(0)
	for i := range r.ramp {
		s := &r.ramp[i]
		if missed(s.Load.OK, s.CT.NAT) > 0 && where == nil {
			where = s
		}
		top = max(top, s.Load.rate())
		rampLost += s.Tracer.lostOrMissed(s.Load)
	}
	var ctRound *roundResult // the slowest round in which conntrack -E missed some
	trTop, roundLost := 0.0, int64(0)
	for i := range r.rounds {
		x := &r.rounds[i]
		switch x.Variant {
		case (&conntrackE{}).name():
			if missed(x.Load.OK, x.Obs.NAT) > 0 && (ctRound == nil || x.Load.rate() < ctRound.Load.rate()) {
				ctRound = x
			}
		case kernelName, statsName, ctName, (&fullLive{}).name():
			trTop = max(trTop, x.Load.rate())
			roundLost += max(x.Obs.Lost, 0) + missed(x.Load.OK, x.Obs.NAT)
		}
	}
	switch {
	case len(r.flood) > 0:
		t.Got, t.Verdict = floodLoss(r.flood)
	case where != nil:
		trLost := where.Tracer.lostOrMissed(where.Load)
		t.Got = fmt.Sprintf("ramp, both attached at %.0f conn/s (%s): conntrack -E missed %d, tracer lost %d and missed %d",
			where.Load.rate(), plural(where.Workers, "worker"), missed(where.Load.OK, where.CT.NAT), where.Tracer.Lost, missed(where.Load.OK, where.Tracer.NAT))
		t.Verdict = "met"
		if trLost > 0 {
			t.Verdict = "missed"
		}
	case ctRound != nil:
		t.Got = fmt.Sprintf("ramp: conntrack -E missed none up to %.0f conn/s, the tracer lost or missed %d; rounds: conntrack -E missed %d at %.0f conn/s (round %d), the tracer lost or missed %d over its rounds, up to %.0f conn/s",
			top, rampLost, missed(ctRound.Load.OK, ctRound.Obs.NAT), ctRound.Load.rate(), ctRound.Round, roundLost, trTop)
		switch {
		case roundLost > 0 || rampLost > 0:
			t.Verdict = "missed"
		case trTop >= ctRound.Load.rate():
			t.Verdict = "met (in separate rounds)"
		default:
			t.Verdict = "not shown at the same rate: the tracer's rounds ran slower"
		}
	default:
		t.Got = fmt.Sprintf("conntrack -E missed none, in the ramp (up to %.0f conn/s) or the rounds; the tracer lost or missed %d", top, rampLost+roundLost)
		t.Verdict = "not shown: conntrack -E never lost in this run"
	}
	if end := rampEnd(r.ramp); end != "" {
		t.Got += "; TCP ramp: " + end
	}
	return t
}

// floodLoss is the loss target read from the flood ramp, where the rate
// goes highest: met when neither the kernel side nor the full live
// pipeline lost or missed a NAT decision at any rate, conntrack -E's
// first miss and the rate where the ramp ended beside it.
func floodLoss(steps []rampStep) (got, verdict string) {
	var ctFirst, krFirst, liveFirst *rampStep
	top, liveTop := 0.0, 0.0
	for i := range steps {
		s := &steps[i]
		top = max(top, s.Load.rate())
		if ctFirst == nil && missed(s.Load.OK, s.CT.NAT) > 0 {
			ctFirst = s
		}
		if krFirst == nil && s.Tracer.lostOrMissed(s.Load) > 0 {
			krFirst = s
		}
		if s.LiveLoad.OK > 0 {
			liveTop = max(liveTop, s.LiveLoad.rate())
			if liveFirst == nil && s.Live.lostOrMissed(s.LiveLoad) > 0 {
				liveFirst = s
			}
		}
	}
	var parts []string
	if ctFirst != nil {
		live := "was not run"
		if ctFirst.LiveLoad.OK > 0 {
			live = fmt.Sprintf("%d of %d", ctFirst.Live.lostOrMissed(ctFirst.LiveLoad), ctFirst.LiveLoad.OK)
		}
		parts = append(parts, fmt.Sprintf("flood ramp: conntrack -E first missed at %.0f conn/s (%d of %d); at that rate the tracer's kernel side lost or missed %d, the full live pipeline %s",
			ctFirst.Load.rate(), missed(ctFirst.Load.OK, ctFirst.CT.NAT), ctFirst.Load.OK, ctFirst.Tracer.lostOrMissed(ctFirst.Load), live))
	} else {
		parts = append(parts, fmt.Sprintf("flood ramp: conntrack -E missed none up to %.0f conn/s", top))
	}
	if krFirst != nil {
		parts = append(parts, fmt.Sprintf("the tracer's kernel side first lost at %.0f conn/s (%s)", krFirst.Load.rate(), missedOf(krFirst.Load, krFirst.Tracer)))
	} else {
		parts = append(parts, fmt.Sprintf("the tracer's kernel side lost none up to %.0f conn/s, where %s", top, floodEnd(steps)))
	}
	if liveFirst != nil {
		parts = append(parts, fmt.Sprintf("the full live pipeline first lost at %.0f conn/s (%s)", liveFirst.LiveLoad.rate(), missedOf(liveFirst.LiveLoad, liveFirst.Live)))
	} else {
		parts = append(parts, fmt.Sprintf("the full live pipeline lost none up to %.0f conn/s", liveTop))
	}
	got = strings.Join(parts, "; ")
	switch {
	case krFirst != nil:
		verdict = fmt.Sprintf("missed: the kernel side lost from %.0f conn/s", krFirst.Load.rate())
	case liveFirst != nil:
		verdict = fmt.Sprintf("missed: the full live pipeline lost from %.0f conn/s", liveFirst.LiveLoad.rate())
		if ctFirst != nil {
			verdict += fmt.Sprintf(", conntrack -E from %.0f", ctFirst.Load.rate())
		}
	case ctFirst == nil:
		verdict = "not shown: conntrack -E never lost in this run"
	default:
		verdict = "met"
	}
	return got, verdict
}

// missedOf says how many of l's NAT decisions o missed, and what its lost
// counters say.
func missedOf(l load, o observed) string {
	return fmt.Sprintf("%d of %d NAT decisions missed; its lost counters say %d events", missed(l.OK, o.NAT), l.OK, max(o.Lost, 0))
}

// floodEnd says why the flood ramp stopped (nextFloodRate).
func floodEnd(steps []rampStep) string {
	last := steps[len(steps)-1]
	switch {
	case last.Tracer.lostOrMissed(last.Load) > 0:
		return "it lost"
	case last.Load.rate() < 0.8*float64(last.Rate):
		return fmt.Sprintf("the machine could not send faster (%.0f of the %d a second asked)", last.Load.rate(), last.Rate)
	default:
		return fmt.Sprintf("the ramp's last rate (%d a second asked)", last.Rate)
	}
}

// rampEnd says where the ramp stopped and why (nextRampWorkers): the
// first rate at which the tracer lost, or the machine's limit.
func rampEnd(steps []rampStep) string {
	if len(steps) == 0 {
		return ""
	}
	for _, s := range steps {
		if lost := s.Tracer.lostOrMissed(s.Load); lost > 0 {
			return fmt.Sprintf("the tracer first lost at %.0f conn/s (%s): %d", s.Load.rate(), plural(s.Workers, "worker"), lost)
		}
	}
	last, top := steps[len(steps)-1], rampTop(steps)
	if last.Workers*2 > maxRampWorkers {
		return fmt.Sprintf("the tracer never lost; the ramp stopped at its bound of %d workers (%.0f conn/s)", last.Workers, last.Load.rate())
	}
	return fmt.Sprintf("the tracer never lost; the ramp stopped at %s, where the machine's rate stopped rising (top %.0f conn/s): the tracer's own limit is beyond what this machine can make", plural(last.Workers, "worker"), top)
}

// memoryTargets holds the joiner's 1,000,000 open flows (the target's own
// subject) and, apart, the UI store's 1,000,000 finished flows without its
// caps to the same 200 MiB: the tracer holds both.
func (r *report) memoryTargets() []target {
	var ts []target
	for _, m := range r.memory {
		if m.N != 1_000_000 {
			continue
		}
		var t target
		switch m.Kind {
		case "joiner":
			t = target{What: "memory at 1,000,000 flows", Goal: "< 200 MiB resident",
				Got: fmt.Sprintf("%.0f MiB (1,000,000 open flows in the joiner)", mib(m.RSS))}
		case "store":
			t = target{What: "memory at 1,000,000 stored flows (UI store, without its caps)", Goal: "< 200 MiB resident",
				Got: fmt.Sprintf("%.0f MiB (the default caps keep %d flows, %d MiB by the store's estimate)", mib(m.RSS),
					trace.DefaultCaps.Flows, trace.DefaultCaps.Memory>>20)}
		default:
			continue
		}
		if mib(m.RSS) < 200 {
			t.Verdict = "met"
		} else {
			t.Verdict = fmt.Sprintf("missed by %.0f MiB (%.1fx)", mib(m.RSS)-200, mib(m.RSS)/200)
		}
		ts = append(ts, t)
	}
	return ts
}
