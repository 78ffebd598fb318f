package main

import (
	"fmt"
	"runtime"
	"strings"
	"time"
)

// markdown is BENCHMARKS.md: machine, commands, every raw figure, the
// ratios, and the targets with what limits the missed ones.
func (r *report) markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# Benchmarks\n\n")
	p("Written by `make bench` (`go run ./bench/cmd/nodebench`); rerun it rather than editing this file. ")
	p("Every figure below is from the run described here, on this machine, with other work running on it ")
	p("(the load average is part of the result).\n\n")

	p("## Machine\n\n| | |\n|---|---|\n")
	p("| CPU | %s |\n| cores | %d |\n| memory | %s |\n| kernel | %s |\n| Go | %s |\n", r.machine.CPU, r.machine.Cores,
		r.machine.Memory, r.machine.Kernel, runtime.Version())
	p("| run | %s, %s |\n", r.started.UTC().Format("2006-01-02 15:04 MST"), r.ended.Sub(r.started).Round(time.Second))
	p("| load average (1, 5, 15 min) | %s at the start, %s at the end |\n\n", r.loadStart, r.loadEnd)

	p("## Commands\n\n```\nsudo make bench\n")
	for _, c := range r.commands {
		p("%s\n", c)
	}
	p("```\n\n")

	p("## Targets\n\n| what | target | result | verdict |\n|---|---|---|---|\n")
	for _, t := range r.targets() {
		p("| %s | %s | %s | %s |\n", t.What, t.Goal, t.Got, t.Verdict)
	}
	p("\n")
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
		r.kernelMarkdown(p)
	}
	r.userMarkdown(p)
	return b.String()
}

func (r *report) kernelMarkdown(p func(string, ...any)) {
	cfg := r.cfg
	p("## 1-2. Cost on the node: the tracer, conntrack -E and nft tracing\n\n")
	p("Three throwaway network namespaces: client `%s` -> router (`iptables -t nat -A PREROUTING -d %s -p tcp --dport %d -j DNAT --to-destination %s:%d`) -> server `%s`. ",
		cAddr, vip, vport, sAddr, sport, sAddr)
	p("%d client workers, each on a thread in the client namespace, make short-lived connections to %s:%d ", cfg.workers, vip, vport)
	p("(connect, read the one byte the Go server in the server namespace writes, close) as fast as they can. ")
	p("%d rounds of %s per observer, the observers rotated every round so none always follows another; ", cfg.rounds, cfg.round)
	p("conn/s is the successful connections over the whole time, ratio is that over the rate with nothing attached, ")
	p("median is the median over rounds of the ratio to the same round's run with nothing attached. ")
	p("Observers (all in the router namespace only):\n\n")
	p("- **tracer (kernel side + drain)**: `loader.Open` observing the router namespace, a goroutine decoding every ring buffer record.\n")
	p("- **tracer (full live pipeline)**: `live.Start` + `Run` on the router namespace (kernel side, conntrack tracking, node watcher, join, rule attribution, diagnosis), flows written as NDJSON by `trace.Writer` to io.Discard, as `tracer trace -o json` does.\n")
	p("- **conntrack -E -e NEW**: `ip netns exec ROUTER conntrack -E -e NEW`, its lines with the VIP as original destination and the server in the reply counted.\n")
	if cfg.diagnostic {
		p("- **diagnostic: attached, not read**: `loader.Open` as above, the ring buffer never read (it fills after about 20,000 events, then the kernel side counts them lost): the programs' own cost.\n")
		p("- **diagnostic: drained every 50 ms**: as the tracer's kernel side, but the reader sleeps 50 ms after each wait, so it is woken for batches rather than for every event.\n")
	}
	p("- **nft monitor trace**: a `prerouting` chain at priority -350 with `ip daddr %s tcp dport %d meta nftrace set 1`, and `nft monitor trace`; the NAT decision is the trace line of the nat table's `PREROUTING` rule that says `dnat to` (iptables is nf_tables-backed here).\n\n", vip, vport)
	p("*NAT seen* is the NAT decisions of the lab's connections the observer reported, *missed* the successful connections it did not report, ")
	p("*lost* what it says it lost itself (the tracer's per-hook ring buffer counters), *ev/conn* all tracer events per connection, ")
	p("*CPU µs/c* the CPU time of the benchmark process and its children (load generator, server, observer) per connection, *+µs/conn* what the observer adds to that.\n\n")
	vs := r.variants()
	p("| observer | conn/s | ratio | median ratio | conn/s change | NAT seen | missed | lost | ev/conn | CPU µs/conn | +µs/conn |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, v := range vs {
		p("| %s | %.0f | %.3f | %.3f | %s | %s | %s | %s | %s | %.0f | %s |\n", v.Name, v.Rate, v.Ratio, v.MedianRatio, pct(v.Ratio),
			counted(v.NAT), counted(missed(v.OK, v.NAT)), counted(v.Lost), perConn(v.Events, v.OK), v.CPUPerConn(), extraCPU(v, vs[0]))
	}
	p("\nReading these figures: the workers saturate both cores, so conn/s measures the share of the machine left to the connections. ")
	p("An observer that is a separate process (conntrack, nft) is scheduled as one more task against everything else on the machine ")
	p("and, with other work running (see the load average), takes part of its CPU from that work rather than from the connections; ")
	p("the CPU per connection (this process and its children) does not depend on that and is the fairer comparison of cost. ")
	p("An observer that falls behind and drops what it cannot handle (nft monitor trace here) also looks cheaper than it would be if it kept up.\n")
	p("\nRaw rounds:\n\n| round | observer | ok | failed | seconds | conn/s | NAT seen | lost | CPU s | notes |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.rounds {
		p("| %d | %s | %d | %d | %.2f | %.0f | %s | %s | %.2f | %s |\n", x.Round, x.Variant, x.Load.OK, x.Load.Failed, x.Load.Elapsed.Seconds(),
			x.Load.rate(), counted(x.Obs.NAT), counted(x.Obs.Lost), x.CPU.Seconds(), x.Obs.Extra)
	}
	p("\n## 3. Loss as the rate rises\n\n")
	p("The tracer's kernel side (with its drain goroutine) and `conntrack -E -e NEW` attached at the same time, %s per step, ", cfg.rampStep)
	p("the client worker count doubling; counted against the connections the workers completed.\n\n")
	p("| workers | conn/s | ok | tracer NAT seen | tracer lost (counters) | tracer missed | conntrack -E seen | conntrack -E missed | conntrack -E says |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.ramp {
		p("| %d | %.0f | %d | %d | %d | %d | %d | %d | %s |\n", s.Workers, s.Load.rate(), s.Load.OK, s.Tracer.NAT, s.Tracer.Lost,
			missed(s.Load.OK, s.Tracer.NAT), s.CT.NAT, missed(s.Load.OK, s.CT.NAT), s.CT.Extra)
	}
	top := 0.0
	first := ""
	var lost int64
	for _, s := range r.ramp {
		top = max(top, s.Load.rate())
		lost += s.Tracer.Lost + missed(s.Load.OK, s.Tracer.NAT)
		if first == "" && missed(s.Load.OK, s.CT.NAT) > 0 {
			first = fmt.Sprintf("%.0f conn/s (%d workers)", s.Load.rate(), s.Workers)
		}
	}
	p("\nHighest rate reached on this machine: %.0f conn/s. Tracer events lost or missed over the whole ramp: %d. ", top, lost)
	if first != "" {
		p("conntrack -E first missed connections at %s.\n\n", first)
	} else {
		p("conntrack -E missed none.\n\n")
	}
	if len(r.attach) > 0 {
		p("## 6. Attach and detach\n\n`loader.Open` (every hook of the ladder, netfilter programs in the router namespace, kernel-wide raw tracepoints filtered to it) and `Close`:\n\n")
		p("| run | attach | detach | total |\n|---|---|---|---|\n")
		for i, a := range r.attach {
			p("| %d | %s | %s | %s |\n", i+1, a.Attach.Round(time.Millisecond), a.Detach.Round(time.Millisecond), (a.Attach + a.Detach).Round(time.Millisecond))
		}
		p("\n`go test -run '^$' -bench AttachDetach ./internal/loader` measures the same for every namespace.\n\n")
	}
}

func (r *report) userMarkdown(p func(string, ...any)) {
	p("## 4. Userspace throughput\n\n")
	p("A recorded mix (`bench/mix`): per 10 flows, 4 DNATs to a hostPort with their reply, 2 hostPort-hijack DNATs, 1 DNAT+SNAT, ")
	p("1 ping rejected by KUBE-IPVS-FILTER (reject + drop), 1 REJECT (reject + drop), 1 stack reset: 13 events. ")
	p("Raw ring buffer records laid out as bpf/tracer.h writes them go through `event.Decode`, `Event.Record`, `enrich.Joiner` ")
	p("(1.5 s linger, expiry every 100 ms, events 10 µs apart in their own clock) with an `enrich.NodeEnv` of a kube-proxy (IPVS mode) + ")
	p("portmap node (internal/rules/testdata), 603 pods and 62 Services, and `trace.Writer` to io.Discard, on one core (GOMAXPROCS=1).\n\n")
	p("Whole pipeline: **%.0f events/s** (%d events, %d flows in %.1f s).\n\n", r.throughput.Rate, r.throughput.Events, r.throughput.Flows, r.throughput.Seconds)
	if len(r.stages) > 0 {
		p("Per stage (`go test -bench`, GOMAXPROCS=1); Enrich, Encode and StoreAppend are per flow:\n\n| benchmark | ns/op | rate | B/op | allocs/op |\n|---|---|---|---|---|\n")
		for _, s := range r.stages {
			p("| %s | %.0f | %.0f %s | %.0f | %.0f |\n", s.Name, s.NsOp, s.Metric, s.Unit, s.BytesOp, s.Allocs)
		}
		p("\n")
	}
	p("## 5. Memory\n\n")
	p("A fresh process per row holds N flows of the mix: open in an `enrich.Joiner` (no expiry), or finished and diagnosed in a `trace.Store`. ")
	p("Figures after a forced GC and `debug.FreeOSMemory`; base is the same process before the flows (environment built). ")
	p("Memory grows linearly in both, so any split of N flows between the joiner and the store needs at most the larger of the two rows.\n\n")
	p("| flows | held in | VmRSS | HeapInuse | base VmRSS | base HeapInuse | heap per flow | build time |\n|---|---|---|---|---|---|---|---|\n")
	for _, m := range r.memory {
		p("| %d | %s | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB | %.0f B | %.1f s |\n", m.N, m.Kind, mib(m.RSS), mib(m.HeapInuse), mib(m.BaseRSS),
			mib(m.BaseHeap), float64(m.HeapInuse-min(m.BaseHeap, m.HeapInuse))/float64(max(m.N, 1)), m.Seconds)
	}
	p("\n")
	if len(r.notes) > 0 {
		p("## Notes\n\n")
		for _, n := range r.notes {
			p("- %s\n", n)
		}
	}
}
