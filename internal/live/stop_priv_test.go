package live

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// A pipeline stopped while behind the kernel reads what was reported
// before the stop for up to drainLimit, and counts the rest as lost:
// what it read and what it counted always add up to the NAT decisions
// the kernel's own DNAT rule counted.

type stopLab struct {
	c, r netlab.Namespace
	port int // the last source port used
}

func newStopLab(t *testing.T) *stopLab {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged tier: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged tier: needs root (CAP_BPF, CAP_NET_ADMIN)")
	}
	lab, err := netlab.New(fmt.Sprintf("trstop%d", os.Getpid()%10000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	b := &stopLab{port: 20000}
	var s netlab.Namespace
	for name, ns := range map[string]*netlab.Namespace{"c": &b.c, "r": &b.r, "s": &s} {
		if *ns, err = lab.Namespace(name); err != nil {
			t.Fatal(err)
		}
	}
	steps := []func() error{
		func() error { return lab.Link(b.c, "c-r", "10.79.1.2/24", b.r, "r-c", "10.79.1.1/24") },
		func() error { return lab.Link(b.r, "r-s", "10.79.2.1/24", s, "s-r", "10.79.2.2/24") },
		func() error { _, err := b.c.Run("ip", "route", "add", "default", "via", "10.79.1.1"); return err },
		func() error { _, err := s.Run("ip", "route", "add", "default", "via", "10.79.2.1"); return err },
		func() error { return b.r.Sysctl("net.ipv4.ip_forward", "1") },
		func() error {
			_, err := b.r.Run("iptables", "-t", "nat", "-A", "PREROUTING", "-d", "10.97.79.9", "-p", "udp", "--dport", "53",
				"-j", "DNAT", "--to-destination", "10.79.2.2:53")
			return err
		},
		// S drops the datagrams at a socket it never reads: no port
		// unreachable comes back.
		func() error {
			return s.Do(func() error {
				sink, err := net.ListenPacket("udp", "10.79.2.2:53")
				if err == nil {
					t.Cleanup(func() { sink.Close() })
				}
				return err
			})
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	b.send(t, 5) // resolve the path's neighbours before anything counts
	time.Sleep(300 * time.Millisecond)
	return b
}

// send makes n one-datagram connections through R's DNAT, each from a
// source port of its own, and returns the rule's count of them.
func (b *stopLab) send(t *testing.T, n int) uint64 {
	t.Helper()
	before := b.dnatCount(t)
	for range n {
		b.port++
		err := b.c.Do(func() error {
			d := net.Dialer{LocalAddr: &net.UDPAddr{Port: b.port}}
			conn, err := d.Dial("udp", "10.97.79.9:53")
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write([]byte("q"))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got := b.dnatCount(t) - before; got >= uint64(n) || time.Now().After(deadline) {
			return got
		}
	}
}

// start attaches the live pipeline to R (linger 0: the default); the
// test's cleanup closes it.
func (b *stopLab) start(ctx context.Context, t *testing.T, linger time.Duration) *Pipeline {
	t.Helper()
	ino, err := b.r.Inode()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(ctx, Config{Loader: loader.Config{Netns: []uint32{ino}, NetnsPaths: []string{b.r.Path()}},
		NetnsPath: b.r.Path(), NodeName: "node-1", Linger: linger})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func (b *stopLab) dnatCount(t *testing.T) uint64 {
	t.Helper()
	n, err := b.r.RulePackets("nat", "-p udp")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// stopBehind runs the pipeline on R with a consumer that takes nothing
// until the stop and then perEvent for each event, makes n connections,
// stops it, and returns the NAT decisions the rule counted, those the
// pipeline read, and its summary. The consumer is n*perEvent behind at
// the stop however long the sending took: a consumer that read while a
// slow guest sent was too little behind for the limit to show.
func stopBehind(t *testing.T, n int, perEvent time.Duration) (made, read uint64, sum trace.Summary) {
	b := newStopLab(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := b.start(ctx, t, 0)
	var seen atomic.Uint64
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var err error
		sum, err = p.Run(ctx, Sink{Flow: func(*trace.Flow) {}, Event: func(ev event.Event) {
			<-release
			if ev.Kind == event.KindDNAT && ev.Orig.DstPort == 53 {
				seen.Add(1)
			}
			pause(perEvent)
		}})
		done <- err
	}()
	made = b.send(t, n)
	stopped := time.Now()
	close(release)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Logf("%d made, %d read, %d lost (%d unread at the stop) in %v after the stop", made, seen.Load(), sum.LostEvents, sum.UnreadAtStop, time.Since(stopped).Round(time.Millisecond))
	return made, seen.Load(), sum
}

// pause takes d: a sleep, or a spin below the millisecond, which a sleep
// here rounds up to.
func pause(d time.Duration) {
	if d >= time.Millisecond {
		time.Sleep(d)
		return
	}
	for start := time.Now(); time.Since(start) < d; {
	}
}

// TestStopReadsWhatWasQueued: a consumer 0.24 s behind at the stop (more
// events than the read loop's channel holds, the rest in the ring
// buffer) still gets every event the kernel reported before it.
func TestStopReadsWhatWasQueued(t *testing.T) {
	made, read, sum := stopBehind(t, 1200, 200*time.Microsecond)
	if read != made || sum.LostEvents != 0 {
		t.Errorf("read %d of the %d NAT decisions R's rule made, %d counted lost; want all read", read, made, sum.LostEvents)
	}
}

// TestStopCountsWhatItCannotRead: a consumer far behind (10 s of events)
// stops after drainLimit; what it did not read is counted lost, unread at
// the stop, and adds up with what it read to what the rule made.
func TestStopCountsWhatItCannotRead(t *testing.T) {
	made, read, sum := stopBehind(t, 2000, 5*time.Millisecond)
	if sum.UnreadAtStop == 0 {
		t.Errorf("nothing counted unread at the stop of a consumer 10 s behind (%d read of %d)", read, made)
	}
	if read+sum.LostEvents != made || sum.LostEvents != sum.UnreadAtStop {
		t.Errorf("read %d + lost %d (unread %d) != %d NAT decisions R's rule made", read, sum.LostEvents, sum.UnreadAtStop, made)
	}
}
