package loader

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
)

// TestRingBufferHoldsItsSize: the ring buffer is as large as the
// configuration says (the kernel's own account of the map), and holds
// what that size holds while nobody reads it: 600 translated datagrams
// are 600 records for a ring of 1 MiB (about 5,000), and overflow one of
// 64 KiB (315 of 208 bytes), where every record that did not fit is
// counted lost. Truth: the DNAT rule's count of the datagrams.
func TestRingBufferHoldsItsSize(t *testing.T) {
	requirePrivileged(t)
	for _, c := range []struct {
		size     int
		wantLoss bool
	}{{MinRingBuffer, true}, {1 << 20, false}} {
		t.Run(fmt.Sprint(c.size), func(t *testing.T) { ringBufferHolds(t, c.size, c.wantLoss) })
	}
}

func ringBufferHolds(t *testing.T, size int, wantLoss bool) {
	tp, tr, ino := queuedTopologyWith(t, size)
	info, err := tr.maps["events"].Info()
	if err != nil {
		t.Fatalf("ring buffer's map info: %v", err)
	}
	if info.MaxEntries != uint32(size) {
		t.Fatalf("the kernel's ring buffer has %d bytes, configured %d", info.MaxEntries, size)
	}
	made := sendQueued(t, tp, 600)
	if err := tr.Detach(); err != nil {
		t.Fatalf("detach: %v", err)
	}
	var read uint64
	for {
		ev, err := tr.Next()
		if errors.Is(err, os.ErrClosed) {
			break
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if ev.Kind == event.KindDNAT && ev.Netns == ino && ev.Orig.DstPort == 5353 {
			read++
		}
	}
	lost, err := tr.Lost()
	if err != nil {
		t.Fatalf("lost counters: %v", err)
	}
	var dropped uint64
	for _, n := range lost {
		dropped += n
	}
	t.Logf("ring of %d bytes: %d datagrams translated, %d read, %d counted lost", size, made, read, dropped)
	if read+dropped != made {
		t.Errorf("%d read and %d counted lost of %d translated", read, dropped, made)
	}
	if (dropped > 0) != wantLoss {
		t.Errorf("%d lost, want loss %v", dropped, wantLoss)
	}
}
