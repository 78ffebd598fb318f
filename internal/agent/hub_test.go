package agent

import (
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/trace"
)

func testFlow(src, dst string, at time.Time) *trace.Flow {
	return &trace.Flow{Type: trace.TypeFlow, Time: at, Proto: "tcp", Orig: trace.Tuple{Src: src, Dst: dst},
		Events: []trace.Event{}, Verdict: trace.VerdictOK, Explanation: "ok"}
}

var t0 = time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)

// A subscriber that does not read costs the publisher nothing: its
// buffer fills, the rest is counted as dropped for it alone, and the
// other subscriber gets every flow its filter passes.
func TestHubDropsForSlowSubscriberOnly(t *testing.T) {
	h := NewHub()
	slow := h.Subscribe(filter.Filter{}, 3)
	port80 := h.Subscribe(filter.MustParse("port:80"), 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 50 {
			dst := "10.96.0.1:80"
			if i%2 == 1 {
				dst = "10.96.0.1:443"
			}
			h.Publish(testFlow("10.0.0.1:40000", dst, t0))
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish blocked on a subscriber that does not read")
	}
	if got := slow.Dropped(); got != 47 {
		t.Errorf("slow subscriber: %d dropped, want 47 (50 flows, room for 3)", got)
	}
	if got := len(port80.Flows()); got != 25 || port80.Dropped() != 0 {
		t.Errorf("port:80 subscriber: %d queued, %d dropped, want 25 and 0", got, port80.Dropped())
	}
	if h.Published() != 50 {
		t.Errorf("published %d, want 50", h.Published())
	}
}

// Close ends each stream after what it holds; a closed subscription gets
// nothing more; subscribing to a closed hub gives an ended stream.
func TestHubCloseEndsStreams(t *testing.T) {
	h := NewHub()
	a := h.Subscribe(filter.Filter{}, 10)
	b := h.Subscribe(filter.Filter{}, 10)
	b.Close()
	h.Publish(testFlow("10.0.0.1:1", "10.0.0.2:2", t0))
	h.Close()
	var got int
	for range a.Flows() {
		got++
	}
	if got != 1 {
		t.Errorf("a read %d flows before the end, want 1", got)
	}
	if len(b.Flows()) != 0 {
		t.Errorf("b got a flow after it closed")
	}
	if h.Subscribers() != 0 {
		t.Errorf("%d subscribers after Close", h.Subscribers())
	}
	if _, open := <-h.Subscribe(filter.Filter{}, 1).Flows(); open {
		t.Error("a subscription to a closed hub is open")
	}
	h.Publish(testFlow("10.0.0.1:1", "10.0.0.2:2", t0)) // after Close: no panic
}

func TestHubBufferBounds(t *testing.T) {
	h := NewHub()
	if c := cap(h.Subscribe(filter.Filter{}, 0).flows); c != DefaultBuffer {
		t.Errorf("buffer 0 gives %d, want DefaultBuffer", c)
	}
	if c := cap(h.Subscribe(filter.Filter{}, MaxBuffer*2).flows); c != MaxBuffer {
		t.Errorf("buffer 2*MaxBuffer gives %d, want MaxBuffer", c)
	}
}
