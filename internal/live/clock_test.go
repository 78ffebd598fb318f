package live

import (
	"testing"
	"time"
)

// The pipeline's clock follows what it has read: the events' own times,
// and the moments the ring buffer was found empty; it never goes back, so
// a late event cannot reopen time already expired.
func TestEventClock(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	var c eventClock
	if got := c.event(t0.Add(time.Second)); !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("after an event: %v", got)
	}
	if got := c.event(t0); !got.Equal(t0.Add(time.Second)) {
		t.Errorf("an older event moved the clock back to %v", got)
	}
	c.idle(t0.Add(3 * time.Second))
	if want := t0.Add(3*time.Second - time.Millisecond); !c.now.Equal(want) {
		t.Errorf("after an empty ring buffer: %v, want %v", c.now, want)
	}
	c.idle(t0.Add(2 * time.Second))
	if want := t0.Add(3*time.Second - time.Millisecond); !c.now.Equal(want) {
		t.Errorf("an earlier empty reading moved the clock back to %v", c.now)
	}
}
