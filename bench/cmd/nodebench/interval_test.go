package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The interval of 1..5: mean 3, standard error sqrt(2.5/5), t(4) 2.132.
func TestMeanInterval(t *testing.T) {
	iv, ok := meanInterval([]float64{5, 1, 4, 2, 3})
	if !ok || iv.N != 5 || math.Abs(iv.Mean-3) > 1e-9 || math.Abs(iv.Lo-(3-2.132*math.Sqrt(0.5))) > 1e-9 || math.Abs(iv.Hi-(3+2.132*math.Sqrt(0.5))) > 1e-9 {
		t.Errorf("interval of 1..5: %+v, %v; want 3 ± %.4f", iv, ok, 2.132*math.Sqrt(0.5))
	}
	if iv, ok := meanInterval([]float64{7, 7, 7, 7}); !ok || iv.Lo != 7 || iv.Hi != 7 {
		t.Errorf("interval of equal rounds: %+v, %v; want 7 to 7", iv, ok)
	}
	if _, ok := meanInterval([]float64{1, 2}); ok {
		t.Error("two rounds gave an interval")
	}
}

// liveRounds are the rounds of make bench at 9910fc5 (BENCHMARKS.md, raw
// rounds): connections and CPU seconds of nothing attached and of the
// full live pipeline, round by round.
func liveRounds() *report {
	r := &report{cfg: config{rounds: 6, round: 5 * time.Second}}
	for i, x := range []struct {
		noneOK, liveOK   uint64
		noneCPU, liveCPU float64
	}{{34959, 32631, 6.54, 6.74}, {34537, 35616, 6.51, 6.71}, {37876, 35498, 6.55, 6.65},
		{39526, 33153, 6.59, 6.75}, {37599, 32980, 6.56, 6.75}, {39082, 34426, 6.53, 6.73}} {
		for _, v := range []struct {
			name string
			ok   uint64
			cpu  float64
		}{{"none", x.noneOK, x.noneCPU}, {(&fullLive{}).name(), x.liveOK, x.liveCPU}} {
			r.rounds = append(r.rounds, roundResult{Round: i + 1, Variant: v.name, Load: load{OK: v.ok, Elapsed: 5 * time.Second},
				CPU: time.Duration(v.cpu * float64(time.Second))})
		}
	}
	return r
}

// On that run's rounds the full live pipeline's CPU decides "missed" (the
// whole interval is above 10 µs), its connection rate does not (the
// interval reaches below 5%), so the verdict stands as missed, with both
// intervals shown. Figures worked out by hand from the rows: added CPU per
// round 19.4, -0.1, 14.4, 36.9, 30.3, 28.4 µs; fewer conn/s 6.7, -3.1,
// 6.3, 16.1, 12.3, 11.9%.
func TestOverheadIntervalsOfARun(t *testing.T) {
	vs := liveRounds().variants()
	live := find(vs, (&fullLive{}).name())
	iv, ok := live.overheadIntervals()
	if !ok {
		t.Fatal("no intervals from 6 rounds")
	}
	if math.Abs(iv.added.Mean-21.6) > 0.2 || iv.added.Lo < 10 || iv.added.Lo > 12 {
		t.Errorf("added CPU: %+v; want a mean of 21.6 µs and a low end just above 10", iv.added)
	}
	if math.Abs(iv.fewer.Mean-8.4) > 0.2 || iv.fewer.Lo > 5 || iv.fewer.Hi < 5 {
		t.Errorf("fewer conn/s: %+v; want a mean of 8.4%% and an interval across 5%%", iv.fewer)
	}
	if decided, met := iv.decides(5, 10); !decided || met {
		t.Errorf("decides(5%%, 10 µs) = %v, %v; want decided, missed (by CPU)", decided, met)
	}
	if decided, _ := iv.decides(5, 40); decided {
		t.Error("decides(5%, 40 µs) decided; the rate interval reaches both sides of 5%")
	}
}

// The verdict says when a run does not decide its target: here the same
// rounds against a CPU goal the interval straddles.
func TestOverheadVerdictUndecided(t *testing.T) {
	r := liveRounds()
	var got target
	for _, x := range r.targets() {
		if x.What == "overhead, "+(&fullLive{}).name() {
			got = x
		}
	}
	if !strings.HasPrefix(got.Verdict, "missed") || strings.Contains(got.Verdict, "not decided") {
		t.Errorf("verdict %q; want missed, decided by the CPU interval", got.Verdict)
	}
	if !strings.Contains(got.Got, "90% interval of the mean of 6 rounds") {
		t.Errorf("figures %q; want the rounds' intervals", got.Got)
	}
	// Halve every round's added CPU: the mean drops to 10.8 µs and the
	// interval reaches below 10.
	for i := range r.rounds {
		if x := &r.rounds[i]; x.Variant != "none" {
			base := r.rounds[i-1]
			if base.Variant != "none" || base.Round != x.Round {
				t.Fatal("rounds out of order")
			}
			perConn := cpuPerConn(base) + (cpuPerConn(*x)-cpuPerConn(base))/2
			x.CPU = time.Duration(perConn * float64(x.Load.OK) * float64(time.Microsecond))
		}
	}
	for _, x := range r.targets() {
		if x.What == "overhead, "+(&fullLive{}).name() && !strings.Contains(x.Verdict, "not decided by this run") {
			t.Errorf("halved: verdict %q, figures %q; want not decided", x.Verdict, x.Got)
		}
	}
}
