package tui

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/tracer-dev/tracer/internal/trace"
)

const millionFlows = 1_000_000

// busyNodeStore fills a store with n flows modelled on the incident
// trace's, each from its own client address and port as on a busy node.
func busyNodeStore(tb testing.TB, n int) (Source, *trace.Store) {
	src := incidentSource(tb)
	templates := make([]*trace.Flow, src.Store.Len())
	for i := range templates {
		templates[i] = src.Store.At(i)
	}
	store := trace.NewStore()
	start := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	for i := range n {
		f := *templates[i%len(templates)]
		client := fmt.Sprintf("10.244.%d.%d:%d", 1+i%4, 2+(i/4)%250, 32768+i%28000)
		f.Orig.Src = client
		if f.Reply != nil {
			r := *f.Reply
			r.Dst = client
			f.Reply = &r
		}
		f.Time = start.Add(time.Duration(i) * time.Millisecond)
		events := make([]trace.Event, len(f.Events))
		copy(events, f.Events)
		for j := range events {
			if events[j].Packet != nil {
				events[j].Packet = &trace.Tuple{Src: client, Dst: f.Orig.Dst}
			}
			events[j].Orig, events[j].Reply = nil, nil
			events[j].Time = f.Time
		}
		f.Events = events
		store.Append(&f)
	}
	src.Store = store
	return src, store
}

// BenchmarkFilterKeystroke1M measures one keystroke in the filter bar with
// a million flows stored: re-filter them all and redraw. Keystrokes
// alternate between completing and shortening the term, so every one
// re-filters. Target: under 100 ms per keystroke.
func BenchmarkFilterKeystroke1M(b *testing.B) {
	src, _ := busyNodeStore(b, millionFlows)
	for _, c := range []struct{ name, typed, last string }{
		{"port", "port:330", "6"},
		{"ip-cidr", "ip:10.96.0.0/1", "6"},
		{"word", "kube-ipvs", "0"},
		{"not-ok-word", "!verdict:ok hijac", "k"},
	} {
		b.Run(c.name, func(b *testing.B) {
			m := New(src, Options{Now: fixedNow})
			m.Update(tea.WindowSizeMsg{Width: 160, Height: 48})
			press(m, "/"+c.typed)
			add := keys(c.last)[0]
			del := tea.KeyPressMsg{Code: tea.KeyBackspace}
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					m.Update(add)
				} else {
					m.Update(del)
				}
				_ = m.View()
			}
			b.ReportMetric(float64(m.flows.count()), "rows")
			// CPU time is what the keystroke costs on an idle machine with
			// one core; wall time (ns/op) also counts other processes.
			b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestMillionFlowsMemory loads a million flows, filtered, and fails when
// they take over 200 MiB of heap: the flows of a busy node share their
// shapes (trace.Store), and each keeps only its client and times.
func TestMillionFlowsMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("loads a million flows; runs in the full tier")
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	src, store := busyNodeStore(t, millionFlows)
	m := New(src, Options{Now: fixedNow})
	press(m, "/port:3306")
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	heap := after.HeapInuse - before.HeapInuse
	t.Logf("%d flows: heap in use %d MiB (%.0f bytes/flow), runtime total from OS %d MiB, filtered rows %d",
		store.Len(), heap>>20, float64(heap)/float64(store.Len()), after.Sys>>20, m.flows.count())
	if heap > 200<<20 {
		t.Errorf("a million flows take %d MiB of heap; the target is 200 MiB", heap>>20)
	}
}
