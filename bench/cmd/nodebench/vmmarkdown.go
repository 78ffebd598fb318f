package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
)

// emulationLabel says, wherever a guest's figure is shown, what it is.
const emulationLabel = "measured under emulation (QEMU TCG, no KVM)"

// vmMarkdown is section 7: the overhead rounds in each guest, with the
// tiers the kernel allowed.
func (r *report) vmMarkdown(p printer) {
	if len(r.vm) == 0 {
		return
	}
	cfg := r.cfg.vm
	p("## 7. The kprobe and fentry tiers under emulation (QEMU TCG)\n\n")
	p("**Every figure in this section is %s: ratios only.** ", emulationLabel)
	p("This host's kernel has neither kprobes nor fentry, so the tiers production kernels use are measured in QEMU guests of Debian's kernels (tests/vm, `vmrun` command mode, 2 vCPUs, 2 GiB), ")
	p("each running this nodebench binary with the overhead rounds of section 1-2 only: %s of %s per observer, rotated, observers %s. ",
		plural(cfg.rounds, "round"), cfg.round, strings.ReplaceAll(cfg.observers, ",", ", "))
	p("Under TCG every instruction, the BPF programs' JIT output included, is emulated, so conn/s, CPU µs and ns per run are many times those of real hardware and are not comparable with sections 1-2 or between kernels; ")
	p("what compares is the ratio of each observer to the same guest's rounds with nothing attached, and each program's share of the CPU per connection. ")
	p("The guests also run on this host's CPUs while it does other work (the load average above).\n\n")
	for _, k := range r.vm {
		vmKernelMarkdown(p, k, cfg)
	}
}

func vmKernelMarkdown(p printer, k vmKernel, cfg vmConfig) {
	if k.Result == nil {
		p("### Kernel %s: not measured\n\n%s.\n\n", k.Series, k.Err)
		return
	}
	g := k.Result
	if g.Skipped != "" {
		p("### Kernel %s (%s): not measured\n\n%s.\n\n", k.Series, g.Kernel, g.Skipped)
		return
	}
	p("### Kernel %s (%s)%s: %s\n\n", k.Series, g.Kernel, restricted(g.Only), tierNames(g.Plan))
	p("vmrun took %s (waiting for the VM lock, boot and power-off included), load average in the guest %s at the start and %s at the end. Rerun: `%s`.\n\n",
		k.Took.Round(time.Second), g.LoadStart, g.LoadEnd, guestCommand(cfg, k.Series, k.Only))
	p("| hook | tier | attached to | program |\n|---|---|---|---|\n")
	for _, h := range g.Plan {
		p("| %s | %s | %s | %s |\n", h.Hook, h.Via, orDash(h.Target), orDash(h.Program))
	}
	sub := g.asReport()
	vs := sub.variants()
	p("\n| observer | ratio to none | median ratio | conn/s change | NAT seen | missed | lost | +µs CPU/conn (emulated) |\n|---|---|---|---|---|---|---|---|\n")
	for _, v := range vs {
		p("| %s | %.3f | %.3f | %s | %s | %s | %s | %s |\n", v.Name, v.Ratio, v.MedianRatio, pct(v.Ratio),
			counted(v.NAT), counted(missed(v.OK, v.NAT)), counted(v.Lost), extraCPU(v, vs[0]))
	}
	if s := baseSpread(vs); s != "" {
		p("\n%s\n", s)
	}
	c := sub.programCost()
	if len(c.Programs) == 0 {
		p("\nNo round had BPF statistics.\n\n")
		return
	}
	p("\nBPF statistics (%s of **%s**, %d connections; ns and µs emulated). %s\n\n", plural(c.Rounds, "round"), statsName, c.Conns, whereProgramsRun(c.Programs))
	p("| program | via | hooks | runs | runs/conn | ns/run | µs/conn | share of all programs |\n|---|---|---|---|---|---|---|---|\n")
	all := c.total()
	for _, pr := range append(c.Programs, all) {
		p("| %s | %s | %s | %d | %.2f | %.0f | %.3f | %s |\n", pr.Program, orDash(pr.Via), orDash(pr.Hooks), pr.Runs, c.runsPerConn(pr), nsPerRun(pr),
			c.usPerConn(pr), share(pr, all))
	}
	if base := find(vs, (none{}).name()); base != nil && base.CPUPerConn() > 0 {
		p("\nThe programs ran %.1f µs per connection, %.1f%% of the %.0f µs CPU per connection of the rounds with nothing attached (both emulated: the share is the figure).\n",
			c.usPerConn(all), 100*c.usPerConn(all)/base.CPUPerConn(), base.CPUPerConn())
	}
	p("\n")
}

// tierNames lists the tiers that attached, kprobe and fentry first.
func tierNames(plan []hookTier) string {
	var vias []string
	for _, h := range plan {
		if h.Via != event.ViaNone.String() && !slices.Contains(vias, h.Via) {
			vias = append(vias, h.Via)
		}
	}
	rank := func(v string) int {
		if i := slices.Index([]string{event.ViaFentry.String(), event.ViaKprobe.String()}, v); i >= 0 {
			return i
		}
		return 2
	}
	slices.SortStableFunc(vias, func(a, b string) int { return rank(a) - rank(b) })
	if len(vias) == 0 {
		return "nothing attached"
	}
	return strings.Join(vias, " + ")
}

func share(p, all programRun) string {
	if all.RunTime <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(p.RunTime)/float64(all.RunTime))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// vmTarget is the Targets row of the guests: what each kernel's tiers cost
// as ratios, or why a kernel was not measured. ok is false without -vm.
func (r *report) vmTarget() (target, bool) {
	if len(r.vm) == 0 {
		return target{}, false
	}
	t := target{What: "kprobe and fentry tiers, QEMU guests", Goal: "each kernel's ratios to none, " + emulationLabel}
	var got, failed []string
	for _, k := range r.vm {
		if k.Result == nil || k.Result.Skipped != "" {
			failed = append(failed, k.Series)
			continue
		}
		vs := k.Result.asReport().variants()
		var parts []string
		for _, o := range []struct{ name, label string }{{kernelName, "kernel side"}, {(&fullLive{}).name(), "full live pipeline"}} {
			if v := find(vs, o.name); v != nil {
				parts = append(parts, fmt.Sprintf("%s %s conn/s", o.label, pct(v.Ratio)))
			}
		}
		got = append(got, fmt.Sprintf("%s%s (%s): %s", k.Series, restricted(k.Result.Only), tierNames(k.Result.Plan), strings.Join(parts, ", ")))
	}
	t.Got = strings.Join(got, "; ")
	switch {
	case len(failed) == 0:
		t.Verdict = "measured, emulated (section 7)"
	case len(got) == 0:
		t.Got, t.Verdict = "no guest measured", "not measured: "+strings.Join(failed, ", ")
	default:
		t.Verdict = "measured, emulated (section 7); not measured: " + strings.Join(failed, ", ")
	}
	return t, true
}

// baseSpread says how far apart the rounds with nothing attached were: a
// ratio inside that spread is not told from the guest's noise.
func baseSpread(vs []variantSummary) string {
	base := find(vs, (none{}).name())
	if base == nil || len(base.RoundRates) < 2 || base.Rate <= 0 {
		return ""
	}
	lo, hi := slices.Min(base.RoundRates), slices.Max(base.RoundRates)
	return fmt.Sprintf("With nothing attached, conn/s ranged from %.0f%% to %.0f%% of its mean between rounds: an observer's ratio inside that spread is not told from the guest's noise.",
		100*lo/base.Rate, 100*hi/base.Rate)
}

// restricted names the tiers a guest's tracer was limited to, if it was.
func restricted(only string) string {
	if only == "" {
		return ""
	}
	return ", tiers limited to " + strings.ReplaceAll(only, ",", ", ")
}
