package trace

import (
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"
)

var feedStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// feedVerdicts is the verdict of every tenth flow of the synthetic feed
// in turn; the rest are ok.
var feedVerdicts = []string{VerdictReset, VerdictDropped, VerdictIPVSNoEndpoint}

// feedFlow is flow i of a synthetic node's traffic: a unique client
// address and port, one of a few pods, Services and rules, one or two
// events,
// i microseconds after feedStart. Everything about it follows from i, so
// a test knows what a stored flow must be without asking the store.
func feedFlow(i int) *Flow {
	client := fmt.Sprintf("10.%d.%d.%d:%d", i>>16&0xff, i>>8&0xff, i&0xff, 30000+i%30000)
	backend := fmt.Sprintf("10.244.%d.%d:8080", i%7, 10+i%13)
	verdict := VerdictOK
	if i%10 == 9 {
		verdict = feedVerdicts[(i/10)%len(feedVerdicts)]
	}
	at := feedStart.Add(time.Duration(i) * time.Microsecond)
	orig := Tuple{Src: client, Dst: fmt.Sprintf("10.96.0.%d:80", i%5)}
	reply := Tuple{Src: backend, Dst: client}
	return &Flow{
		Time: at, Proto: "tcp", Orig: orig, Reply: &reply, Verdict: verdict,
		Explanation: "synthetic flow " + verdict,
		SrcPod:      &PodRef{Namespace: "default", Name: fmt.Sprintf("client-%d", i%50)},
		DstPod:      &PodRef{Namespace: "shop", Name: fmt.Sprintf("web-%d", i%7)},
		Service:     &ServiceRef{Namespace: "shop", Name: fmt.Sprintf("web%d", i%5), Port: "http"},
		Rule:        &Rule{Table: "nat", Chain: fmt.Sprintf("KUBE-SEP-%d", i%7), Text: "-j DNAT"},
		Conntrack:   &Conntrack{State: "ESTABLISHED", Status: []string{"SEEN_REPLY", "ASSURED"}},
		Events: []Event{
			{Time: at, Kind: "nat", Hook: "nf_nat_ipv4_manip_pkt", Via: "fentry", Proto: "tcp", Packet: &orig, Orig: &orig, Reply: &reply, To: backend},
			{Time: at.Add(time.Millisecond), Kind: "ct_confirm", Hook: "__nf_conntrack_confirm", Via: "kprobe", Proto: "tcp", Orig: &orig, Reply: &reply},
		}[:1+i%4/3], // 1.25 events a flow, so event slabs and chunks do not line up
	}
}

// feedIndex is the feed index of a stored flow, read back from its time.
func feedIndex(f *Flow) int { return int(f.Time.Sub(feedStart) / time.Microsecond) }

// checkCaps fails when s holds more than its caps allow: more flows than
// the count cap, or a memory estimate over the memory cap.
func checkCaps(t *testing.T, s *Store, appended int) {
	t.Helper()
	caps := s.Eviction().Caps
	if caps.Flows > 0 && s.Retained() > caps.Flows {
		t.Fatalf("after %d flows the store retains %d, over its cap of %d", appended, s.Retained(), caps.Flows)
	}
	if caps.Memory > 0 && s.Memory() > caps.Memory {
		t.Fatalf("after %d flows the store estimates %d bytes, over its cap of %d", appended, s.Memory(), caps.Memory)
	}
}

func TestStoreFlowCapEvictsOldest(t *testing.T) {
	const capFlows, total = 10_000, 3*storeChunk + 12_345
	s := NewCappedStore(Caps{Flows: capFlows})
	want := map[string]int{}
	for i := range total {
		f := feedFlow(i)
		want[f.Verdict]++
		if got := s.Append(f); got != i {
			t.Fatalf("append %d returned index %d", i, got)
		}
		checkCaps(t, s, i+1)
	}
	if s.Retained() != capFlows || s.Len() != total {
		t.Fatalf("retains %d of %d flows, want %d of %d", s.Retained(), s.Len(), capFlows, total)
	}
	ev := s.Eviction()
	if ev.Evicted != total-capFlows || ev.Cause != "flows" {
		t.Fatalf("eviction %+v, want %d evicted by the flows cap", ev, total-capFlows)
	}
	v := s.Snapshot()
	if v.First() != total-capFlows || v.Len() != total {
		t.Fatalf("view [%d, %d), want [%d, %d)", v.First(), v.Len(), total-capFlows, total)
	}
	for i := v.First(); i < v.Len(); i++ {
		if got := feedIndex(v.At(i)); got != i {
			t.Fatalf("view flow %d is feed flow %d", i, got)
		}
	}
	if s.At(v.First()-1) != nil {
		t.Error("At returns an evicted flow")
	}
	_, verdicts := s.Counts()
	if !reflect.DeepEqual(verdicts, want) {
		t.Errorf("counts %v, want every flow appended %v", verdicts, want)
	}
}

// TestStoreMemoryCapEvictsOldest fills a store past its memory cap with
// flows that share shapes, and with flows that each need a shape of
// their own (then, once the shape table is full, are stored whole).
func TestStoreMemoryCapEvictsOldest(t *testing.T) {
	const capBytes = MinMemory
	for _, tc := range []struct {
		name  string
		total int
		flow  func(i int) *Flow
	}{
		{"shared shapes", 200_000, feedFlow},
		{"a shape each", 40_000, func(i int) *Flow {
			f := feedFlow(i)
			f.Explanation += fmt.Sprint(" ", i)
			return f
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewCappedStore(Caps{Memory: capBytes})
			for i := range tc.total {
				s.Append(tc.flow(i))
				checkCaps(t, s, i+1)
			}
			ev := s.Eviction()
			if ev.Evicted == 0 || ev.Cause != "memory" || ev.Evicted%storeChunk != 0 {
				t.Fatalf("eviction %+v: want whole chunks evicted by the memory cap", ev)
			}
			if got := feedIndex(s.At(ev.Evicted)); got != ev.Evicted {
				t.Errorf("oldest retained flow %d is feed flow %d", ev.Evicted, got)
			}
			t.Logf("%d flows: %d retained in an estimated %d bytes (cap %d), %d shapes", tc.total, s.Retained(), s.Memory(), int64(capBytes), len(s.shapes))
		})
	}
}

func TestStoreKeepsNFTablesRule(t *testing.T) {
	f := feedFlow(1)
	f.Rule = &Rule{Backend: BackendNFTables, Family: "ip", Table: "kube-proxy", Chain: "services", Handle: 29, Text: "reject",
		Element: &RuleElement{Map: "no-endpoint-services", Key: "172.30.0.46 . tcp . 80", Comment: "ns6/svc6:p80"}}
	s := NewStore()
	s.Append(f)
	if got := s.At(0).Rule; !reflect.DeepEqual(got, f.Rule) {
		t.Errorf("stored rule %+v %+v, want %+v %+v", got, got.Element, f.Rule, f.Rule.Element)
	}
}

// heapInuse returns the Go heap in use after a collection.
func heapInuse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// estimateFactor is how far the store's memory estimate may be from the
// heap it grows: the cap means what it says within this factor.
const estimateFactor = 1.25

func TestStoreMemoryEstimateMatchesHeap(t *testing.T) {
	for _, tc := range []struct {
		name string
		caps Caps
		n    int
	}{
		{"uncapped", Caps{}, 100_000},
		{"memory cap", Caps{Memory: 32 << 20}, 150_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := heapInuse()
			s := NewCappedStore(tc.caps)
			for i := range tc.n {
				s.Append(feedFlow(i))
			}
			heap := heapInuse() - before
			est := s.Memory()
			runtime.KeepAlive(s)
			ratio := float64(heap) / float64(est)
			t.Logf("%d flows, %d retained: estimate %d bytes, heap grew %d (%.2fx)", tc.n, s.Retained(), est, heap, ratio)
			if ratio > estimateFactor || ratio < 1/estimateFactor {
				t.Errorf("heap grew %d bytes for an estimate of %d: %.2fx, beyond %.2fx either way", heap, est, ratio, estimateFactor)
			}
		})
	}
}

// TestStoreEvictionRace reads views taken earlier while the store evicts
// their chunks: every flow a view holds must stay the flow it was. Run it
// with -race.
func TestStoreEvictionRace(t *testing.T) {
	s := NewCappedStore(Caps{Flows: 2 * storeChunk})
	total := 40 * storeChunk
	if testing.Short() {
		total = 12 * storeChunk
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readViews(s, done, errs)
		}()
	}
	for i := range total {
		s.Append(feedFlow(i))
	}
	close(done)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if s.Eviction().Evicted != total-2*storeChunk {
		t.Errorf("evicted %d, want %d", s.Eviction().Evicted, total-2*storeChunk)
	}
}

// readViews keeps a few old views and re-reads every flow in them until
// done, reporting the first flow that is not the one its index names.
func readViews(s *Store, done <-chan struct{}, errs chan<- string) {
	var old []StoreView
	for {
		select {
		case <-done:
			return
		default:
		}
		old = append(old, s.Snapshot())
		if len(old) > 4 {
			old = old[1:]
		}
		for _, v := range old {
			for i := v.First(); i < v.Len(); i++ {
				f := v.At(i)
				if got := feedIndex(f); got != i || f.Orig.Src != feedFlow(i).Orig.Src {
					errs <- fmt.Sprintf("view [%d, %d) flow %d reads as feed flow %d (%s)", v.First(), v.Len(), i, got, f.Orig.Src)
					return
				}
			}
		}
	}
}

func TestStoreViewFrom(t *testing.T) {
	s := NewCappedStore(Caps{Flows: 4*storeChunk - 5})
	paused := s.Snapshot()
	for i := range 5 * storeChunk {
		s.Append(feedFlow(i))
		if i == storeChunk+10 {
			paused = s.Snapshot()
		}
	}
	first := s.Snapshot().First()
	v := paused.From(first)
	if first != storeChunk+5 || v.First() != first || v.Len() != storeChunk+11 || len(v.chunks) != 1 {
		t.Fatalf("from %d: [%d, %d) in %d chunks, want [%d, %d) in 1", first, v.First(), v.Len(), len(v.chunks), first, storeChunk+11)
	}
	for i := v.First(); i < v.Len(); i++ {
		if got := feedIndex(v.At(i)); got != i {
			t.Fatalf("flow %d is feed flow %d", i, got)
		}
	}
	if gone := paused.From(v.Len() + 100); gone.First() != gone.Len() {
		t.Fatalf("from past the end: [%d, %d), want empty", gone.First(), gone.Len())
	}
	if !reflect.DeepEqual(v.Verdicts(), paused.Verdicts()) || v.Verdicts()[VerdictOK] == 0 {
		t.Errorf("verdicts %v, want the paused view's %v", v.Verdicts(), paused.Verdicts())
	}
}

// TestStoreHeapFlatUnderFeed appends window after window of distinct
// flows to a capped store. The intern tables fill with the first 65536
// client addresses and reply tuples, and stop there (internLimit); from
// then on the heap after each window must stay within 10% of the heap
// after the fourth, or evicted chunks are being kept alive.
func TestStoreHeapFlatUnderFeed(t *testing.T) {
	const perWindow, levelAfter = 5 * storeChunk, 4
	windows := 12
	if testing.Short() {
		windows = 7
	}
	s := NewCappedStore(Caps{Flows: 4 * storeChunk})
	base := heapInuse()
	var level int64
	for w := 1; w <= windows; w++ {
		for i := (w - 1) * perWindow; i < w*perWindow; i++ {
			s.Append(feedFlow(i))
		}
		heap := heapInuse() - base
		t.Logf("after %d flows: heap %d bytes, estimate %d", w*perWindow, heap, s.Memory())
		switch {
		case w == levelAfter:
			level = heap
		case w > levelAfter && float64(heap) > 1.1*float64(level):
			t.Fatalf("after %d flows the heap grew %d bytes, over 1.1x the %d after %d", w*perWindow, heap, level, levelAfter*perWindow)
		}
	}
	runtime.KeepAlive(s)
}

// TestStoreInternTablesBounded floods every intern table with distinct
// values: none may pass internLimit entries, and under a memory cap the
// tables together stay within a quarter of it (plus the slabs being
// filled).
func TestStoreInternTablesBounded(t *testing.T) {
	for _, caps := range []Caps{{}, {Memory: MinMemory}} {
		s := NewCappedStore(caps)
		for i := range internLimit + 1000 {
			f := feedFlow(i)
			u := fmt.Sprint(i)
			f.Explanation += " " + u
			f.SrcPod = &PodRef{Namespace: "ns", Name: "pod-" + u}
			f.Service = &ServiceRef{Namespace: "ns", Name: "svc-" + u, Port: "http"}
			f.Rule = &Rule{Table: "nat", Chain: "KUBE-SEP-" + u, Text: "-j DNAT"}
			f.Conntrack = &Conntrack{State: "ESTABLISHED", Status: []string{"SEEN_REPLY", u}}
			s.Append(f)
		}
		sizes := map[string]int{"strs": len(s.strs), "tuples": len(s.tuples), "pods": len(s.pods), "services": len(s.services),
			"rules": len(s.rules), "cts": len(s.cts), "lists": len(s.lists), "addrs": len(s.addrs), "shapes": len(s.shapes)}
		for name, n := range sizes {
			if n > internLimit || name == "shapes" && n > shapeLimit {
				t.Errorf("caps %+v: table %s has %d entries, over %d", caps, name, n, internLimit)
			}
		}
		filling := int64(byteSlab + tupleSlab*sizeTuple)
		if caps.Memory > 0 && s.tableBytes > caps.Memory/4+filling {
			t.Errorf("caps %+v: the tables take %d bytes, over a quarter of the cap (%d) and the slabs being filled", caps, s.tableBytes, caps.Memory/4)
		}
		t.Logf("caps %+v: tables %v, %d bytes; estimate %d", caps, sizes, s.tableBytes, s.Memory())
	}
}
