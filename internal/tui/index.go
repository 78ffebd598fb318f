package tui

import (
	"runtime"
	"sync"

	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/trace"
)

// flowIndex is the table's rows: the flows of a store snapshot from a
// start (moved by clear) that pass the filter, oldest first. With an empty
// filter the rows are the flows themselves and no index is kept, so an
// unfiltered million flows cost no memory here.
type flowIndex struct {
	view     trace.StoreView
	from     int // first store index shown; clear moves it
	filter   filter.Filter
	matches  []int32 // store indexes passing the filter; nil when it is empty
	verdicts map[string]int
}

// parallelMin is the scan length from which filtering is split across CPUs.
const parallelMin = 1 << 15

func (x *flowIndex) reset(v trace.StoreView, from int) {
	x.view, x.from = trace.StoreView{}, from
	x.verdicts = map[string]int{}
	x.matches = nil
	if !x.filter.Empty() {
		x.matches = []int32{}
	}
	x.extend(v)
}

// count returns the number of rows.
func (x *flowIndex) count() int {
	if x.matches == nil {
		return x.view.Len() - x.from
	}
	return len(x.matches)
}

// at returns the store index of row p (oldest first).
func (x *flowIndex) at(p int) int {
	if x.matches == nil {
		return x.from + p
	}
	return int(x.matches[p])
}

// extend takes in the flows of v beyond the current snapshot and returns
// how many rows were added.
func (x *flowIndex) extend(v trace.StoreView) int {
	start := max(x.view.Len(), x.from)
	before := x.count()
	x.view = v
	if start >= v.Len() {
		return 0
	}
	for i := start; i < v.Len(); i++ {
		x.verdicts[v.At(i).Verdict]++
	}
	if x.matches != nil {
		x.matches = append(x.matches, scan(v, x.filter, start, v.Len())...)
	}
	return x.count() - before
}

// setFilter re-filters every flow shown.
func (x *flowIndex) setFilter(f filter.Filter) {
	x.filter = f
	if f.Empty() {
		x.matches = nil
		return
	}
	x.matches = scan(x.view, f, x.from, x.view.Len())
}

// clear hides the flows seen so far.
func (x *flowIndex) clear() {
	v := x.view
	x.view = trace.StoreView{}
	x.reset(v, v.Len())
}

// scan returns the store indexes in [from, to) that f matches, splitting a
// long range across the CPUs: re-filtering a million flows on a keystroke
// must stay well under the 100 ms a typist notices.
func scan(v trace.StoreView, f filter.Filter, from, to int) []int32 {
	n := to - from
	workers := min(runtime.GOMAXPROCS(0), n/parallelMin)
	if workers <= 1 {
		return scanRange(v, f, from, to, nil)
	}
	parts := make([][]int32, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := from+n*w/workers, from+n*(w+1)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			parts[w] = scanRange(v, f, lo, hi, nil)
		}()
	}
	wg.Wait()
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	out := make([]int32, 0, total)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func scanRange(v trace.StoreView, f filter.Filter, from, to int, out []int32) []int32 {
	if out == nil {
		out = []int32{}
	}
	m := f.Matcher()
	for i := from; i < to; i++ {
		if m.Match(v.At(i), v.Keys(i)) {
			out = append(out, int32(i))
		}
	}
	return out
}
