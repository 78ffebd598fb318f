package join

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestDueQueueFinishesOnTime: flows queued mostly in deadline order, some
// out of order, some whose deadline moves on after they are queued, each
// come out at the first tick at or past their last deadline: never
// before, never later, each once.
func TestDueQueueFinishesOnTime(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q dueQueue
	var open []*pending
	finishedAt := map[*pending]time.Duration{}
	const tick = 10 * time.Millisecond
	for step := range 2000 {
		now := time.Duration(step) * tick
		for range rng.IntN(20) {
			p := &pending{deadline: now + 1500*time.Millisecond}
			if rng.IntN(10) == 0 {
				p.deadline -= time.Duration(rng.IntN(1000)) * time.Millisecond // out of order
			}
			q.push(p)
			open = append(open, p)
		}
		for range rng.IntN(5) { // later events of open flows
			if len(open) == 0 {
				break
			}
			p := open[rng.IntN(len(open))]
			if _, done := finishedAt[p]; !done {
				p.deadline, p.moved = now+1500*time.Millisecond, true
			}
		}
		for {
			due, fromFIFO, ok := q.peek()
			if !ok || now < due {
				break
			}
			p := q.pop(fromFIFO)
			if now < p.deadline {
				q.heap.push(p.deadline, p)
				continue
			}
			if _, twice := finishedAt[p]; twice {
				t.Fatalf("a flow came out twice")
			}
			finishedAt[p] = now
		}
	}
	for i, p := range open {
		at, done := finishedAt[p]
		last := time.Duration(1999) * tick
		switch {
		case !done && p.deadline <= last:
			t.Fatalf("flow %d due at %v never came out", i, p.deadline)
		case done && at < p.deadline:
			t.Fatalf("flow %d due at %v came out early, at %v", i, p.deadline, at)
		case done && at >= p.deadline+tick:
			t.Fatalf("flow %d due at %v came out late, at %v", i, p.deadline, at)
		}
	}
	if q.len() != len(open)-len(finishedAt) {
		t.Fatalf("queue holds %d, want %d", q.len(), len(open)-len(finishedAt))
	}
}
