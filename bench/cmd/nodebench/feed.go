package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/trace"
)

// feedSample is the UI's store at one moment of a synthetic feed.
type feedSample struct {
	Minute    int    `json:"minute"` // of the feed's own clock
	Seen      int    `json:"seen"`
	Retained  int    `json:"retained"`
	Evicted   int    `json:"evicted"`
	Estimate  int64  `json:"estimate"` // the store's own, which its memory cap bounds
	HeapInuse uint64 `json:"heap_inuse"`
	RSS       uint64 `json:"rss"`
}

// feedSpec is a feed of rate flows per second for minutes, on the feed's
// own clock: "RATE:MINUTES".
type feedSpec struct{ rate, minutes int }

func parseFeed(s string) (feedSpec, error) {
	r, m, ok := strings.Cut(s, ":")
	rate, err1 := strconv.Atoi(r)
	minutes, err2 := strconv.Atoi(m)
	if !ok || err1 != nil || err2 != nil || rate <= 0 || minutes <= 0 {
		return feedSpec{}, fmt.Errorf("feed %q: want RATE:MINUTES, both positive", s)
	}
	return feedSpec{rate, minutes}, nil
}

// feedEvery is how often, on the feed's clock, the store is sampled.
const feedEvery = 5

// feed appends the generated mix's flows, joined and diagnosed as the live
// pipeline makes them (mixSource), to a store with the default caps at
// spec.rate per second of a fake clock, and samples the store after the
// first minute and every feedEvery minutes: the resident size must stop
// growing once the caps bind.
func feed(spec feedSpec) (childResult, error) {
	src, err := newMixSource()
	if err != nil {
		return childResult{}, err
	}
	baseRSS, baseHeap := measure()
	store := trace.NewCappedStore(trace.DefaultCaps)
	t0 := mix.Clock.BootWall
	perMinute := spec.rate * 60
	start := time.Now()
	var samples []feedSample
	i := 0
	for minute := 1; minute <= spec.minutes; minute++ {
		for ; i < minute*perMinute; i++ {
			at := t0.Add(time.Duration(i) * time.Second / time.Duration(spec.rate))
			fs, err := src.flows(i, at)
			if err != nil {
				return childResult{}, err
			}
			for _, f := range fs {
				store.Append(f)
			}
		}
		if minute == 1 || minute%feedEvery == 0 {
			samples = append(samples, sampleStore(store, minute))
		}
	}
	if path := os.Getenv("NODEBENCH_HEAPPROFILE"); path != "" {
		if err := writeHeapProfile(path); err != nil {
			return childResult{}, err
		}
	}
	runtime.KeepAlive(store)
	return childResult{Kind: "feed", N: store.Len(), BaseRSS: baseRSS, BaseHeap: baseHeap, Rate: float64(spec.rate),
		Seconds: time.Since(start).Seconds(), Samples: samples}, nil
}

func sampleStore(s *trace.Store, minute int) feedSample {
	rss, heap := measure()
	ev := s.Eviction()
	return feedSample{Minute: minute, Seen: s.Len(), Retained: s.Retained(), Evicted: ev.Evicted, Estimate: s.Memory(), HeapInuse: heap, RSS: rss}
}

// feedMarkdown is the subsection of section 5 on the store under a long
// feed: its samples, and how far apart they are once the caps bind.
func (r *report) feedMarkdown(p printer) {
	f := r.feed
	if len(f.Samples) == 0 {
		return
	}
	last := f.Samples[len(f.Samples)-1]
	p("### The UI's store under a %d-minute feed\n\n", last.Minute)
	p("A fresh process appends the mix's flows, each joined and diagnosed as the live pipeline makes it (its own tuples, events, pods and explanation), to a `trace.Store` with the default caps "+
		"(%d flows, %.0f MiB) at %.0f flows per second of a fake clock: %d flows in %.0f s. ", trace.DefaultCaps.Flows, mib(uint64(trace.DefaultCaps.Memory)),
		f.Rate, f.N, f.Seconds)
	p("Sampled after the first minute and every %d minutes, after a forced GC and `debug.FreeOSMemory`; base is the process before the flows "+
		"(VmRSS %.1f MiB, HeapInuse %.1f MiB). The estimate is the store's own, which `--max-memory` bounds.\n\n", feedEvery, mib(f.BaseRSS), mib(f.BaseHeap))
	p("| minute | flows seen | retained | evicted | store estimate | HeapInuse | VmRSS | HeapInuse over base / estimate |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range f.Samples {
		p("| %d | %d | %d | %d | %.1f MiB | %.1f MiB | %.1f MiB | %.2f |\n", s.Minute, s.Seen, s.Retained, s.Evicted, mib(uint64(s.Estimate)),
			mib(s.HeapInuse), mib(s.RSS), heapOverEstimate(s, f.BaseHeap))
	}
	if s := feedFlatness(f); s != "" {
		p("\n%s\n", s)
	}
	p("\n")
}

func heapOverEstimate(s feedSample, base uint64) float64 {
	return (float64(s.HeapInuse) - float64(base)) / float64(max(s.Estimate, 1))
}

// feedFlatness compares the samples taken once the store evicts: the
// lowest and highest heap and resident set among them.
func feedFlatness(f childResult) string {
	var full []feedSample
	for _, s := range f.Samples {
		if s.Evicted > 0 {
			full = append(full, s)
		}
	}
	if len(full) < 2 {
		return ""
	}
	lo, hi := full[0], full[0]
	rlo, rhi := full[0].RSS, full[0].RSS
	for _, s := range full {
		if s.HeapInuse < lo.HeapInuse {
			lo = s
		}
		if s.HeapInuse > hi.HeapInuse {
			hi = s
		}
		rlo, rhi = min(rlo, s.RSS), max(rhi, s.RSS)
	}
	return fmt.Sprintf("Once the store evicts (minute %d on, %d samples), HeapInuse stays between %.1f MiB (minute %d) and %.1f MiB (minute %d), the highest %s over the lowest, "+
		"and VmRSS between %.1f and %.1f MiB (%s); the store retains %d flows at the end.",
		full[0].Minute, len(full), mib(lo.HeapInuse), lo.Minute, mib(hi.HeapInuse), hi.Minute, pct(float64(hi.HeapInuse)/float64(lo.HeapInuse)),
		mib(rlo), mib(rhi), pct(float64(rhi)/float64(rlo)), full[len(full)-1].Retained)
}

// feedTarget holds the store to constant memory: once it evicts, its
// heap may vary by 10% at most.
func (r *report) feedTarget() (target, bool) {
	var lo, hi uint64
	n := 0
	for _, s := range r.feed.Samples {
		if s.Evicted == 0 {
			continue
		}
		if n == 0 || s.HeapInuse < lo {
			lo = s.HeapInuse
		}
		hi = max(hi, s.HeapInuse)
		n++
	}
	if n < 2 {
		return target{}, false
	}
	t := target{What: "UI store under a long feed", Goal: "flat: HeapInuse within 10% once full",
		Got: fmt.Sprintf("%.1f to %.1f MiB over %d samples", mib(lo), mib(hi), n)}
	if float64(hi) <= 1.1*float64(lo) {
		t.Verdict = "met"
	} else {
		t.Verdict = fmt.Sprintf("missed: the highest %s over the lowest", pct(float64(hi)/float64(lo)))
	}
	return t, true
}
