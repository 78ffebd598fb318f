package mix

import (
	"io"
	"runtime"
	"testing"
	"time"
)

// heapGrowth is how far the heap of `tracer trace -o json`'s pipeline
// may rise above its level after the first window: a quarter, plus
// heapSlack for the allocator's own variation.
const (
	heapGrowth = 1.25
	heapSlack  = 4 << 20
)

// TestStreamHeapFlat runs the pipeline `tracer trace -o json` runs (decode,
// join, diagnose, encode to a discarded stream) over a steady feed of
// distinct flows, 5,000 a second of the events' own clock, and checks the
// heap after each window of flows against the first: a stream holds no
// flow once written, so nothing may grow with the flows seen.
func TestStreamHeapFlat(t *testing.T) {
	windows, perWindow := 10, 100_000
	if testing.Short() {
		windows, perWindow = 4, 25_000
	}
	env, err := Env()
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPipeline(io.Discard, env)
	if err != nil {
		t.Fatal(err)
	}
	const gap = time.Second / 5000
	ts := uint64(time.Second)
	var buf []byte
	var first uint64
	for w := range windows {
		for i := w * perWindow; i < (w+1)*perWindow; i++ {
			for _, e := range Generate(i) {
				buf = Encode(buf[:0], e, ts)
				p.Feed(buf)
			}
			ts += uint64(gap)
		}
		heap := heapInuse()
		t.Logf("after %d flows: HeapInuse %.1f MiB, %d flows open in the joiner", (w+1)*perWindow, float64(heap)/(1<<20), p.Stages.Join.Open())
		if w == 0 {
			first = heap
			continue
		}
		if limit := uint64(heapGrowth*float64(first)) + heapSlack; heap > limit {
			t.Fatalf("after %d flows the heap is %d bytes, over %d (%.2fx the %d after the first %d, + %d)", (w+1)*perWindow, heap, limit,
				heapGrowth, first, perWindow, heapSlack)
		}
	}
	if p.Errors > 0 {
		t.Errorf("%d pipeline errors", p.Errors)
	}
}

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}
