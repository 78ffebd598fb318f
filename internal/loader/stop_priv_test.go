package loader

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netlab"
)

// A stopping tracer reads what the kernel reported before the stop
// (Detach), and counts what it cannot (Close, Unread). Both are held to
// the DNAT rule's own count of the connections it translated.

// queuedTopology is the test topology with a UDP DNAT in R (VIP:5353 to
// S:5353, where a socket that is never read takes the datagrams) and a
// tracer attached to R that nobody reads yet.
func queuedTopology(t *testing.T) (*topology, *Tracer, uint32) {
	t.Helper()
	return queuedTopologyWith(t, 0)
}

// queuedTopologyWith is queuedTopology with a ring buffer of ringBuffer
// bytes (0: the default).
func queuedTopologyWith(t *testing.T, ringBuffer int) (*topology, *Tracer, uint32) {
	t.Helper()
	requirePrivileged(t)
	tp := newTopology(t)
	run(t, tp.r, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", vip, "-p", "udp", "--dport", "5353",
		"-j", "DNAT", "--to-destination", sAddr+":5353")
	var sink net.PacketConn
	must(t, tp.s.Do(func() (err error) {
		sink, err = net.ListenPacket("udp", sAddr+":5353")
		return err
	}))
	t.Cleanup(func() { sink.Close() })
	// Neighbour resolution drops the first datagrams of a path: resolve
	// it before anything is counted.
	for range 5 {
		sendUDP(tp.c, vip+":5353")
	}
	time.Sleep(300 * time.Millisecond)
	ino, err := tp.r.Inode()
	must(t, err)
	tr, err := Open(Config{Netns: []uint32{ino}, NetnsPaths: []string{tp.r.Path()}, RingBuffer: ringBuffer})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tp, tr, ino
}

// sendQueued sends n one-datagram connections through R's DNAT, each
// from a socket of its own (a new source port, a new conntrack entry),
// and returns the rule's count of them once it has them all.
func sendQueued(t *testing.T, tp *topology, n int) uint64 {
	t.Helper()
	before := udpDNATCount(t, tp.r)
	for range n {
		// Each from a port of its own: an ephemeral port can repeat one
		// an earlier datagram's conntrack entry still holds.
		nextQueuedPort++
		if err := sendUDPFrom(tp.c, nextQueuedPort, vip+":5353"); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got := udpDNATCount(t, tp.r) - before
		if got >= uint64(n) || time.Now().After(deadline) {
			if got != uint64(n) {
				t.Fatalf("R's DNAT rule translated %d datagrams, %d were sent", got, n)
			}
			return got
		}
	}
}

// nextQueuedPort is the last source port sendQueued used.
var nextQueuedPort = 20000

func sendUDPFrom(ns netlab.Namespace, port int, addr string) error {
	var conn net.Conn
	err := ns.Do(func() (err error) {
		d := net.Dialer{LocalAddr: &net.UDPAddr{Port: port}}
		conn, err = d.Dial("udp", addr)
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte("ping"))
	return err
}

// udpDNATCount is the packet count of the udp rule in ns's nat PREROUTING.
func udpDNATCount(t *testing.T, ns netlab.Namespace) uint64 {
	t.Helper()
	n, err := ns.RulePackets("nat", "-A PREROUTING", "-p udp")
	must(t, err)
	return n
}

// TestDetachDeliversWhatWasQueued: events the programs queued before
// Detach are all read after it, and the read then ends by itself; events
// after Detach are none (the links are closed).
func TestDetachDeliversWhatWasQueued(t *testing.T) {
	tp, tr, ino := queuedTopology(t)
	made := sendQueued(t, tp, 300)
	if err := tr.Detach(); err != nil {
		t.Fatalf("detach: %v", err)
	}
	sendQueued(t, tp, 20) // after Detach: nothing reports these
	var dnat uint64
	ended := make(chan error, 1)
	go func() {
		for {
			ev, err := tr.Next()
			if err != nil {
				ended <- err
				return
			}
			if ev.Kind == event.KindDNAT && ev.Netns == ino && ev.Orig.DstPort == 5353 {
				dnat++
			}
		}
	}()
	select {
	case err := <-ended:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("read after Detach ended with %v, want os.ErrClosed once empty", err)
		}
	case <-time.After(5 * time.Second):
		tr.Close()
		<-ended
		t.Fatal("the read after Detach did not end by itself once the ring buffer was empty")
	}
	if dnat != made {
		t.Errorf("read %d DNAT decisions after Detach; R's rule made %d before it", dnat, made)
	}
	if lost, err := tr.Lost(); err != nil || len(lost) > 0 {
		t.Errorf("lost counters %v (%v), want none", lost, err)
	}
	if _, err := tr.Reattach(event.HookNFNat); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Reattach after Detach: %v, want os.ErrClosed", err)
	}
}

// TestCloseCountsWhatWasUnread: Close counts the records nobody read, and
// Lost still answers after it, from the counters as Close read them.
func TestCloseCountsWhatWasUnread(t *testing.T) {
	tp, tr, _ := queuedTopology(t)
	made := sendQueued(t, tp, 250)
	if err := tr.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if got := tr.Unread(); got != made {
		t.Errorf("Unread %d after Close; R's rule made %d decisions nobody read", got, made)
	}
	if lost, err := tr.Lost(); err != nil || len(lost) > 0 {
		t.Errorf("Lost after Close: %v (%v), want no error and none lost", lost, err)
	}
	if _, err := tr.Next(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Next after Close: %v", err)
	}
}
