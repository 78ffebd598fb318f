package main

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/loader"
)

// printer appends formatted text to the report.
type printer func(format string, a ...any)

// targetsMarkdown prints the targets, with the previous run's verdict and
// figure beside each when there was one.
func (r *report) targetsMarkdown(p printer) {
	p("## Targets\n\n")
	ts := r.targets()
	if slices.ContainsFunc(ts, func(t target) bool { return strings.HasPrefix(t.What, "overhead, ") }) {
		p("An overhead's verdict is the whole run's figure against its target. Beside that figure is the 90%% interval of the mean of its rounds, each round paired with the same round's run with nothing attached (Student's t); where that interval reaches both sides of the target, the verdict says this run does not decide it.\n\n")
	}
	if r.previous.When == "" {
		p("| what | target | result | verdict |\n|---|---|---|---|\n")
		for _, t := range ts {
			p("| %s | %s | %s | %s |\n", t.What, t.Goal, t.Got, t.Verdict)
		}
		p("\n")
		return
	}
	p("The last column is the previous run's (%s), as its BENCHMARKS.md said", r.previous.When)
	if r.previous.Speed != "" {
		p("; its machine's %s was %s, this one's %s: figures of time and rate compare only as far as that does", speedRow, r.previous.Speed, r.speedText())
	}
	p(".\n\n")
	p("| what | target | result | verdict | previous run |\n|---|---|---|---|---|\n")
	for _, t := range ts {
		old, ok := r.previous.Results[t.What]
		if !ok {
			old = "not measured"
		}
		p("| %s | %s | %s | %s | %s |\n", t.What, t.Goal, t.Got, t.Verdict, old)
	}
	p("\n")
}

// markdown is BENCHMARKS.md: machine, commands, every raw figure, the
// ratios, and the targets with what limits the missed ones. Sentences
// that state a result are computed from the figures; the others describe
// the method as the code does it.
func (r *report) markdown() string {
	var b strings.Builder
	p := printer(func(format string, a ...any) { fmt.Fprintf(&b, format, a...) })
	p("# Benchmarks\n\n")
	p("Written by `make bench` (`go run ./bench/cmd/nodebench`); rerun it rather than editing this file. ")
	p("Every figure below is from the run described here, on this machine; the load average says how much other work ran meanwhile.\n\n")
	r.machineMarkdown(p)
	r.targetsMarkdown(p)
	if ls := r.limits(); len(ls) > 0 {
		p("### What limits the missed targets\n\n")
		for _, l := range ls {
			p("- %s\n", l)
		}
		p("\n")
	}
	if r.skippedKernel != "" {
		p("## Kernel side\n\nNot measured: %s.\n\n", r.skippedKernel)
	} else {
		r.overheadMarkdown(p)
		r.programsMarkdown(p)
		r.roundsMarkdown(p)
		r.rampMarkdown(p)
		r.floodMarkdown(p)
		r.stormMarkdown(p)
		r.attachMarkdown(p)
	}
	if r.cfg.userside {
		r.throughputMarkdown(p)
		r.memoryMarkdown(p)
	}
	if r.cfg.userside && r.cfg.gotest {
		r.nftMarkdown(p)
	}
	r.vmMarkdown(p)
	if r.cfg.userside && r.cfg.gotest {
		r.auditMarkdown(p)
	}
	r.idleMarkdown(p)
	if len(r.notes) > 0 {
		p("## Notes\n\n")
		for _, n := range r.notes {
			p("- %s\n", n)
		}
	}
	return b.String()
}

// speedRow names cpuSpeed in the machine table.
const speedRow = "CPU speed (sort 1M random uint64, count them in a map by their top 20 bits; one core, best of 5)"

func (r *report) speedText() string {
	return fmt.Sprintf("%v at the start, %v at the end", r.speedStart.Round(time.Millisecond), r.speedEnd.Round(time.Millisecond))
}

func (r *report) machineMarkdown(p printer) {
	p("## Machine\n\n| | |\n|---|---|\n")
	p("| CPU | %s |\n| cores | %d |\n| memory | %s |\n| kernel | %s |\n| iptables | %s |\n| Go | %s |\n", r.machine.CPU, r.machine.Cores,
		r.machine.Memory, r.machine.Kernel, r.machine.Iptables, runtime.Version())
	p("| run | %s, %s |\n", r.started.UTC().Format("2006-01-02 15:04 MST"), r.ended.Sub(r.started).Round(time.Second))
	p("| load average (1, 5, 15 min) | %s at the start, %s at the end |\n", r.loadStart, r.loadEnd)
	p("| %s | %s |\n\n", speedRow, r.speedText())
	p("## Commands\n\n```\nsudo make bench\n")
	for _, c := range r.commands {
		p("%s\n", c)
	}
	p("```\n\n")
}

func (r *report) overheadMarkdown(p printer) {
	cfg := r.cfg
	p("## 1-2. Cost on the node: the tracer, conntrack -E and nft tracing\n\n")
	p("Three throwaway network namespaces: client `%s` -> router (`iptables -t nat -A PREROUTING -d %s -p tcp --dport %d -j DNAT --to-destination %s:%d`) -> server `%s`. ",
		cAddr, vip, vport, sAddr, sport, sAddr)
	p("%d client workers, each on a thread in the client namespace, make short-lived connections to %s:%d ", cfg.workers, vip, vport)
	p("(connect, read the one byte the Go server in the server namespace writes, close) as fast as they can. ")
	p("%s of %s per observer, the observers rotated every round so none always follows another; ", plural(cfg.rounds, "round"), cfg.round)
	p("conn/s is the successful connections over the whole time, ratio is that over the rate with nothing attached, ")
	p("median is the median over rounds of the ratio to the same round's run with nothing attached. ")
	p("Observers (each observing the router namespace only):\n\n")
	p("The tracer's observers run in a child process of the benchmark, as the tracer runs on a node: in a process of its own beside the workload (see *Why the tracer runs in a process of its own* below).\n\n")
	p("- **%s**: `loader.Open` observing the router namespace, a goroutine reading and decoding every ring buffer record (`Tracer.Next`). ", kernelName)
	p("The programs submit records without waking the reader until a backlog has built up (bpf/tracer.c, `submit`); otherwise the reader looks on its own on a short timer (internal/loader, `Next`), waiting in Go's network poller.\n")
	p("- **%s**: the same, with the kernel's BPF run statistics on for the round: enabled with the BPF_ENABLE_STATS command (`loader.EnableRunStats`; the kernel.bpf_stats_enabled sysctl is not touched) ", statsName)
	p("and each attached program's run count and run time read at the start and at the end (`Tracer.ProgramStats`). Section 2b is these figures.\n")
	p("- **%s**: the same as %s, and a conntrack tracker on the router namespace opened as the live pipeline opens its own (`conntrack.OpenWith(..., live.ConntrackOptions())`: its table and the entries' ends, from the kernel side where it can probe conntrack's delete (`nf_ct_delete`), else from its DESTROY subscription, as each round's notes say; no lookups) and nothing else of the pipeline; what it adds to %s is the tracker's standing cost.\n", ctName, kernelName, kernelName)
	p("- **tracer (full live pipeline)**: `live.Start` + `Run` on the router namespace (kernel side, conntrack tracking, node watcher, join, rule attribution, diagnosis), flows written as NDJSON by `trace.Writer` to a file, as `tracer trace -o json > FILE` does (the file is removed after each round).\n")
	p("- **conntrack -E -e NEW**: `ip netns exec ROUTER conntrack -E -e NEW`, its lines with the VIP as original destination and the server in the reply counted.\n")
	p("- **nft monitor trace**: a `prerouting` chain at priority -350 with `ip daddr %s tcp dport %d meta nftrace set 1`, and `nft monitor trace`; ", vip, vport)
	p("the NAT decision is the trace line of the nat table's `PREROUTING` rule that says DNAT (`%s` here", r.machine.Iptables)
	if strings.Contains(r.machine.Iptables, "nf_tables") {
		p(": its rules are nf_tables rules, which nft traces")
	}
	p(").\n\n")
	p("*NAT seen* is the NAT decisions of the lab's connections the observer reported, *missed* the successful connections it did not report, ")
	p("*lost* what it says it lost itself (the tracer's per-hook ring buffer counters), *ev/conn* all tracer events per connection, ")
	p("*CPU µs/conn* the CPU time of the benchmark process and its waited-for children (load generator, server, observer) per connection, but for what an observer's process spent before it was observing (its start and attach), *+µs/conn* what the observer adds to that, ")
	p("*own µs/conn* the observer process's own share of it (the rest of *+µs/conn* is spent in the kernel on the connections' own paths: the programs, conntrack's events), ")
	p("*machine busy* the share of all the machine's CPU time (/proc/stat) that was not idle, other work on the machine included.\n\n")
	vs := r.variants()
	p("| observer | conn/s | ratio | median ratio | conn/s change | NAT seen | missed | lost | ev/conn | CPU µs/conn | +µs/conn | own µs/conn | machine busy |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, v := range vs {
		p("| %s | %.0f | %.3f | %.3f | %s | %s | %s | %s | %s | %.0f | %s | %s | %.0f%% |\n", v.Name, v.Rate, v.Ratio, v.MedianRatio, pct(v.Ratio),
			counted(v.NAT), counted(missed(v.OK, v.NAT)), counted(v.Lost), perConn(v.Events, v.OK), v.CPUPerConn(), extraCPU(v, vs[0]),
			ownCPU(v), 100*v.Machine.busyFraction())
	}
	p("\n%s\n\n", r.readingOverhead(vs))
	r.ownProcessMarkdown(p, vs)
}

// ownProcessMarkdown says why the tracer's observers run in a child
// process, with this run's figures when it measured the blocker.
func (r *report) ownProcessMarkdown(p printer, vs []variantSummary) {
	p("### Why the tracer runs in a process of its own\n\n")
	p("The tracer runs on a node as its own process. Run inside the benchmark's process, beside the load generator, an observer that blocks an OS thread in a system call disturbs the generator's Go scheduler (the runtime retakes the blocked thread's processor and hands it on, every time), which a tracer in its own process cannot do to the node's workloads. ")
	in, own := find(vs, (&blocker{}).name()), find(vs, (&blocker{own: true}).name())
	if in == nil || own == nil {
		p("`-observers blocker,blocker-own` measures it: a goroutine doing nothing but wait in epoll_wait on an empty epoll set, 20 ms at a time, in the benchmark's process and in a process of its own.\n\n")
		return
	}
	p("This run measured it: a goroutine doing nothing but wait in epoll_wait on an empty epoll set, 20 ms at a time, changed the connection rate by %s in the benchmark's process and by %s in a process of its own.\n\n",
		pct(in.Ratio), pct(own.Ratio))
}

// readingOverhead states what the table's figures say about the method:
// how busy the machine was, and which observers missed connections.
func (r *report) readingOverhead(vs []variantSummary) string {
	var line string
	if base := find(vs, (none{}).name()); base != nil {
		line = fmt.Sprintf("With nothing attached the machine's CPUs were %.0f%% busy", 100*base.Machine.busyFraction())
		if base.Machine.busyFraction() >= 0.95 {
			line += ", so what an observer uses is taken from the connections or from the machine's other work."
		} else {
			line += fmt.Sprintf(": %.0f%% of the machine's CPU time was idle.", 100*(1-base.Machine.busyFraction()))
		}
	}
	var missing []string
	for _, v := range vs {
		if m := missed(v.OK, v.NAT); m > 0 {
			missing = append(missing, fmt.Sprintf("%s (%d of %d)", v.Name, m, v.OK))
		}
	}
	if len(missing) == 0 {
		return line + " No observer missed a connection."
	}
	return line + " Observers that did not report every connection: " + strings.Join(missing, ", ") +
		"; their CPU per connection is what they cost while reporting only the rest."
}

func (r *report) programsMarkdown(p printer) {
	c := r.programCost()
	p("### 2b. The programs' own cost: the kernel's BPF statistics\n\n")
	if len(c.Programs) == 0 {
		p("No round had BPF statistics.\n\n")
		return
	}
	p("From the %s of **%s** (%d connections). ", plural(c.Rounds, "round"), statsName, c.Conns)
	p("%s ", whereProgramsRun(c.Programs))
	if c.Lost == 0 {
		p("No record was lost in these rounds (the per-hook counters read 0), so no run was cut short by a full ring buffer.\n\n")
	} else {
		p("%d records were lost in these rounds: the ring buffer filled, those runs stopped early, and the figures below under-count.\n\n", c.Lost)
	}
	p("*hooks* are the tracer's hooks (internal/event) whose events the program reports; *µs/conn* is the program's run time per connection.\n\n")
	p("| program | via | hooks | runs | runs/conn | ns/run | µs/conn |\n|---|---|---|---|---|---|---|\n")
	for _, pr := range append(c.Programs, c.total()) {
		p("| %s | %s | %s | %d | %.2f | %.0f | %.3f |\n", pr.Program, pr.Via, pr.Hooks, pr.Runs, c.runsPerConn(pr), nsPerRun(pr), c.usPerConn(pr))
	}
	if s := r.statsCost(); s != "" {
		p("\n%s\n", s)
	}
	p("\nPer round:\n\n| round | connections | program | runs | run time |\n|---|---|---|---|---|\n")
	for _, x := range r.rounds {
		for _, pr := range x.Obs.Programs {
			p("| %d | %d | %s | %d | %s |\n", x.Round, x.Load.OK, pr.Program, pr.Runs, pr.RunTime.Round(time.Microsecond))
		}
	}
	p("\n")
}

// whereProgramsRun says, for the tiers that attached, what makes their
// programs run: the runs below are counted wherever that happens.
func whereProgramsRun(progs []programRun) string {
	var out []string
	seen := map[string]bool{}
	for _, pr := range progs {
		if seen[pr.Via] {
			continue
		}
		seen[pr.Via] = true
		switch pr.Via {
		case event.ViaNetfilter.String():
			out = append(out, "The netfilter-tier programs run in the router namespace only, once per packet at each netfilter hook they are attached to.")
		default:
			out = append(out, fmt.Sprintf("The %s programs run for every hit of their hook on the whole machine, other work on it included, and filter to the router namespace in the kernel.", pr.Via))
		}
	}
	return strings.Join(out, " ")
}

// statsCost compares the kernel side with and without the statistics on,
// against the round-to-round spread with nothing attached.
func (r *report) statsCost() string {
	vs := r.variants()
	st, kern, base := find(vs, statsName), find(vs, kernelName), find(vs, (none{}).name())
	if st == nil || kern == nil || base == nil {
		return ""
	}
	line := fmt.Sprintf("With the statistics on, %.0f conn/s and %.0f µs CPU per connection; without them, %.0f conn/s and %.0f µs",
		st.Rate, st.CPUPerConn(), kern.Rate, kern.CPUPerConn())
	diff := st.CPUPerConn() - kern.CPUPerConn()
	lo, hi := slices.Min(base.RoundCPU), slices.Max(base.RoundCPU)
	if math.Abs(diff) <= hi-lo {
		return line + fmt.Sprintf(": %+.0f µs per connection, within the %.0f µs spread (%.0f to %.0f) of the rounds with nothing attached, so this run does not tell the statistics' own cost from that noise.",
			diff, hi-lo, lo, hi)
	}
	return line + fmt.Sprintf(": %+.0f µs per connection, more than the %.0f µs spread (%.0f to %.0f) of the rounds with nothing attached.", diff, hi-lo, lo, hi)
}

func (r *report) roundsMarkdown(p printer) {
	p("### Raw rounds\n\n| round | observer | ok | failed | seconds | conn/s | NAT seen | lost | CPU s | machine busy | notes |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.rounds {
		p("| %d | %s | %d | %d | %.2f | %.0f | %s | %s | %.2f | %.0f%% | %s |\n", x.Round, x.Variant, x.Load.OK, x.Load.Failed, x.Load.Elapsed.Seconds(),
			x.Load.rate(), counted(x.Obs.NAT), counted(x.Obs.Lost), x.CPU.Seconds(), 100*x.Machine.busyFraction(), x.Obs.Extra)
	}
	p("\n")
}

func (r *report) rampMarkdown(p printer) {
	var workers []string
	for _, s := range r.ramp {
		workers = append(workers, fmt.Sprint(s.Workers))
	}
	p("## 3. Loss as the rate rises\n\n")
	p("The tracer's kernel side (with its drain goroutine) and `conntrack -E -e NEW` attached at the same time, %s per step, ", r.cfg.rampStep)
	p("with %s client workers; counted against the connections the workers completed.\n\n", strings.Join(workers, ", "))
	p("| workers | conn/s | ok | tracer NAT seen | tracer lost (counters) | tracer missed | conntrack -E seen | conntrack -E missed | conntrack -E says |\n|---|---|---|---|---|---|---|---|---|\n")
	top, first := 0.0, ""
	var lost int64
	for _, s := range r.ramp {
		p("| %d | %.0f | %d | %d | %d | %d | %d | %d | %s |\n", s.Workers, s.Load.rate(), s.Load.OK, s.Tracer.NAT, s.Tracer.Lost,
			missed(s.Load.OK, s.Tracer.NAT), s.CT.NAT, missed(s.Load.OK, s.CT.NAT), s.CT.Extra)
		top = max(top, s.Load.rate())
		lost += s.Tracer.lostOrMissed(s.Load)
		if first == "" && missed(s.Load.OK, s.CT.NAT) > 0 {
			first = fmt.Sprintf("%.0f conn/s (%s)", s.Load.rate(), plural(s.Workers, "worker"))
		}
	}
	p("\nHighest rate reached in the ramp: %.0f conn/s. Tracer events lost or missed over the whole ramp: %d. ", top, lost)
	if first != "" {
		p("conntrack -E first missed connections at %s.\n\n", first)
	} else {
		p("conntrack -E missed none.\n\n")
	}
}

// floodMarkdown is the flood ramp: each rate twice, first the kernel side
// with conntrack -E, then the full live pipeline alone.
func (r *report) floodMarkdown(p printer) {
	if len(r.flood) == 0 {
		return
	}
	p("### 3b. One-datagram connections: the flood ramp\n\n")
	p("A TCP connection costs this machine a handshake and a close in three namespaces, so the ramp above ends near %.0f connections/s. ", rampTop(r.ramp))
	p("Here C sends UDP datagrams to VIP:%d from a raw socket, each from a source address and port no earlier one used, so each is a new conntrack entry and a new NAT decision in R (DNAT to S:%d, where a socket that is never read drops them; R's UDP timeout is %s s, its namespace only). ", uport, userveport, floodUDPTimeout)
	p("The connections made are R's DNAT rule's own packet count over the window (`iptables-save -c`), read once it stops rising. ")
	p("Each rate runs twice, %s each: the tracer's kernel side with `conntrack -E -e NEW` attached together, then the full live pipeline (as `tracer trace -o json`, with the default ring buffer of %d MiB) alone, which on its stop reads what the kernel reported before for up to 2 s and counts the rest as lost. ", r.cfg.rampStep, loader.DefaultRingBuffer>>20)
	p("The rate doubles past the listed ones while the kernel side loses nothing and the machine makes 80%% of the rate asked; the full live pipeline's window is left out after its first loss.\n\n")
	p("| asked/s | conn/s | NAT decisions (rule count) | tracer NAT seen | tracer lost | tracer missed | conntrack -E seen | conntrack -E missed | conntrack -E says | live conn/s | live NAT decisions | live NAT seen | live lost | live missed | live says |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.flood {
		p("| %d | %.0f | %d | %d | %d | %d | %d | %d | %s | ", s.Rate, s.Load.rate(), s.Load.OK, s.Tracer.NAT, s.Tracer.Lost, missed(s.Load.OK, s.Tracer.NAT), s.CT.NAT, missed(s.Load.OK, s.CT.NAT), s.CT.Extra)
		if s.LiveLoad.OK == 0 {
			p("- | - | - | - | - | not run: it lost at a lower rate |\n")
			continue
		}
		p("%.0f | %d | %d | %d | %d | %s |\n", s.LiveLoad.rate(), s.LiveLoad.OK, s.Live.NAT, s.Live.Lost, missed(s.LiveLoad.OK, s.Live.NAT), s.Live.Extra)
	}
	got, _ := floodLoss(r.flood)
	p("\n%s.\n\n", upperFirst(got))
}

func rampTop(steps []rampStep) float64 {
	top := 0.0
	for _, s := range steps {
		top = max(top, s.Load.rate())
	}
	return top
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func (r *report) attachMarkdown(p printer) {
	if len(r.attach) == 0 {
		return
	}
	p("## 6. Attach and detach\n\n`loader.Open` of every hook's ladder and `Close`. Netfilter-tier programs attach in the router namespace; the other tiers are kernel-wide and filter to it in the kernel. ")
	p("On this kernel: %s.\n\n", planSummary(r.plan))
	p("| run | attach | detach | total |\n|---|---|---|---|\n")
	for i, a := range r.attach {
		p("| %d | %s | %s | %s |\n", i+1, a.Attach.Round(time.Millisecond), a.Detach.Round(time.Millisecond), (a.Attach + a.Detach).Round(time.Millisecond))
	}
	p("\n`go test -run '^$' -bench AttachDetach ./internal/loader` measures the same with every namespace observed.\n\n")
}

// planSummary lists how each hook attached.
func planSummary(plan loader.Plan) string {
	var on, off []string
	for _, h := range plan {
		if h.Via == event.ViaNone {
			off = append(off, h.Hook.String())
			continue
		}
		on = append(on, fmt.Sprintf("%s via %s", h.Hook, h.Via))
	}
	s := strings.Join(on, ", ")
	if len(off) > 0 {
		s += "; not attached: " + strings.Join(off, ", ")
	}
	return s
}

// mixShapes says what the generated mix is made of, shape by shape.
func mixShapes() string {
	var parts []string
	for i := 0; i < mix.Shapes; {
		j := i
		for j < mix.Shapes && mix.ShapeName(j) == mix.ShapeName(i) {
			j++
		}
		parts = append(parts, fmt.Sprintf("%d × %s", j-i, mix.ShapeName(i)))
		i = j
	}
	return strings.Join(parts, "; ")
}

func (r *report) throughputMarkdown(p printer) {
	snap := mix.Snapshot()
	p("## 4. Userspace throughput\n\n")
	p("A generated mix (`bench/mix`): synthetic events made up by `mix.Generate` in a fixed rotation, not recorded from a node. ")
	p("Per %d flows, %d events: %s. ", mix.Shapes, mix.EventsPerCycle, mixShapes())
	p("Raw ring buffer records laid out as bpf/tracer.h writes them go through `event.Decode` and `join.Joiner` ")
	p("(%s linger, expiry every %s, events %s apart in their own clock) with an `enrich.NodeEnv` of a kube-proxy (IPVS mode) + ",
		join.DefaultLinger, mix.ExpireEvery, throughputGap)
	p("portmap node (rules and ipsets from internal/rules/testdata), %d pods and %d Services, and `trace.Writer` to io.Discard, on one core (GOMAXPROCS=1).\n\n",
		len(snap.Pods), len(snap.Services))
	p("Whole pipeline: **%.0f events/s** (%d events, %d flows in %.1f s). ", r.throughput.Rate, r.throughput.Events, r.throughput.Flows, r.throughput.Seconds)
	p("Its events span %.1f s of their own clock, and a flow is emitted once it has been quiet for the %s linger: %.2f flows per event, where the mix has %.2f (%d per %d).\n\n",
		(time.Duration(r.throughput.Events) * throughputGap).Seconds(), join.DefaultLinger, r.flowsPerEvent(),
		float64(mix.Shapes)/float64(mix.EventsPerCycle), mix.Shapes, mix.EventsPerCycle)
	if len(r.stages) == 0 {
		return
	}
	p("Per stage (`go test -bench`, GOMAXPROCS=1); Enrich, Encode and StoreAppend are per flow, the others per event. ")
	p("StoreAppend (the UI's store) is not part of the pipeline above, which writes flows and keeps none; BenchmarkPipeline is that pipeline under go test:\n\n")
	p("| benchmark | ns/op | rate | B/op | allocs/op |\n|---|---|---|---|---|\n")
	for _, s := range r.stages {
		p("| %s | %.0f | %.0f %s | %.0f | %.0f |\n", s.Name, s.NsOp, s.Metric, s.Unit, s.BytesOp, s.Allocs)
	}
	if r.throughput.Rate > 0 {
		if s := r.stageRelation(1e9 / r.throughput.Rate); s != "" {
			p("\n%s\n", s)
		}
	}
	p("\n")
}

func (r *report) memoryMarkdown(p printer) {
	p("## 5. Memory\n\n")
	p("A fresh process per row holds N flows of the generated mix: open in an `join.Joiner` (no expiry), or finished in a `trace.Store`, each joined and diagnosed as the live pipeline makes it (its own tuples, events, pods and explanation; its rule shared, as the pipeline shares it). ")
	p("Figures after a forced GC and `debug.FreeOSMemory`; base is the same process before the flows (environment built).\n\n")
	p("| flows | held in | VmRSS | HeapInuse | base VmRSS | base HeapInuse | heap per flow | build time |\n|---|---|---|---|---|---|---|---|\n")
	for _, m := range r.memory {
		p("| %d | %s | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB | %.0f B | %.1f s |\n", m.N, m.Kind, mib(m.RSS), mib(m.HeapInuse), mib(m.BaseRSS),
			mib(m.BaseHeap), heapPerFlow(m), m.Seconds)
	}
	if s := r.memoryScaling(); s != "" {
		p("\n%s\n", s)
	}
	p("\n")
	r.feedMarkdown(p)
}

// memoryScaling compares the heap per flow at the smallest and largest
// flow counts of each kind.
func (r *report) memoryScaling() string {
	var parts []string
	for _, kind := range []string{"joiner", "store"} {
		var lo, hi *childResult
		for i := range r.memory {
			m := &r.memory[i]
			if m.Kind != kind {
				continue
			}
			if lo == nil || m.N < lo.N {
				lo = m
			}
			if hi == nil || m.N > hi.N {
				hi = m
			}
		}
		if lo == nil || lo.N == hi.N {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.0f B at %d flows and %.0f B at %d (%s)", kind, heapPerFlow(*lo), lo.N, heapPerFlow(*hi), hi.N,
			pct(heapPerFlow(*hi)/heapPerFlow(*lo))))
	}
	if len(parts) == 0 {
		return ""
	}
	return "Heap per flow: " + strings.Join(parts, "; ") + "."
}
