package agent

import (
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Flows of two nodes arriving out of order leave in time order once they
// have waited the window; one that comes after the window is counted.
func TestMergerOrdersWithinWindow(t *testing.T) {
	m := &Merger{Window: 2 * time.Second}
	now := t0.Add(10 * time.Second)
	a := testFlow("10.0.0.1:1", "10.0.0.9:80", t0.Add(3*time.Second))
	b := testFlow("10.0.0.2:1", "10.0.0.9:80", t0.Add(1*time.Second))
	c := testFlow("10.0.0.3:1", "10.0.0.9:80", t0.Add(2*time.Second))
	m.Add(a, now)
	m.Add(b, now.Add(500*time.Millisecond))
	if out := m.Ready(now.Add(1900*time.Millisecond), nil); len(out) != 0 {
		t.Fatalf("%d flows out before the window passed", len(out))
	}
	m.Add(c, now.Add(1900*time.Millisecond))
	out := m.Ready(now.Add(2*time.Second), nil)
	if len(out) != 0 {
		// b is the earliest and waits until now+2.5s; a waits behind it.
		t.Fatalf("flows left ahead of an earlier one still waiting: %v", times(out))
	}
	out = m.Ready(now.Add(2500*time.Millisecond), nil)
	if len(out) != 1 || out[0] != b {
		t.Fatalf("at +2.5s got %v, want b alone (c, earlier than a, still waits)", times(out))
	}
	out = m.Ready(now.Add(3900*time.Millisecond), out[:0])
	if len(out) != 2 || out[0] != c || out[1] != a {
		t.Fatalf("at +3.9s got %v, want c then a", times(out))
	}
	late := testFlow("10.0.0.4:1", "10.0.0.9:80", t0)
	m.Add(late, now.Add(5*time.Second))
	if out = m.Drain(out[:0]); len(out) != 1 || m.OutOfOrder != 1 {
		t.Fatalf("drain gave %d flows, %d out of order, want 1 and 1", len(out), m.OutOfOrder)
	}
}

func times(fs []*trace.Flow) []string {
	var s []string
	for _, f := range fs {
		s = append(s, f.Time.Sub(t0).String())
	}
	return s
}

// The skew is the offset least delayed by the network.
func TestSkew(t *testing.T) {
	var s Skew
	if _, ok := s.Offset(); ok {
		t.Fatal("offset before any message")
	}
	recv := t0
	s.Observe(recv.Add(2*time.Second-300*time.Millisecond), recv) // 300 ms in flight
	s.Observe(recv.Add(2*time.Second-10*time.Millisecond), recv)
	s.Observe(recv.Add(2*time.Second-90*time.Millisecond), recv)
	if d, _ := s.Offset(); d != 1990*time.Millisecond {
		t.Errorf("offset %s, want 1.99s", d)
	}
}
