package main

import (
	"fmt"
	"math"
)

// interval is a two-sided 90% confidence interval of the mean of a few
// rounds' figures, from Student's t: a single run's total says nothing of
// how far the next run could land, and on a shared machine rounds differ
// by more than some targets' margins. It treats the rounds as independent
// draws of a roughly normal figure, which rotating the observers every
// round and pairing each with the same round's run of nothing attached
// (RoundRatios, RoundAddedCPU) is meant to make them.
type interval struct {
	Mean, Lo, Hi float64
	N            int
}

// t95 is the 0.95 quantile of Student's t with 1 to 30 degrees of freedom.
var t95 = [...]float64{6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812,
	1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725,
	1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697}

// meanInterval is the interval of xs' mean; false with fewer than three
// figures, whose interval would say nothing.
func meanInterval(xs []float64) (interval, bool) {
	n := len(xs)
	if n < 3 {
		return interval{}, false
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(n)
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	t := 1.645
	if n-1 <= len(t95) {
		t = t95[n-2]
	}
	half := t * math.Sqrt(ss/float64(n-1)/float64(n))
	return interval{Mean: mean, Lo: mean - half, Hi: mean + half, N: n}, true
}

// fewerPercent is how many percent fewer connections/s each ratio to
// nothing attached means.
func fewerPercent(ratios []float64) []float64 {
	out := make([]float64, len(ratios))
	for i, r := range ratios {
		out[i] = (1 - r) * 100
	}
	return out
}

// overheadIntervals are the intervals of an observer's cost over its
// rounds: how many percent fewer connections/s, and how many µs of CPU
// per connection more, than nothing attached.
type overheadIntervals struct {
	fewer, added interval
}

func (o overheadIntervals) String() string {
	return fmt.Sprintf("90%% interval of the mean of %d rounds: %.1f to %.1f%% fewer conn/s, %+.0f to %+.0f µs CPU/conn",
		o.fewer.N, o.fewer.Lo, o.fewer.Hi, o.added.Lo, o.added.Hi)
}

// decides reports whether the intervals settle a goal of at most percent
// fewer connections/s and at most cpuMicros added per connection, and
// which way: met when both lie within it, missed when either lies wholly
// beyond it, undecided otherwise.
func (o overheadIntervals) decides(percent, cpuMicros float64) (decided, met bool) {
	switch {
	case o.fewer.Hi <= percent && o.added.Hi <= cpuMicros:
		return true, true
	case o.fewer.Lo > percent || o.added.Lo > cpuMicros:
		return true, false
	}
	return false, false
}
