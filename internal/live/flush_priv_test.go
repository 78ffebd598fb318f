package live

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// flushLog is what a Sink was handed, in order: a flow's destination, or
// "flush".
type flushLog struct {
	mu  sync.Mutex
	log []string
}

func (l *flushLog) sink() Sink {
	add := func(s string) {
		l.mu.Lock()
		l.log = append(l.log, s)
		l.mu.Unlock()
	}
	return Sink{Flow: func(f *trace.Flow) { add(f.Orig.Dst) }, Flush: func() { add("flush") }}
}

// flowsThenFlush counts the flows to dst in the log, and whether a Flush
// came after the last of them.
func (l *flushLog) flowsThenFlush(dst string) (flows int, flushed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.log {
		switch s {
		case dst:
			flows++
			flushed = false
		case "flush":
			flushed = flows > 0
		}
	}
	return flows, flushed
}

// TestRunFlushesEachBurst: the flows Run finishes are followed by a
// Flush, both those an expiry round finishes while it runs and those
// the stop finishes, so a sink that holds its lines (trace.Writer's
// Batch) writes every flow.
func TestRunFlushesEachBurst(t *testing.T) {
	const vip = "10.97.79.9:53"
	for _, tc := range []struct {
		name   string
		linger time.Duration
		// stopFirst: the flows are finished by the stop, not by an
		// expiry round (their linger is longer than the test).
		stopFirst bool
	}{
		{"expiry round", 0, false},
		{"stop", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newStopLab(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p := b.start(ctx, t, tc.linger)
			var l flushLog
			done := make(chan error, 1)
			go func() {
				_, err := p.Run(ctx, l.sink())
				done <- err
			}()
			const n = 3
			if made := b.send(t, n); made != n {
				t.Fatalf("R's DNAT rule counted %d connections, want %d", made, n)
			}
			if !tc.stopFirst {
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
					if flows, flushed := l.flowsThenFlush(vip); flows == n && flushed {
						break
					}
					if time.Now().After(deadline) {
						flows, flushed := l.flowsThenFlush(vip)
						t.Fatalf("while running: %d flows of %d, flushed after the last: %v", flows, n, flushed)
					}
				}
			} else {
				time.Sleep(300 * time.Millisecond) // a few expiry rounds
				if flows, _ := l.flowsThenFlush(vip); flows != 0 {
					t.Fatalf("%d flows finished within an hour's linger", flows)
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("run: %v", err)
			}
			if flows, flushed := l.flowsThenFlush(vip); flows != n || !flushed {
				t.Errorf("after Run: %d flows of %d, flushed after the last: %v", flows, n, flushed)
			}
		})
	}
}
