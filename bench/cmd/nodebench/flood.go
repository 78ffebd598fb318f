package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The flood: one-datagram UDP connections from C to VIP:53, which R's
// DNAT sends to S:5353. A TCP connection costs the machine a handshake
// and a close in three namespaces, so the TCP ramp stops near 11,000
// connections/s, below where either the tracer or conntrack -E loses; a
// datagram from a source address and port no earlier one used is a new
// conntrack entry and a new NAT decision for a fraction of that, so the
// flood ramp goes several times higher.
const (
	uport      = 53
	userveport = 5353
	// floodPorts and floodHosts are the flood's source tuples: ports
	// 1024-65535 of addresses .10 to .249 of C's subnet, 15 million
	// before one repeats, 100 s at 150,000 a second, against R's UDP
	// timeout of 1 s (floodUDPTimeout).
	floodPorts = 64512
	floodHosts = 240
	// floodUDPTimeout is R's conntrack timeout for UDP (the lab's
	// namespace only): unreplied entries go after a second, so the
	// flood's entries stay far below the table's limit.
	floodUDPTimeout = "1"
)

// floodSetup adds the flood's DNAT rule to R and its listener to S: S
// binds the port and never reads, so the datagrams are dropped at its
// socket, not answered with port unreachable.
func (b *lab) floodSetup() error {
	steps := []func() error{
		func() error { return b.r.Sysctl("net.netfilter.nf_conntrack_udp_timeout", floodUDPTimeout) },
		func() error {
			return nsRun(b.r, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", vip, "-p", "udp", "--dport", fmt.Sprint(uport),
				"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", sAddr, userveport))
		},
		func() error {
			return b.s.Do(func() (err error) {
				if b.udpSink, err = net.ListenPacket("udp", net.JoinHostPort(sAddr, fmt.Sprint(userveport))); err != nil {
					return fmt.Errorf("server udp socket: %w", err)
				}
				return nil
			})
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// udpDNATCount is how many packets R's UDP DNAT rule has translated: the
// kernel's own count of the flood's NAT decisions (each datagram is a new
// connection, and the nat table sees only a connection's first packet).
func (b *lab) udpDNATCount() (uint64, error) {
	return b.r.RulePackets("nat", "-A PREROUTING", "-p udp")
}

// flood sends one-datagram connections at rate a second (over every
// sender: one per CPU) for d, as fast as the machine allows when it
// cannot keep the rate. OK is the DNAT rule's count over the window: the
// NAT decisions the kernel made, whatever the senders believe they sent.
func (b *lab) flood(ctx context.Context, rate int, d time.Duration) (load, error) {
	return b.floodCounted(ctx, rate, d, b.udpDNATCount)
}

// floodCounted is flood whose OK is count's rise over the window: the
// packets a rule of R's matched.
func (b *lab) floodCounted(ctx context.Context, rate int, d time.Duration, count func() (uint64, error)) (load, error) {
	before, err := count()
	if err != nil {
		return load{}, err
	}
	senders := runtime.NumCPU()
	var failed atomic.Uint64
	var wg sync.WaitGroup
	errc := make(chan error, senders)
	start := time.Now()
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- b.floodSender(ctx, float64(rate)/float64(senders), start, start.Add(d), &failed)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	for err := range errc {
		if err != nil {
			return load{}, err
		}
	}
	after, err := settledCount(count)
	if err != nil {
		return load{}, err
	}
	return load{OK: after - before, Failed: failed.Load(), Elapsed: elapsed}, nil
}

// settledCount is a rule's count once it stops rising: a busy machine
// leaves datagrams in its backlog queues (softirq deferred to ksoftirqd)
// after the senders return.
func settledCount(count func() (uint64, error)) (uint64, error) {
	last, err := count()
	for range 50 {
		if err != nil {
			return 0, err
		}
		time.Sleep(100 * time.Millisecond)
		var n uint64
		if n, err = count(); err == nil && n == last {
			return n, nil
		}
		last = n
	}
	return last, err
}

// floodSender is one sender: a raw socket in C that writes whole IPv4
// packets, so each can come from a source address and port of its own.
func (b *lab) floodSender(ctx context.Context, perSecond float64, start, deadline time.Time, failed *atomic.Uint64) error {
	var fd int
	err := b.c.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		return err
	})
	if err != nil {
		return fmt.Errorf("flood sender socket: %w", err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrInet4{Addr: vip4}
	var pkt [29]byte
	for sent := 0; ; {
		now := time.Now()
		if !now.Before(deadline) || ctx.Err() != nil {
			return nil
		}
		due := int(perSecond * now.Sub(start).Seconds())
		if sent >= due {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		for ; sent < due; sent++ {
			floodPacket(&pkt, b.floodNext.Add(1))
			if err := unix.Sendto(fd, pkt[:], 0, to); err != nil {
				failed.Add(1)
			}
		}
	}
}

var cAddr4, vip4 = netip.MustParseAddr(cAddr).As4(), netip.MustParseAddr(vip).As4()

// floodPacket writes the n-th datagram of the flood: an IPv4 header
// (the kernel fills in its length, id and checksum), a UDP header
// without a checksum, and one byte.
func floodPacket(pkt *[29]byte, n uint64) {
	src := cAddr4
	src[3] = byte(10 + n/floodPorts%floodHosts)
	dst := vip4
	be := binary.BigEndian
	pkt[0] = 0x45
	pkt[8] = 64 // TTL
	pkt[9] = unix.IPPROTO_UDP
	copy(pkt[12:16], src[:])
	copy(pkt[16:20], dst[:])
	be.PutUint16(pkt[20:], uint16(1024+n%floodPorts))
	be.PutUint16(pkt[22:], uport)
	be.PutUint16(pkt[24:], 9) // UDP length: header and one byte
	be.PutUint16(pkt[26:], 0) // no checksum (IPv4 allows it)
	pkt[28] = 'x'
}
