package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/netlab"
)

// Topology: client C -- router R (DNAT VIP:80 -> S:8080) -- server S.
// Every address is inside the lab's namespaces.
const (
	cAddr  = "10.78.1.2"
	rAddrC = "10.78.1.1"
	rAddrS = "10.78.2.1"
	sAddr  = "10.78.2.2"
	vip    = "10.97.78.8"
	vport  = 80
	sport  = 8080
)

type lab struct {
	l       *netlab.Lab
	c, r, s netlab.Namespace
	rInode  uint32
	ln      net.Listener
	served  atomic.Uint64
	// udpSink is S's socket for the flood (floodSetup); floodNext
	// numbers the flood's datagrams, so no two share a tuple.
	udpSink   net.PacketConn
	floodNext atomic.Uint64
	// only restricts the tracer's ladders to these tiers (-only), so a
	// kernel that allows fentry can be measured with kprobes too.
	only []event.Via
}

// loaderConfig is how every observer attaches the tracer to the lab: the
// router namespace only.
func (b *lab) loaderConfig() loader.Config {
	return loader.Config{Netns: []uint32{b.rInode}, NetnsPaths: []string{b.r.Path()}, Only: b.only}
}

func newLab(prefix string) (*lab, error) {
	nl, err := netlab.New(prefix)
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	b := &lab{l: nl}
	for name, ns := range map[string]*netlab.Namespace{"c": &b.c, "r": &b.r, "s": &b.s} {
		if *ns, err = nl.Namespace(name); err != nil {
			b.close()
			return nil, fmt.Errorf("lab namespace %s: %w", name, err)
		}
	}
	if b.rInode, err = b.r.Inode(); err != nil {
		b.close()
		return nil, err
	}
	steps := []func() error{
		func() error { return nl.Link(b.c, "c-r", cAddr+"/24", b.r, "r-c", rAddrC+"/24") },
		func() error { return nl.Link(b.r, "r-s", rAddrS+"/24", b.s, "s-r", sAddr+"/24") },
		func() error { return nsRun(b.c, "ip", "route", "add", "default", "via", rAddrC) },
		func() error { return nsRun(b.s, "ip", "route", "add", "default", "via", rAddrS) },
		func() error { return b.r.Sysctl("net.ipv4.ip_forward", "1") },
		// Many short connections: the client may use every port, and the
		// router's conntrack forgets closed connections after 2 s instead of
		// 120 s, so the table never fills (the lab's namespaces only).
		func() error { return b.c.Sysctl("net.ipv4.ip_local_port_range", "1024 65000") },
		func() error { return b.s.Sysctl("net.ipv4.tcp_max_syn_backlog", "8192") },
		func() error {
			return nsRun(b.r, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", vip, "-p", "tcp", "--dport", fmt.Sprint(vport),
				"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", sAddr, sport))
		},
		func() error { return b.r.Sysctl("net.netfilter.nf_conntrack_tcp_timeout_time_wait", "2") },
		func() error { return b.r.Sysctl("net.netfilter.nf_conntrack_tcp_timeout_close_wait", "2") },
		func() error { return b.r.Sysctl("net.netfilter.nf_conntrack_tcp_timeout_fin_wait", "2") },
		func() error { return b.r.Sysctl("net.netfilter.nf_conntrack_tcp_timeout_last_ack", "2") },
		b.serve,
		b.floodSetup,
	}
	for _, s := range steps {
		if err := s(); err != nil {
			b.close()
			return nil, err
		}
	}
	return b, nil
}

func nsRun(ns netlab.Namespace, args ...string) error {
	_, err := ns.Run(args[0], args[1:]...)
	return err
}

// serve accepts in S: one byte to each connection, then close (the server
// closes first, so TIME_WAIT stays on the server side).
func (b *lab) serve() error {
	err := b.s.Do(func() (err error) {
		b.ln, err = net.Listen("tcp", fmt.Sprintf("%s:%d", sAddr, sport))
		return err
	})
	if err != nil {
		return fmt.Errorf("server listen: %w", err)
	}
	for range 2 {
		go func() {
			for {
				c, err := b.ln.Accept()
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				c.Write([]byte{'x'})
				c.Close()
				b.served.Add(1)
			}
		}()
	}
	return nil
}

func (b *lab) close() error {
	if b.ln != nil {
		b.ln.Close()
	}
	if b.udpSink != nil {
		b.udpSink.Close()
	}
	return b.l.Close()
}

// load is the outcome of one traffic window.
type load struct {
	OK, Failed uint64
	Elapsed    time.Duration
}

func (l load) rate() float64 { return float64(l.OK) / l.Elapsed.Seconds() }

// traffic runs workers client goroutines, each on a thread in C, making
// short-lived connections to VIP:80 (connect, read the byte, close) until
// d has passed. Every loop ends by itself at the deadline.
func (b *lab) traffic(ctx context.Context, workers int, d time.Duration) (load, error) {
	var ok, failed atomic.Uint64
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	start := time.Now()
	deadline := start.Add(d)
	addr := net.JoinHostPort(vip, fmt.Sprint(vport))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- b.c.Do(func() error {
				buf := make([]byte, 1)
				dl := net.Dialer{Timeout: time.Second}
				for time.Now().Before(deadline) && ctx.Err() == nil {
					conn, err := dl.Dial("tcp", addr)
					if err != nil {
						failed.Add(1)
						continue
					}
					conn.SetDeadline(time.Now().Add(time.Second))
					if _, err := io.ReadFull(conn, buf); err != nil {
						failed.Add(1)
					} else {
						ok.Add(1)
					}
					conn.Close()
				}
				return nil
			})
		}()
	}
	wg.Wait()
	close(errc)
	res := load{OK: ok.Load(), Failed: failed.Load(), Elapsed: time.Since(start)}
	for err := range errc {
		if err != nil {
			return res, fmt.Errorf("client worker: %w", err)
		}
	}
	return res, nil
}
