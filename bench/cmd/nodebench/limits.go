package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tracer-dev/tracer/bench/mix"
)

// overheadTarget is the conn/s the tracer may cost, as a fraction.
const overheadTarget = 0.03

// limits explains, from the run's figures only, what holds each missed
// target back.
func (r *report) limits() []string {
	var out []string
	for _, l := range []string{r.kernelLimit(), r.liveLimit(), r.throughputLimit()} {
		if l != "" {
			out = append(out, l)
		}
	}
	return append(out, r.memoryLimits()...)
}

func (r *report) kernelLimit() string {
	vs := r.variants()
	base, kern := find(vs, (none{}).name()), find(vs, kernelName)
	if base == nil || kern == nil || 1-kern.Ratio < overheadTarget {
		return ""
	}
	line := fmt.Sprintf("Kernel side: with the tracer attached and drained, conn/s %s and %s µs CPU per connection (%.0f instead of %.0f µs; %s events per connection).",
		pct(kern.Ratio), extraCPU(*kern, *base), kern.CPUPerConn(), base.CPUPerConn(), perConn(kern.Events, kern.OK))
	if st := find(vs, statsName); st != nil {
		line += " " + r.programShare(*st, *base)
	}
	lo, hi := slices.Min(base.RoundCPU), slices.Max(base.RoundCPU)
	return line + fmt.Sprintf(" With nothing attached, the CPU per connection ranged from %.0f to %.0f µs between rounds.", lo, hi)
}

// programShare compares the programs' own run time, from the kernel's
// statistics, with the CPU the same rounds added.
func (r *report) programShare(st, base variantSummary) string {
	c := r.programCost()
	if len(c.Programs) == 0 || c.Conns == 0 {
		return ""
	}
	own := c.usPerConn(c.total())
	added := st.CPUPerConn() - base.CPUPerConn()
	line := fmt.Sprintf("By the kernel's BPF statistics (%s, %d connections), the tracer's programs ran %.2f µs per connection", plural(c.Rounds, "round"), c.Conns, own)
	if added > own {
		line += fmt.Sprintf("; those rounds added %+.0f µs CPU per connection over nothing attached, %.1fx that, so at least %.0f µs of it is not the programs' run time",
			added, added/own, added-own)
	} else {
		line += fmt.Sprintf("; those rounds added %+.0f µs CPU per connection over nothing attached", added)
	}
	l := c.largest()
	return line + fmt.Sprintf(". The largest is %s (%s, %s): %.2f µs per connection, %.1f runs of %.0f ns.", l.Program, l.Via, l.Hooks,
		c.usPerConn(l), c.runsPerConn(l), nsPerRun(l))
}

func (r *report) liveLimit() string {
	vs := r.variants()
	base, live := find(vs, (none{}).name()), find(vs, (&fullLive{}).name())
	if base == nil || live == nil || 1-live.Ratio < overheadTarget {
		return ""
	}
	added := live.CPUPerConn() - base.CPUPerConn()
	line := fmt.Sprintf("Full live pipeline: conn/s %s and %+.0f µs CPU per connection over nothing attached", pct(live.Ratio), added)
	if kern := find(vs, kernelName); kern != nil {
		line += fmt.Sprintf(", %.0f µs more than the kernel side + drain alone (%s µs)", live.CPUPerConn()-kern.CPUPerConn(), extraCPU(*kern, *base))
	}
	if live.OwnCPU > 0 {
		line += fmt.Sprintf("; its own process took %s µs of it", ownCPU(*live))
	}
	line += ". Beyond the kernel side it runs the conntrack tracker, the node watcher, the join, rule attribution and diagnosis"
	kern, tracker := find(vs, kernelName), find(vs, ctName)
	if kern != nil && tracker != nil {
		line += fmt.Sprintf("; the tracker alone, without lookups, adds %.0f µs per connection to the kernel side + drain (%s), the rest of the pipeline, its lookups included, %.0f µs.",
			tracker.CPUPerConn()-kern.CPUPerConn(), ctName, live.CPUPerConn()-tracker.CPUPerConn())
	} else {
		line += "; this run does not measure those apart on the node."
	}
	var scale []string
	if ct := find(vs, (&conntrackE{}).name()); ct != nil {
		scale = append(scale, fmt.Sprintf("conntrack -E -e NEW alone adds %s µs per connection", extraCPU(*ct, *base)))
	}
	if r.throughput.Rate > 0 {
		scale = append(scale, fmt.Sprintf("the userspace pipeline of section 4 takes %.1f µs per event of the generated mix on one core", 1e6/r.throughput.Rate))
	}
	if len(scale) > 0 {
		line += " For scale: " + strings.Join(scale, ", and ") + "."
	}
	return line
}

// stageOrder is the pipeline's stages in the order an event meets them.
// BenchmarkRecord is not one: the join writes a flow's events in the trace
// format when the flow finishes, so BenchmarkJoin includes it.
var stageOrder = []string{"BenchmarkDecode", "BenchmarkJoin", "BenchmarkEnrich", "BenchmarkEncode"}

// perEventStages is each stage's ns per event of the generated mix: the
// per-flow benchmarks scaled by the mix's flows per event.
func (r *report) perEventStages() map[string]float64 {
	out := map[string]float64{}
	for _, s := range r.stages {
		ns := s.NsOp
		switch s.Name {
		case "BenchmarkEnrich", "BenchmarkEncode", "BenchmarkStoreAppend":
			ns *= float64(mix.Shapes) / float64(mix.EventsPerCycle)
		}
		out[s.Name] = ns
	}
	return out
}

func (r *report) throughputLimit() string {
	if r.throughput.Rate <= 0 || r.throughput.Rate >= 1e6 {
		return ""
	}
	whole := 1e9 / r.throughput.Rate
	line := fmt.Sprintf("Userspace throughput: %.0f events/s is %.0f ns per event; 1,000,000 events/s allows 1000 ns, so the whole pipeline would have to be %.1fx faster.",
		r.throughput.Rate, whole, whole/1000)
	if s := r.stageRelation(whole); s != "" {
		line += " " + s
	}
	return line
}

// stageRelation says how the stages measured apart relate to the whole
// pipeline and to the 1000 ns budget.
func (r *report) stageRelation(whole float64) string {
	per := r.perEventStages()
	var parts []string
	sum, largest := 0.0, ""
	for _, s := range stageOrder {
		ns, ok := per[s]
		if !ok {
			return ""
		}
		parts = append(parts, fmt.Sprintf("%s %.0f", strings.TrimPrefix(s, "Benchmark"), ns))
		sum += ns
		if largest == "" || ns > per[largest] {
			largest = s
		}
	}
	line := fmt.Sprintf("Measured apart (per event, the per-flow stages scaled by %d flows per %d events): %s ns, %.0f ns in all.",
		mix.Shapes, mix.EventsPerCycle, strings.Join(parts, ", "), sum)
	if whole < sum {
		line += fmt.Sprintf(" The whole pipeline took %.0f%% less than that sum, so the sum is not a bound on it.", 100*(1-whole/sum))
	} else {
		line += fmt.Sprintf(" The whole pipeline took %.0f%% more than that sum.", 100*(whole/sum-1))
	}
	if bp, ok := r.stage("BenchmarkPipeline"); ok {
		line += fmt.Sprintf(" BenchmarkPipeline, the same pipeline under go test, took %.0f ns per event, %s against the whole pipeline's run", bp.NsOp, pct(bp.NsOp/whole))
		if fpe, ok := bp.Extra["flows/event"]; ok {
			line += fmt.Sprintf(", and emitted %.2f flows per event against that run's %.2f", fpe, r.flowsPerEvent())
		}
		line += "."
	}
	line += r.stagesRelation()
	name := strings.TrimPrefix(largest, "Benchmark")
	if per[largest] > 1000 {
		line += fmt.Sprintf(" The largest stage, %s, takes %.0f ns per event, %.1fx the whole budget on its own.", name, per[largest], per[largest]/1000)
	} else {
		line += fmt.Sprintf(" The largest stage, %s, takes %.0f ns per event, %.0f%% of the budget.", name, per[largest], per[largest]/10)
	}
	return line + fmt.Sprintf(" Decode takes %.0f ns, %.0f%% of it.", per["BenchmarkDecode"], per["BenchmarkDecode"]/10)
}

// stagesRelation compares the live pipeline's stages, as Run wires them
// on two goroutines, on one core and on two.
func (r *report) stagesRelation() string {
	one, ok1 := r.stage("BenchmarkStages")
	two, ok2 := r.stage("BenchmarkStages-2")
	if !ok1 || !ok2 || one.NsOp <= 0 || two.NsOp <= 0 {
		return ""
	}
	return fmt.Sprintf(" BenchmarkStages is that pipeline as live.Run wires it, the join on one goroutine and the enrichment, diagnosis and writing on another:"+
		" %.0f ns per event on one core, %.0f on two (GOMAXPROCS=2), %.2fx the events a second.", one.NsOp, two.NsOp, one.NsOp/two.NsOp)
}

// stage is the named per-stage benchmark.
func (r *report) stage(name string) (goBench, bool) {
	for _, s := range r.stages {
		if s.Name == name {
			return s, true
		}
	}
	return goBench{}, false
}

// flowsPerEvent is the flows the whole-pipeline run emitted per event.
func (r *report) flowsPerEvent() float64 {
	return float64(r.throughput.Flows) / float64(max(r.throughput.Events, 1))
}

func (r *report) memoryLimits() []string {
	var out []string
	for _, m := range r.memory {
		if m.N != 1_000_000 || mib(m.RSS) < 200 {
			continue
		}
		out = append(out, fmt.Sprintf("Memory (%s, 1,000,000 flows): %.0f MiB resident, %.0f MiB heap in use, "+
			"about %.0f bytes of heap per flow. Where it goes: `NODEBENCH_HEAPPROFILE=heap.prof go run ./bench/cmd/nodebench -child mem:%s:100000` "+
			"then `go tool pprof -top heap.prof`.", m.Kind, mib(m.RSS), mib(m.HeapInuse), heapPerFlow(m), m.Kind))
	}
	return out
}

// heapPerFlow is the heap the flows added, per flow, in bytes.
func heapPerFlow(m childResult) float64 {
	return float64(m.HeapInuse-min(m.BaseHeap, m.HeapInuse)) / float64(max(m.N, 1))
}
