package main

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/loader"
)

// guestOf is a guest's figures made up for the test: the rounds of the
// observers a guest runs, taken from fakeReport, and an fentry plan.
func guestOf(t *testing.T) guestResult {
	t.Helper()
	r := fakeReport(100000)
	var rounds []roundResult
	for _, x := range r.rounds {
		if slices.Contains([]string{"none", kernelName, statsName, (&fullLive{}).name()}, x.Variant) {
			rounds = append(rounds, x)
		}
	}
	r.rounds = rounds
	r.machine = machine{Kernel: "6.12.117+deb12-amd64", Cores: 2}
	r.started, r.ended = time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 20, 1, 30, 0, time.UTC)
	r.plan = loader.Plan{
		{Hook: event.HookNFNat, Via: event.ViaFentry, Target: "nf_nat_setup_info", Program: "tr_nat_fexit"},
		{Hook: event.HookIPVSConnNew, Via: event.ViaNone},
		{Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Target: "skb/kfree_skb", Program: "tr_drop_tp3"},
	}
	return r.guestResult()
}

// What a guest writes, the host reads back unchanged.
func TestGuestResultRoundTrip(t *testing.T) {
	g := guestOf(t)
	path := filepath.Join(t.TempDir(), guestResultFile)
	if err := writeGuestResult(path, g); err != nil {
		t.Fatal(err)
	}
	back, err := readGuestResult(path)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Started.Equal(g.Started) || !back.Ended.Equal(g.Ended) {
		t.Errorf("times read back %v-%v, wrote %v-%v", back.Started, back.Ended, g.Started, g.Ended)
	}
	back.Started, back.Ended = g.Started, g.Ended
	if !reflect.DeepEqual(back, g) {
		t.Errorf("read back\n%+v\nwrote\n%+v", back, g)
	}
	if len(back.Results) != 8 || len(back.Results[2].Obs.Programs) != 2 || back.Plan[0].Via != "fentry" {
		t.Errorf("read back %d rounds, programs %v, plan %v", len(back.Results), back.Results[2].Obs.Programs, back.Plan)
	}
	if _, err := readGuestResult(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("reading a missing results file did not fail")
	}
}

// Section 7 and its Targets row come from the guests' figures: the tier
// per hook, the ratios, the programs' statistics, and the kernels that
// were not measured with the reason.
func TestVMMarkdownFromFigures(t *testing.T) {
	g := guestOf(t)
	r := fakeReport(100000)
	r.cfg.vm = vmConfig{kernels: []string{"6.12", "5.10"}, rounds: 2, round: 3 * time.Second, observers: "none,kernel,stats,live"}
	kp := g
	kp.Only = "kprobe,tracepoint"
	r.vm = []vmKernel{{Series: "6.12", Result: &g, Took: 95 * time.Second}, {Series: "5.10", Err: "vmrun: exit status 1"},
		{Series: "6.12", Only: kp.Only, Result: &kp}}
	md := r.markdown()
	for _, bad := range []string{"%!", "NaN", "+Inf"} {
		if strings.Contains(md, bad) {
			t.Errorf("report contains %q", bad)
		}
	}
	for _, want := range []string{
		"## 7. The kprobe and fentry tiers under emulation (QEMU TCG)",
		"**Every figure in this section is measured under emulation (QEMU TCG, no KVM): ratios only.**",
		"### Kernel 6.12 (6.12.117+deb12-amd64): fentry + tracepoint",
		"| nf_nat_setup_info | fentry | nf_nat_setup_info | tr_nat_fexit |",
		"| ip_vs_conn_new | none | - | - |",
		// kernel side: 70300 connections to none's 80300 over the same time
		"| tracer (kernel side + drain) | 0.875 | 0.875 | -12.5% | 70300 | 0 | 0 | +20 |",
		"| tr_nf_dnat | netfilter | nf_nat_setup_info | 546400 | 8.00 | 380 | 3.040 | 84% |",
		"| all programs | - | - | 614700 | 9.00 | 404 | 3.640 | 100% |",
		"vmrun took 1m35s (waiting for the VM lock, boot and power-off included)",
		// none: 100 µs CPU per connection, programs 3.64 µs
		"The programs ran 3.6 µs per connection, 3.6% of the 100 µs CPU per connection of the rounds with nothing attached",
		// none: 40100 and 40200 connections in 5 s rounds, mean 8030 conn/s
		"With nothing attached, conn/s ranged from 100% to 100% of its mean between rounds",
		"### Kernel 5.10: not measured\n\nvmrun: exit status 1.",
		"### Kernel 6.12 (6.12.117+deb12-amd64), tiers limited to kprobe, tracepoint: fentry + tracepoint",
		`-json /vmresults/nodebench.json -only "kprobe,tracepoint"`,
		"| kprobe and fentry tiers, QEMU guests | each kernel's ratios to none, measured under emulation (QEMU TCG, no KVM) | 6.12 (fentry + tracepoint): kernel side -12.5% conn/s, full live pipeline -49.8% conn/s; 6.12, tiers limited to kprobe, tracepoint (fentry + tracepoint): kernel side -12.5% conn/s, full live pipeline -49.8% conn/s | measured, emulated (section 7); not measured: 5.10 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	r.vm = nil
	if md := r.markdown(); strings.Contains(md, "## 7.") || strings.Contains(md, "QEMU guests") {
		t.Error("a run without -vm has a section 7 or a guests' target")
	}
}

// A guest whose kernel side could not run says why, and is no figure.
func TestVMMarkdownSkippedGuest(t *testing.T) {
	r := fakeReport(100000)
	r.vm = []vmKernel{{Series: "6.1", Result: &guestResult{Kernel: "6.1.0-57-amd64", Skipped: "kernel side unavailable: no BTF"}}}
	md := r.markdown()
	if !strings.Contains(md, "### Kernel 6.1 (6.1.0-57-amd64): not measured\n\nkernel side unavailable: no BTF.") {
		t.Error("the skipped guest's reason is missing")
	}
	if !strings.Contains(md, "| no guest measured | not measured: 6.1 |") {
		t.Error("the Targets row does not say the guest was not measured")
	}
}

// The guest's command line quotes what a shell would split or drop.
func TestGuestCommand(t *testing.T) {
	cfg := vmConfig{rounds: 3, round: 3 * time.Second, observers: "none,kernel"}
	c := guestCommand(cfg, "6.12", "")
	want := `-kernels 6.12 -- /tmp/nodebench -rounds 3 -round 3s -observers "none,kernel" -ramp "" -flood "" -drops "" -attach 1 -idle 0 -userside=false -out "" -json /vmresults/nodebench.json`
	if !strings.HasSuffix(c, want) {
		t.Errorf("guestCommand = %s\nwant it to end in %s", c, want)
	}
	if c := guestCommand(cfg, "6.12", "kprobe,tracepoint"); !strings.HasSuffix(c, want+` -only "kprobe,tracepoint"`) {
		t.Errorf("guestCommand with tiers = %s", c)
	}
}

// A -vm entry names a series and, after a colon, the tiers joined by +.
func TestVMEntryAndTiers(t *testing.T) {
	series, only := vmEntry("6.12:kprobe+tracepoint+netfilter")
	if series != "6.12" || only != "kprobe,tracepoint,netfilter" {
		t.Errorf("vmEntry = %q, %q", series, only)
	}
	if series, only := vmEntry("5.10"); series != "5.10" || only != "" {
		t.Errorf("vmEntry(5.10) = %q, %q", series, only)
	}
	vs, err := parseTiers(only)
	if err != nil || !reflect.DeepEqual(vs, []event.Via{event.ViaKprobe, event.ViaTracepoint, event.ViaNetfilter}) || tierList(vs) != only {
		t.Errorf("parseTiers(%q) = %v, %v", only, vs, err)
	}
	if _, err := parseTiers("kprobe,ebpf"); err == nil {
		t.Error("an unknown tier is accepted")
	}
}

// The spread of the rounds with nothing attached is computed from their
// rates, and needs two of them.
func TestBaseSpread(t *testing.T) {
	vs := []variantSummary{{Name: "none", Rate: 100, RoundRates: []float64{80, 120, 100}}}
	if got := baseSpread(vs); !strings.Contains(got, "from 80% to 120% of its mean") {
		t.Errorf("baseSpread = %q", got)
	}
	vs[0].RoundRates = vs[0].RoundRates[:1]
	if got := baseSpread(vs); got != "" {
		t.Errorf("one round gives a spread: %q", got)
	}
}
