package tui

import (
	"math"
	"runtime"
	"sort"
	"sync"

	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/trace"
)

// flowIndex is the table's rows: the flows of a store snapshot from a
// start (moved by clear) that pass the filter, oldest first. With an empty
// filter the rows are the flows themselves and no index is kept, so an
// unfiltered million flows cost no memory here. The store evicts its
// oldest flows beyond its caps; the rows then begin at the view's first
// retained flow, while the verdict counts still include the evicted ones.
type flowIndex struct {
	view     trace.StoreView
	from     int // first store index shown; clear moves it
	filter   filter.Filter
	matches  []int32 // store indexes passing the filter, less base; nil when it is empty
	base     int     // the store index matches count from
	before   map[string]int
	verdicts map[string]int // flows from `from` by verdict, evicted ones included
}

// parallelMin is the scan length from which filtering is split across CPUs.
const parallelMin = 1 << 15

// reset shows the flows of v from store index from on; before counts the
// flows before from by verdict.
func (x *flowIndex) reset(v trace.StoreView, from int, before map[string]int) {
	x.view, x.from, x.before = trace.StoreView{}, from, before
	x.verdicts = map[string]int{}
	x.matches, x.base = nil, from
	if !x.filter.Empty() {
		x.matches = []int32{}
	}
	x.extend(v)
}

// start is the first store index a row can show.
func (x *flowIndex) start() int { return max(x.from, x.view.First()) }

// count returns the number of rows.
func (x *flowIndex) count() int {
	if x.matches == nil {
		return max(x.view.Len()-x.start(), 0)
	}
	return len(x.matches)
}

// at returns the store index of row p (oldest first).
func (x *flowIndex) at(p int) int {
	if x.matches == nil {
		return x.start() + p
	}
	return x.base + int(x.matches[p])
}

// seen is how many flows were stored from `from` on, evicted ones included.
func (x *flowIndex) seen() int { return max(x.view.Len()-x.from, 0) }

// dropped is how many of them the store evicted.
func (x *flowIndex) dropped() int { return max(x.view.First()-x.from, 0) }

// extend takes in v, a later view of the store: the rows of flows it no
// longer holds leave from the oldest end, its new flows join at the
// newest. It returns how many rows were added and how many dropped.
func (x *flowIndex) extend(v trace.StoreView) (added, dropped int) {
	oldEnd := max(x.view.Len(), x.from)
	rows := x.count()
	x.view = v
	x.verdicts = subtract(v.Verdicts(), x.before)
	kept := x.keep(oldEnd)
	if newFrom := max(oldEnd, v.First()); newFrom < v.Len() && x.matches != nil {
		if v.Len()-x.base > math.MaxInt32 {
			x.rebase()
		}
		x.matches = append(x.matches, scan(v, x.filter, newFrom, v.Len(), x.base)...)
	}
	return x.count() - kept, rows - kept
}

// keep drops the matches the view no longer holds and returns how many
// rows of the flows before oldEnd remain.
func (x *flowIndex) keep(oldEnd int) int {
	if x.matches == nil {
		return max(oldEnd-x.start(), 0)
	}
	first := int32(x.start() - x.base)
	k := sort.Search(len(x.matches), func(k int) bool { return x.matches[k] >= first })
	x.matches = x.matches[k:]
	return len(x.matches)
}

// rebase counts the matches from the first retained flow: a live store's
// indexes pass 2^31 after some days, the retained ones stay far apart
// less than that. The matches are copied, not changed in place: an
// export may still be reading a copy of the index.
func (x *flowIndex) rebase() {
	d := x.start() - x.base
	out := make([]int32, len(x.matches))
	for k, i := range x.matches {
		out[k] = i - int32(d)
	}
	x.matches, x.base = out, x.base+d
}

// evictUnder takes in what the store evicted since v was taken, keeping
// the view's end: a paused table's rows stay, but for the evicted ones.
func (x *flowIndex) evictUnder(v trace.StoreView) (dropped int) {
	_, dropped = x.extend(x.view.From(v.First()))
	return dropped
}

// setFilter re-filters every flow shown.
func (x *flowIndex) setFilter(f filter.Filter) {
	x.filter = f
	if f.Empty() {
		x.matches = nil
		return
	}
	x.base = x.start()
	x.matches = scan(x.view, f, x.start(), x.view.Len(), x.base)
}

// clear hides the flows seen so far.
func (x *flowIndex) clear() {
	v := x.view
	x.view = trace.StoreView{}
	x.reset(v, v.Len(), v.Verdicts())
}

// subtract returns a - b by key, without the keys that come to zero.
func subtract(a, b map[string]int) map[string]int {
	out := make(map[string]int, len(a))
	for k, n := range a {
		if d := n - b[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// scan returns the store indexes in [from, to) that f matches, less base,
// splitting a long range across the CPUs: re-filtering a million flows on
// a keystroke must stay well under the 100 ms a typist notices.
func scan(v trace.StoreView, f filter.Filter, from, to, base int) []int32 {
	n := to - from
	workers := min(runtime.GOMAXPROCS(0), n/parallelMin)
	if workers <= 1 {
		return scanRange(v, f, from, to, base, nil)
	}
	parts := make([][]int32, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := from+n*w/workers, from+n*(w+1)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			parts[w] = scanRange(v, f, lo, hi, base, nil)
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

func scanRange(v trace.StoreView, f filter.Filter, from, to, base int, out []int32) []int32 {
	if out == nil {
		out = []int32{}
	}
	m := f.Matcher()
	var sf trace.StoredFlow
	for i := from; i < to; i++ {
		v.Load(i, &sf)
		if m.Match(&sf) {
			out = append(out, int32(i-base))
		}
	}
	return out
}
