package loader

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netlab"
)

// The privileged tier: real programs attached on this kernel, real
// namespaces, real iptables rules and real traffic. In the VM matrix
// (TRACER_VM_KERNEL set) the same tests run on Debian's kernels.

// Addresses of the test topology: client C -- router R -- server S.
const (
	cAddr  = "10.77.1.2"
	rAddrC = "10.77.1.1"
	rAddrS = "10.77.2.1"
	sAddr  = "10.77.2.2"
	vip    = "10.96.77.7"
	ipvsIP = "10.96.77.9"
)

// The same topology's IPv6 addresses (every link is dual-stack).
const (
	cAddr6  = "fd77:1::2"
	rAddrC6 = "fd77:1::1"
	rAddrS6 = "fd77:2::1"
	sAddr6  = "fd77:2::2"
	vip6    = "fd96:77::7"
	ipvsIP6 = "fd96:77::9"
)

// hostPort joins an address and a port as Go's net package writes them
// ("[addr]:port" for IPv6).
func hostPort(addr string, port int) string { return net.JoinHostPort(addr, fmt.Sprint(port)) }

func requirePrivileged(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged tier: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged tier: needs root (CAP_BPF, CAP_NET_ADMIN)")
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("privileged tier needs %s installed: %v", tool, err)
		}
	}
}

// vmKernel is the Debian kernel series under test in the VM matrix, or "".
func vmKernel() string { return os.Getenv("TRACER_VM_KERNEL") }

type topology struct {
	lab     *netlab.Lab
	c, r, s netlab.Namespace
	inodes  map[uint32]string
}

func newTopology(t *testing.T) *topology {
	t.Helper()
	lab, err := netlab.New(fmt.Sprintf("trtest%d", os.Getpid()%10000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("remove namespaces: %v", err)
		}
	})
	tp := &topology{lab: lab, inodes: map[uint32]string{}}
	for name, ns := range map[string]*netlab.Namespace{"c": &tp.c, "r": &tp.r, "s": &tp.s} {
		if *ns, err = lab.Namespace(name); err != nil {
			t.Fatal(err)
		}
		ino, err := ns.Inode()
		if err != nil {
			t.Fatal(err)
		}
		tp.inodes[ino] = name
	}
	must(t, lab.Link(tp.c, "c-r", cAddr+"/24", tp.r, "r-c", rAddrC+"/24"))
	must(t, lab.Link(tp.r, "r-s", rAddrS+"/24", tp.s, "s-r", sAddr+"/24"))
	run(t, tp.c, "ip", "route", "add", "default", "via", rAddrC)
	run(t, tp.s, "ip", "route", "add", "default", "via", rAddrS)
	must(t, tp.r.Sysctl("net.ipv4.ip_forward", "1"))
	// nodad: the addresses are usable at once, not after duplicate
	// address detection.
	for _, a := range []struct {
		ns        netlab.Namespace
		dev, cidr string
	}{{tp.c, "c-r", cAddr6 + "/64"}, {tp.r, "r-c", rAddrC6 + "/64"}, {tp.r, "r-s", rAddrS6 + "/64"}, {tp.s, "s-r", sAddr6 + "/64"}} {
		run(t, a.ns, "ip", "-6", "addr", "add", a.cidr, "dev", a.dev, "nodad")
	}
	run(t, tp.c, "ip", "-6", "route", "add", "default", "via", rAddrC6)
	run(t, tp.s, "ip", "-6", "route", "add", "default", "via", rAddrS6)
	must(t, tp.r.Sysctl("net.ipv6.conf.all.forwarding", "1"))
	must(t, netlab.SettleIPv6(10*time.Second, tp.c, tp.r, tp.s))
	return tp
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, ns netlab.Namespace, args ...string) {
	t.Helper()
	if _, err := ns.Run(args[0], args[1:]...); err != nil {
		t.Fatal(err)
	}
}

// flush removes every rule the scenarios add, in all three namespaces.
func (tp *topology) flush(t *testing.T) {
	for _, ns := range []netlab.Namespace{tp.c, tp.r, tp.s} {
		for _, table := range []string{"filter", "nat"} {
			run(t, ns, "iptables", "-t", table, "-F")
			run(t, ns, "ip6tables", "-t", table, "-F")
		}
	}
	if _, err := exec.LookPath("ipvsadm"); err == nil {
		tp.r.Run("ipvsadm", "-C") // fails harmlessly without IPVS
	}
}

// serve accepts TCP connections in ns on addr and writes one byte to each.
func serve(t *testing.T, ns netlab.Namespace, addr string) {
	acceptEach(t, ns, addr, func(c *net.TCPConn) { c.Write([]byte{'x'}) })
}

// acceptEach listens on addr in ns and hands each connection to do
// before closing it.
func acceptEach(t *testing.T, ns netlab.Namespace, addr string, do func(*net.TCPConn)) {
	t.Helper()
	var ln net.Listener
	must(t, ns.Do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			do(c.(*net.TCPConn))
			c.Close()
		}
	}()
}

// serveAndAbort accepts on addr in ns and aborts each connection (linger
// 0): the server's own reset.
func serveAndAbort(t *testing.T, ns netlab.Namespace, addr string) {
	acceptEach(t, ns, addr, func(c *net.TCPConn) { c.SetLinger(0) })
}

// dialTCP connects from ns and reads the server's byte; it returns the
// local address and the dial or read error.
func dialTCP(ns netlab.Namespace, addr string) (string, error) {
	var conn net.Conn
	// A fixed local port, so a refused connection still names its tuple;
	// another when an earlier connection's TIME_WAIT still holds it.
	var local *net.TCPAddr
	var err error
	for range 5 {
		local = &net.TCPAddr{Port: 20000 + rand.IntN(20000)}
		err = ns.Do(func() (err error) {
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: local}
			conn, err = d.Dial("tcp", addr)
			return err
		})
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		client := cAddr
		if strings.HasPrefix(addr, "[") {
			client = cAddr6
		}
		return hostPort(client, local.Port), err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	_, err = io.ReadFull(conn, make([]byte, 1))
	return conn.LocalAddr().String(), err
}

func sendUDP(ns netlab.Namespace, addr string) (string, error) {
	var conn net.Conn
	err := ns.Do(func() (err error) {
		conn, err = net.Dial("udp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_, err = conn.Write([]byte("ping"))
	return conn.LocalAddr().String(), err
}

// udpReject6 is a datagram that send makes to the server's port, which
// an ip6tables REJECT answers with ICMPv6 port unreachable.
func udpReject6(name string, port int, send func(netlab.Namespace, string) (string, error)) scenario {
	dst := hostPort(sAddr6, port)
	return scenario{
		name:    name,
		observe: router,
		setup: func(t *testing.T, tp *topology) {
			run(t, tp.r, "ip6tables", "-A", "FORWARD", "-p", "udp", "--dport", fmt.Sprint(port), "-j", "REJECT",
				"--reject-with", "icmp6-port-unreachable")
		},
		traffic: func(t *testing.T, tp *topology) string {
			client, err := send(tp.c, dst)
			must(t, err)
			return client
		},
		kinds: []event.Kind{event.KindReject, event.KindDrop},
		check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
			e := evs[event.KindReject]
			checkEq(t, "reject hook", e.Hook.String(), "icmp6_send")
			checkEq(t, "rejected packet proto", event.ProtoName(e.Packet.Proto), "udp")
			checkTuple(t, "rejected packet", e.Packet, client, dst)
			// ICMPv6 destination unreachable, port unreachable.
			checkEq(t, "icmpv6 type/code", fmt.Sprintf("%d/%d", e.ICMPType, e.ICMPCode), "1/4")
			checkEq(t, "dropped packet proto", event.ProtoName(evs[event.KindDrop].Packet.Proto), "udp")
			checkDrop(t, evs[event.KindDrop], client, dst, "NETFILTER_DROP")
		},
	}
}

// sendUDPDestOpts is sendUDP with an IPv6 destination options header
// (one PadN option) before the UDP header.
func sendUDPDestOpts(ns netlab.Namespace, addr string) (string, error) {
	var conn net.Conn
	err := ns.Do(func() (err error) {
		conn, err = net.Dial("udp6", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	raw, err := conn.(*net.UDPConn).SyscallConn()
	if err != nil {
		return "", err
	}
	// Next header (the kernel fills it), length 0 (8 bytes), PadN of 4.
	opts := string([]byte{0, 0, 1, 4, 0, 0, 0, 0})
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, opts)
	}); err != nil {
		return "", err
	}
	if serr != nil {
		return "", fmt.Errorf("set IPV6_DSTOPTS: %w", serr)
	}
	_, err = conn.Write([]byte("ping"))
	return conn.LocalAddr().String(), err
}

// collector reads the ring buffer and keeps the events of the lab.
type collector struct {
	events chan event.Event
	errs   chan error
}

func collect(tr *Tracer) *collector {
	c := &collector{events: make(chan event.Event, 4096), errs: make(chan error, 16)}
	go func() {
		for {
			ev, err := tr.Next()
			if errors.Is(err, os.ErrClosed) {
				close(c.events)
				return
			}
			if err != nil {
				select {
				case c.errs <- err:
				default:
				}
				continue
			}
			c.events <- ev
		}
	}()
	return c
}

// take returns the events seen in namespace ns until want events of the
// listed kinds arrived (or the timeout), plus anything else that arrives
// within the settle time after.
func (c *collector) take(t *testing.T, ns uint32, want int) []event.Event {
	t.Helper()
	var got []event.Event
	deadline := time.After(5 * time.Second)
	var settle <-chan time.Time
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				return got
			}
			// 0: a kernel without module BTF could not say (IPVS on 5.10).
			if ev.Netns != ns && ev.Netns != 0 {
				continue
			}
			got = append(got, ev)
			if len(got) >= want && settle == nil {
				settle = time.After(300 * time.Millisecond)
			}
		case err := <-c.errs:
			t.Errorf("ring buffer record did not decode: %v", err)
		case <-settle:
			return got
		case <-deadline:
			return got
		}
	}
}

// drain discards what is queued, between scenarios.
func (c *collector) drain() {
	time.Sleep(100 * time.Millisecond)
	for {
		select {
		case <-c.events:
		default:
			return
		}
	}
}

// tier is one way of attaching the whole set, tested separately where the
// kernel supports several.
type tier struct {
	name string
	only []event.Via
}

func tiersFor(t *testing.T) []tier {
	tiers := []tier{{name: "best"}}
	switch vmKernel() {
	case "5.10", "6.1":
		tiers = append(tiers, tier{"kprobe", []event.Via{event.ViaKprobe, event.ViaTracepoint}})
	case "6.12":
		tiers = append(tiers,
			tier{"kprobe", []event.Via{event.ViaKprobe, event.ViaTracepoint}},
			tier{"netfilter", []event.Via{event.ViaTracepoint, event.ViaNetfilter}})
	}
	return tiers
}

// expectedVia is what KERNELS.md measured for each kernel in the "best"
// tier; hooks not listed are checked only for consistency with the plan.
func expectedVia() map[event.Hook]event.Via {
	switch vmKernel() {
	case "5.10":
		return map[event.Hook]event.Via{event.HookNFNat: event.ViaKprobe, event.HookIPVSConnNew: event.ViaKprobe,
			event.HookICMPSend: event.ViaFentry, event.HookICMP6Send: event.ViaFentry, event.HookKfreeSkb: event.ViaTracepoint}
	case "6.1":
		return map[event.Hook]event.Via{event.HookNFNat: event.ViaFentry, event.HookIPVSConnNew: event.ViaKprobe,
			event.HookICMPSend: event.ViaFentry, event.HookICMP6Send: event.ViaFentry, event.HookKfreeSkb: event.ViaTracepoint}
	case "6.12":
		return map[event.Hook]event.Via{event.HookNFNat: event.ViaFentry, event.HookIPVSConnNew: event.ViaFentry,
			event.HookICMPSend: event.ViaFentry, event.HookICMP6Send: event.ViaFentry, event.HookKfreeSkb: event.ViaTracepoint,
			event.HookTCPSendReset: event.ViaTracepoint, event.HookTCPSendReset6: event.ViaTracepoint}
	case "":
		if !hasKprobes() {
			// This project's build machine: no kprobes, no fentry.
			return map[event.Hook]event.Via{event.HookNFNat: event.ViaNetfilter, event.HookICMPSend: event.ViaTracepoint,
				event.HookICMP6Send: event.ViaNetfilter, event.HookNFSendReset: event.ViaNetfilter,
				event.HookNFSendReset6: event.ViaNetfilter, event.HookTCPSendReset: event.ViaTracepoint,
				event.HookTCPSendReset6: event.ViaTracepoint, event.HookKfreeSkb: event.ViaTracepoint}
		}
	}
	return nil
}

// scenario is one kind of decision made for real.
type scenario struct {
	name    string
	observe func(tp *topology) netlab.Namespace
	setup   func(t *testing.T, tp *topology)
	// traffic makes the packets and returns the client's address.
	traffic func(t *testing.T, tp *topology) string
	kinds   []event.Kind
	check   func(t *testing.T, client string, evs map[event.Kind]event.Event)
	// needs, when set, says why the plan cannot show the scenario ("":
	// it can).
	needs func(Plan) string
}

func router(tp *topology) netlab.Namespace { return tp.r }

func clientNS(tp *topology) netlab.Namespace { return tp.c }

// tcpResetReject is a connection to dst that a REJECT --reject-with
// tcp-reset in chain of the observed namespace refuses: netfilter's RST
// (hook), and its drop of the packet.
func tcpResetReject(name string, observe func(*topology) netlab.Namespace, iptables, chain, dst, hook string) scenario {
	_, port, _ := net.SplitHostPort(dst)
	return scenario{
		name:    name,
		observe: observe,
		setup: func(t *testing.T, tp *topology) {
			run(t, observe(tp), iptables, "-A", chain, "-p", "tcp", "--dport", port, "-j", "REJECT",
				"--reject-with", "tcp-reset")
		},
		traffic: func(t *testing.T, tp *topology) string { return mustBeRefused(t, tp.c, dst) },
		kinds:   []event.Kind{event.KindReset, event.KindDrop},
		check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
			e := evs[event.KindReset]
			checkEq(t, "reset hook", e.Hook.String(), hook)
			checkTuple(t, "reset packet", e.Packet, client, dst)
			checkDrop(t, evs[event.KindDrop], client, dst, "NETFILTER_DROP")
		},
	}
}

func scenarios() []scenario {
	return []scenario{
		{
			name:    "dnat-output",
			observe: func(tp *topology) netlab.Namespace { return tp.c },
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.c, "iptables", "-t", "nat", "-A", "OUTPUT", "-d", vip, "-p", "tcp", "--dport", "80",
					"-j", "DNAT", "--to-destination", sAddr+":8080")
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, vip+":80") },
			kinds:   []event.Kind{event.KindDNAT},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindDNAT]
				checkTuple(t, "dnat orig", e.Orig, client, vip+":80")
				checkReply(t, e, sAddr+":8080", client)
				checkEq(t, "dnat to", e.To.String(), sAddr+":8080")
				checkNFHook(t, e, "OUTPUT")
			},
		},
		{
			name:    "dnat-prerouting",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", rAddrC, "-p", "tcp", "--dport", "80",
					"-j", "DNAT", "--to-destination", sAddr+":8080")
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, rAddrC+":80") },
			kinds:   []event.Kind{event.KindDNAT},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindDNAT]
				checkTuple(t, "dnat orig", e.Orig, client, rAddrC+":80")
				checkReply(t, e, sAddr+":8080", client)
				checkEq(t, "dnat to", e.To.String(), sAddr+":8080")
				checkNFHook(t, e, "PREROUTING")
			},
		},
		{
			name:    "masquerade",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "10.77.1.0/24", "-o", "r-s", "-j", "MASQUERADE")
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, sAddr+":8080") },
			kinds:   []event.Kind{event.KindSNAT},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindSNAT]
				checkTuple(t, "snat orig", e.Orig, client, sAddr+":8080")
				checkEq(t, "snat to address", e.To.MinAddr.String(), rAddrS)
				checkSNATReply(t, e, rAddrS)
				checkNFHook(t, e, "POSTROUTING")
			},
		},
		{
			name:    "snat",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "10.77.1.0/24", "-o", "r-s", "-j", "SNAT", "--to-source", rAddrS)
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, sAddr+":8080") },
			kinds:   []event.Kind{event.KindSNAT},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindSNAT]
				checkTuple(t, "snat orig", e.Orig, client, sAddr+":8080")
				checkEq(t, "snat to", e.To.MinAddr.String()+"-"+e.To.MaxAddr.String(), rAddrS+"-"+rAddrS)
				checkNFHook(t, e, "POSTROUTING")
			},
		},
		{
			// A firewall's DROP of a new connection's packet (its
			// conntrack match runs conntrack here): the entry, new and
			// never confirmed, is in no table to look up, so the event
			// carries it.
			name:    "drop-new-connection",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "iptables", "-A", "FORWARD", "-p", "udp", "--dport", "10", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP")
			},
			needs: func(Plan) string {
				if !LoadReasonNames().KnowsDropReason("NETFILTER_DROP") {
					return "this kernel gives the drop no reason (no SKB_DROP_REASON_NETFILTER_DROP), and a free without one is reported only for a packet the kernel answered"
				}
				return ""
			},
			traffic: func(t *testing.T, tp *topology) string {
				client, err := sendUDP(tp.c, sAddr+":10")
				must(t, err)
				return client
			},
			kinds: []event.Kind{event.KindDrop},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				checkDrop(t, evs[event.KindDrop], client, sAddr+":10", "NETFILTER_DROP")
				checkDropEntry(t, evs[event.KindDrop], client, sAddr+":10", sAddr+":10")
			},
		},
		{
			name:    "reject-icmp-port-unreachable",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "iptables", "-A", "FORWARD", "-p", "udp", "--dport", "9", "-j", "REJECT",
					"--reject-with", "icmp-port-unreachable")
			},
			traffic: func(t *testing.T, tp *topology) string {
				client, err := sendUDP(tp.c, sAddr+":9")
				must(t, err)
				return client
			},
			kinds: []event.Kind{event.KindReject, event.KindDrop},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindReject]
				checkTuple(t, "rejected packet", e.Packet, client, sAddr+":9")
				checkEq(t, "icmp type/code", fmt.Sprintf("%d/%d", e.ICMPType, e.ICMPCode), "3/3")
				checkDrop(t, evs[event.KindDrop], client, sAddr+":9", "NETFILTER_DROP")
			},
		},
		tcpResetReject("reject-tcp-reset", router, "iptables", "FORWARD", sAddr+":81", "nf_send_reset"),
		{
			// A server on a dual-stack socket ([::], as most Go and Java
			// servers listen) aborts an IPv4 connection: its socket is
			// AF_INET6 with v4-mapped addresses, its reset IPv4.
			name:    "active-reset-dual-stack-socket",
			observe: func(tp *topology) netlab.Namespace { return tp.s },
			setup:   func(t *testing.T, tp *topology) {},
			needs: func(p Plan) string {
				if viaOf(p, event.HookTCPSendReset) != event.ViaTracepoint {
					return "a socket's own reset (tcp_send_active_reset) is reported by the tcp_send_reset tracepoint only"
				}
				return ""
			},
			traffic: func(t *testing.T, tp *topology) string {
				client, err := dialTCP(tp.c, sAddr+":7070")
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("connect to the aborting server: want connection reset, got %v", err)
				}
				return client
			},
			kinds: []event.Kind{event.KindReset},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindReset]
				checkEq(t, "reset hook", e.Hook.String(), "tcp_send_reset")
				checkTuple(t, "reset connection", e.Packet, client, sAddr+":7070")
			},
		},
		{
			// A DNAT'd packet the router may not forward (forwarding off
			// on its way in): dropped without an answer, after its
			// translation, so its tuple is neither of its connection's
			// own; only its conntrack entry says it was translated.
			name:    "dnat-then-dropped-unforwarded",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", rAddrC, "-p", "udp", "--dport", "81",
					"-j", "DNAT", "--to-destination", sAddr+":8080")
			},
			needs: func(Plan) string {
				if !slices.Contains(slices.Collect(maps.Values(LoadReasonNames().drop)), "IP_INADDRERRORS") {
					return "this kernel gives the drop no reason (no SKB_DROP_REASON_IP_INADDRERRORS), and a free without one is reported only for a packet the kernel answered"
				}
				return ""
			},
			traffic: func(t *testing.T, tp *topology) string {
				const forwarding = "net.ipv4.conf.r-c.forwarding"
				before := ipStat(t, tp.r, "InAddrErrors")
				must(t, tp.r.Sysctl(forwarding, "0"))
				defer func() { must(t, tp.r.Sysctl(forwarding, "1")) }()
				client, err := sendUDP(tp.c, rAddrC+":81")
				must(t, err)
				// The kernel's own count of the drop, so forwarding is not
				// turned back on under the packet.
				deadline := time.Now().Add(5 * time.Second)
				for ipStat(t, tp.r, "InAddrErrors") == before {
					if time.Now().After(deadline) {
						t.Fatalf("the router's InAddrErrors stayed %d: the packet was not dropped as unforwardable", before)
					}
					time.Sleep(10 * time.Millisecond)
				}
				return client
			},
			kinds: []event.Kind{event.KindDNAT, event.KindDrop},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				checkEq(t, "dnat to", evs[event.KindDNAT].To.String(), sAddr+":8080")
				checkDrop(t, evs[event.KindDrop], client, sAddr+":8080", "IP_INADDRERRORS")
				checkDropEntry(t, evs[event.KindDrop], client, rAddrC+":81", sAddr+":8080")
			},
		},
		// The host's own packet rejected in OUTPUT (kube-proxy's
		// no-endpoint rules for the node's own clients): the answer
		// leaves beside the host's sockets' own packets.
		tcpResetReject("reject-output-tcp-reset", clientNS, "iptables", "OUTPUT", sAddr+":82", "nf_send_reset"),
		{
			name:    "closed-port",
			observe: func(tp *topology) netlab.Namespace { return tp.s },
			setup:   func(t *testing.T, tp *topology) {},
			traffic: func(t *testing.T, tp *topology) string { return mustBeRefused(t, tp.c, sAddr+":9999") },
			kinds:   []event.Kind{event.KindReset, event.KindDrop},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindReset]
				checkEq(t, "reset hook", e.Hook.String(), "tcp_send_reset")
				checkTuple(t, "reset packet", e.Packet, client, sAddr+":9999")
				if e.HasReason {
					checkEq(t, "reset reason", LoadReasonNames().ResetReason(e.Reason), "NO_SOCKET")
				}
				checkDrop(t, evs[event.KindDrop], client, sAddr+":9999", "NO_SOCKET")
			},
		},
	}
}

// scenarios6 are the scenarios' IPv6 twins: ip6tables rules, IPv6 traffic,
// ICMPv6 errors, and the IPv6 functions that send errors and resets.
func scenarios6() []scenario {
	return []scenario{
		{
			name:    "dnat6-output",
			observe: func(tp *topology) netlab.Namespace { return tp.c },
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.c, "ip6tables", "-t", "nat", "-A", "OUTPUT", "-d", vip6, "-p", "tcp", "--dport", "80",
					"-j", "DNAT", "--to-destination", hostPort(sAddr6, 8080))
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, hostPort(vip6, 80)) },
			kinds:   []event.Kind{event.KindDNAT},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindDNAT]
				checkTuple(t, "dnat orig", e.Orig, client, hostPort(vip6, 80))
				checkReply(t, e, hostPort(sAddr6, 8080), client)
				checkEq(t, "dnat to", e.To.String(), hostPort(sAddr6, 8080))
				checkNFHook(t, e, "OUTPUT")
			},
		},
		{
			name:    "dnat6-prerouting",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "ip6tables", "-t", "nat", "-A", "PREROUTING", "-d", rAddrC6, "-p", "tcp", "--dport", "80",
					"-j", "DNAT", "--to-destination", hostPort(sAddr6, 8080))
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, hostPort(rAddrC6, 80)) },
			kinds:   []event.Kind{event.KindDNAT},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindDNAT]
				checkTuple(t, "dnat orig", e.Orig, client, hostPort(rAddrC6, 80))
				checkReply(t, e, hostPort(sAddr6, 8080), client)
				checkEq(t, "dnat to", e.To.String(), hostPort(sAddr6, 8080))
				checkNFHook(t, e, "PREROUTING")
			},
		},
		{
			name:    "masquerade6",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "ip6tables", "-t", "nat", "-A", "POSTROUTING", "-s", "fd77:1::/64", "-o", "r-s", "-j", "MASQUERADE")
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, hostPort(sAddr6, 8080)) },
			kinds:   []event.Kind{event.KindSNAT},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindSNAT]
				checkTuple(t, "snat orig", e.Orig, client, hostPort(sAddr6, 8080))
				checkEq(t, "snat to address", e.To.MinAddr.String(), rAddrS6)
				checkSNATReply(t, e, rAddrS6)
				checkNFHook(t, e, "POSTROUTING")
			},
		},
		{
			name:    "snat6",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "ip6tables", "-t", "nat", "-A", "POSTROUTING", "-s", "fd77:1::/64", "-o", "r-s", "-j", "SNAT", "--to-source", rAddrS6)
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, hostPort(sAddr6, 8080)) },
			kinds:   []event.Kind{event.KindSNAT},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindSNAT]
				checkTuple(t, "snat orig", e.Orig, client, hostPort(sAddr6, 8080))
				checkEq(t, "snat to", e.To.MinAddr.String()+"-"+e.To.MaxAddr.String(), rAddrS6+"-"+rAddrS6)
				checkNFHook(t, e, "POSTROUTING")
			},
		},
		udpReject6("reject6-icmp6-port-unreachable", 9, sendUDP),
		// The rejected datagram carries a destination options header
		// between its IPv6 and UDP headers: the tuple is read past it.
		udpReject6("reject6-icmp6-extension-header", 10, sendUDPDestOpts),
		tcpResetReject("reject6-tcp-reset", router, "ip6tables", "FORWARD", hostPort(sAddr6, 81), "nf_send_reset6"),
		// IPv6's RST for the host's own packet goes with the sending
		// socket; where conntrack does not run, that tells it from the
		// stack's.
		tcpResetReject("reject6-output-tcp-reset", clientNS, "ip6tables", "OUTPUT", hostPort(sAddr6, 82), "nf_send_reset6"),
		{
			name:    "reject6-output-icmp6-port-unreachable",
			observe: clientNS,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.c, "ip6tables", "-A", "OUTPUT", "-p", "udp", "--dport", "83", "-j", "REJECT",
					"--reject-with", "icmp6-port-unreachable")
			},
			traffic: func(t *testing.T, tp *topology) string {
				// The sender's own datagram dropped in OUTPUT: the send
				// itself fails.
				client, err := sendUDP(tp.c, hostPort(sAddr6, 83))
				if !errors.Is(err, syscall.EPERM) {
					t.Fatalf("udp to [%s]:83: want the send refused (EPERM), got %v", sAddr6, err)
				}
				return client
			},
			kinds: []event.Kind{event.KindReject, event.KindDrop},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindReject]
				checkEq(t, "reject hook", e.Hook.String(), "icmp6_send")
				checkTuple(t, "rejected packet", e.Packet, client, hostPort(sAddr6, 83))
				checkEq(t, "icmpv6 type/code", fmt.Sprintf("%d/%d", e.ICMPType, e.ICMPCode), "1/4")
				checkDrop(t, evs[event.KindDrop], client, hostPort(sAddr6, 83), "NETFILTER_DROP")
			},
		},
		{
			name:    "closed-port6",
			observe: func(tp *topology) netlab.Namespace { return tp.s },
			setup:   func(t *testing.T, tp *topology) {},
			traffic: func(t *testing.T, tp *topology) string { return mustBeRefused(t, tp.c, hostPort(sAddr6, 9999)) },
			kinds:   []event.Kind{event.KindReset, event.KindDrop},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindReset]
				checkEq(t, "reset hook", e.Hook.String(), "tcp_send_reset6")
				checkTuple(t, "reset packet", e.Packet, client, hostPort(sAddr6, 9999))
				if e.HasReason {
					checkEq(t, "reset reason", LoadReasonNames().ResetReason(e.Reason), "NO_SOCKET")
				}
				checkDrop(t, evs[event.KindDrop], client, hostPort(sAddr6, 9999), "NO_SOCKET")
			},
		},
	}
}

// ipvsScenarios6 are IPVS's IPv6 virtual services.
func ipvsScenarios6() []scenario {
	return []scenario{
		{
			name:    "ipvs6-masq",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "ipvsadm", "-A", "-t", hostPort(ipvsIP6, 80), "-s", "rr")
				run(t, tp.r, "ipvsadm", "-a", "-t", hostPort(ipvsIP6, 80), "-r", hostPort(sAddr6, 8080), "-m")
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, hostPort(ipvsIP6, 80)) },
			kinds:   []event.Kind{event.KindIPVS},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindIPVS]
				checkTuple(t, "ipvs client->virtual", e.Orig, client, hostPort(ipvsIP6, 80))
				checkEq(t, "real server", netip.AddrPortFrom(e.To.MinAddr, e.To.MinPort).String(), hostPort(sAddr6, 8080))
				checkEq(t, "forwarding", event.IPVSForward(e.Reason), "masq")
			},
		},
		{
			// UDP: one datagram is one packet. A TCP SYN is sent again
			// when the error arrives while connect holds the socket (seen
			// on 5.10), and each SYN is answered with its own events.
			name:    "ipvs6-no-real-server",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "ipvsadm", "-A", "-u", hostPort(ipvsIP6, 81), "-s", "rr")
			},
			traffic: func(t *testing.T, tp *topology) string { return mustBeRefusedUDP(t, tp.c, hostPort(ipvsIP6, 81)) },
			kinds:   []event.Kind{event.KindIPVSNoDest, event.KindReject, event.KindDrop},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindIPVSNoDest]
				checkTuple(t, "ipvs-no-dest virtual", e.Orig, client, hostPort(ipvsIP6, 81))
				r := evs[event.KindReject]
				checkEq(t, "reject hook", r.Hook.String(), "icmp6_send")
				checkEq(t, "icmpv6 type/code", fmt.Sprintf("%d/%d", r.ICMPType, r.ICMPCode), "1/4")
				checkDrop(t, evs[event.KindDrop], client, hostPort(ipvsIP6, 81), "NETFILTER_DROP")
			},
		},
	}
}

// ipvsScenarios need the ip_vs module: the VM matrix kernels have it,
// this project's build machine does not.
func ipvsScenarios() []scenario {
	return []scenario{
		{
			name:    "ipvs-masq",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "ipvsadm", "-A", "-t", ipvsIP+":80", "-s", "rr")
				run(t, tp.r, "ipvsadm", "-a", "-t", ipvsIP+":80", "-r", sAddr+":8080", "-m")
			},
			traffic: func(t *testing.T, tp *topology) string { return mustConnect(t, tp.c, ipvsIP+":80") },
			kinds:   []event.Kind{event.KindIPVS},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindIPVS]
				checkTuple(t, "ipvs client->virtual", e.Orig, client, ipvsIP+":80")
				checkEq(t, "real server", netip.AddrPortFrom(e.To.MinAddr, e.To.MinPort).String(), sAddr+":8080")
				checkEq(t, "forwarding", event.IPVSForward(e.Reason), "masq")
			},
		},
		{
			name:    "ipvs-no-real-server",
			observe: router,
			setup: func(t *testing.T, tp *topology) {
				run(t, tp.r, "ipvsadm", "-A", "-t", ipvsIP+":81", "-s", "rr")
			},
			traffic: func(t *testing.T, tp *topology) string { return mustBeUnreachable(t, tp.c, ipvsIP+":81") },
			kinds:   []event.Kind{event.KindIPVSNoDest, event.KindReject, event.KindDrop},
			check: func(t *testing.T, client string, evs map[event.Kind]event.Event) {
				e := evs[event.KindIPVSNoDest]
				checkTuple(t, "ipvs-no-dest virtual", e.Orig, client, ipvsIP+":81")
				checkTuple(t, "packet", e.Packet, client, ipvsIP+":81")
				r := evs[event.KindReject]
				checkEq(t, "icmp type/code", fmt.Sprintf("%d/%d", r.ICMPType, r.ICMPCode), "3/3")
				checkDrop(t, evs[event.KindDrop], client, ipvsIP+":81", "NETFILTER_DROP")
			},
		},
	}
}

// haveIPVS loads the IPVS modules where the kernel has them. In the VM
// matrix every kernel has IPVS, so failing there is an error, not a skip.
func haveIPVS(t *testing.T) bool {
	t.Helper()
	out, err := exec.Command("modprobe", "-a", "ip_vs", "ip_vs_rr").CombinedOutput()
	if err != nil {
		if vmKernel() != "" {
			t.Fatalf("modprobe ip_vs on Debian %s: %v: %s", vmKernel(), err, out)
		}
		t.Logf("IPVS scenarios skipped: this kernel has no IPVS (modprobe ip_vs: %s)", strings.TrimSpace(string(out)))
		return false
	}
	if _, err := exec.LookPath("ipvsadm"); err != nil {
		t.Fatalf("IPVS scenarios need ipvsadm: %v", err)
	}
	return true
}

// mustBeUnreachable expects the connection to fail with an ICMP error.
func mustBeUnreachable(t *testing.T, ns netlab.Namespace, addr string) string {
	t.Helper()
	client, err := dialTCP(ns, addr)
	if err == nil || !(strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), "unreachable")) {
		t.Fatalf("connect to %s: want an ICMP error, got %v", addr, err)
	}
	return client
}

// mustBeRefusedUDP sends one datagram and expects the ICMP error it
// draws to reach the client's socket as "connection refused".
func mustBeRefusedUDP(t *testing.T, ns netlab.Namespace, addr string) string {
	t.Helper()
	var client string
	err := ns.Do(func() error {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		client = conn.LocalAddr().String()
		if _, err := conn.Write([]byte("ping")); err != nil {
			return err
		}
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("udp to %s: want connection refused (an ICMP port unreachable), got %v", addr, err)
	}
	return client
}

func mustConnect(t *testing.T, ns netlab.Namespace, addr string) string {
	t.Helper()
	client, err := dialTCP(ns, addr)
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	return client
}

func mustBeRefused(t *testing.T, ns netlab.Namespace, addr string) string {
	t.Helper()
	client, err := dialTCP(ns, addr)
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("connect to %s: want connection refused, got %v", addr, err)
	}
	return client
}

func checkEq(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %q, want %q", what, got, want)
	}
}

func checkTuple(t *testing.T, what string, tu event.Tuple, src, dst string) {
	t.Helper()
	checkEq(t, what+" src", tu.SrcAddrPort().String(), src)
	checkEq(t, what+" dst", tu.DstAddrPort().String(), dst)
}

// checkReply: only the netfilter tier sees the reply tuple after NAT; the
// entry hooks (fentry, kprobe) leave it to conntrack and must not report
// the untranslated one.
// checkReply: where the hook reads the reply tuple after NAT chose it
// (afterNAT), it is the one NAT made.
func checkReply(t *testing.T, e event.Event, src, dst string) {
	t.Helper()
	if afterNAT(t, e) {
		checkTuple(t, "reply", e.Reply, src, dst)
	}
}

// checkSNATReply: where the hook reads the reply tuple after NAT
// (afterNAT), it goes back to the address the SNAT chose (its port may be
// remapped).
func checkSNATReply(t *testing.T, e event.Event, to string) {
	t.Helper()
	if afterNAT(t, e) {
		checkEq(t, "snat reply dst", e.Reply.Dst.String(), to)
	}
}

// afterNAT says whether e's hook reads the reply tuple after NAT chose
// it: the netfilter hooks and fexit (the fentry tier) do. A kprobe runs
// before the call, and must report none.
func afterNAT(t *testing.T, e event.Event) bool {
	t.Helper()
	if e.Via == event.ViaNetfilter || e.Via == event.ViaFentry {
		return true
	}
	if e.Reply.Valid() {
		t.Errorf("%s reported a reply tuple before NAT chose it: %+v", e.Via, e.Reply)
	}
	return false
}

func checkNFHook(t *testing.T, e event.Event, want string) {
	t.Helper()
	if e.Via == event.ViaNetfilter {
		checkEq(t, "netfilter hook", event.NFHookName(e.NFHook), want)
	}
}

func checkDrop(t *testing.T, e event.Event, src, dst, reason string) {
	t.Helper()
	checkTuple(t, "dropped packet", e.Packet, src, dst)
	if e.HasReason {
		checkEq(t, "drop reason", LoadReasonNames().DropReason(e.Reason), reason)
	}
}

// checkDropEntry: a dropped packet that had a conntrack entry carries its
// tuples, as the client made the connection (origDst: where it sent it)
// and as the kernel would answer it (replySrc: where it went).
func checkDropEntry(t *testing.T, e event.Event, client, origDst, replySrc string) {
	t.Helper()
	if !e.Orig.Valid() || !e.Reply.Valid() {
		t.Errorf("dropped packet's conntrack entry: not reported (orig %v, reply %v, no_ct %v)", e.Orig, e.Reply, e.NoCT)
		return
	}
	checkTuple(t, "dropped packet's entry orig", e.Orig, client, origDst)
	checkTuple(t, "dropped packet's entry reply", e.Reply, replySrc, client)
}

func TestCapture(t *testing.T) {
	requirePrivileged(t)
	tp := newTopology(t)
	serve(t, tp.s, sAddr+":8080")
	serve(t, tp.s, hostPort(sAddr6, 8080))
	serveAndAbort(t, tp.s, "[::]:7070")
	all := append(scenarios(), scenarios6()...)
	if haveIPVS(t) {
		run(t, tp.r, "ip", "addr", "add", ipvsIP+"/32", "dev", "lo")
		run(t, tp.r, "ip", "-6", "addr", "add", ipvsIP6+"/128", "dev", "lo", "nodad")
		all = append(all, ipvsScenarios()...)
		all = append(all, ipvsScenarios6()...)
	}
	// Rules first: they load the nf_nat and reject modules whose functions
	// the fentry and kprobe rungs attach to.
	for _, sc := range all {
		sc.setup(t, tp)
	}
	tp.flush(t)
	paths := []string{tp.c.Path(), tp.r.Path(), tp.s.Path()}
	for _, tr := range tiersFor(t) {
		t.Run(tr.name, func(t *testing.T) {
			start := time.Now()
			trc, err := Open(Config{NetnsPaths: paths, Only: tr.only})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			t.Logf("attached in %v:\n%s", time.Since(start), trc.Plan.Reasons())
			defer trc.Close()
			checkPlan(t, trc.Plan, tr)
			col := collect(trc)
			for _, sc := range all {
				t.Run(sc.name, func(t *testing.T) {
					if usesIPVS(sc) && tr.name != "best" && viaOf(trc.Plan, event.HookIPVSConnNew) == event.ViaNone {
						t.Skipf("IPVS has no %s-tier hook: its ladder is fentry and kprobe only", tr.name)
					}
					if sc.needs != nil {
						if why := sc.needs(trc.Plan); why != "" {
							t.Skip(why)
						}
					}
					tp.flush(t)
					sc.setup(t, tp)
					col.drain()
					ns := sc.observe(tp)
					ino, _ := ns.Inode()
					client := sc.traffic(t, tp)
					got := col.take(t, ino, len(sc.kinds))
					byKind := checkKinds(t, got, sc.kinds, trc.Plan)
					if len(byKind) == len(sc.kinds) {
						sc.check(t, client, byKind)
					}
				})
			}
			lost, err := trc.Lost()
			must(t, err)
			if len(lost) > 0 {
				t.Errorf("lost events: %v", lost)
			}
		})
	}
}

func usesIPVS(sc scenario) bool {
	return slices.Contains(sc.kinds, event.KindIPVS) || slices.Contains(sc.kinds, event.KindIPVSNoDest)
}

func viaOf(p Plan, h event.Hook) event.Via {
	for _, hp := range p {
		if hp.Hook == h {
			return hp.Via
		}
	}
	return event.ViaNone
}

// checkKinds asserts the events are exactly the expected kinds, one each,
// each reported by the method the plan chose for its hook.
func checkKinds(t *testing.T, got []event.Event, want []event.Kind, plan Plan) map[event.Kind]event.Event {
	t.Helper()
	byKind := map[event.Kind]event.Event{}
	var kinds []event.Kind
	for _, e := range got {
		kinds = append(kinds, e.Kind)
		byKind[e.Kind] = e
		for _, hp := range plan {
			if hp.Hook == e.Hook && hp.Via != e.Via {
				t.Errorf("%s event via %s, but the plan attached %s via %s", e.Kind, e.Via, hp.Hook, hp.Via)
			}
		}
	}
	sortKinds := func(k []event.Kind) []event.Kind {
		k = slices.Clone(k)
		slices.Sort(k)
		return k
	}
	if !slices.Equal(sortKinds(kinds), sortKinds(want)) {
		t.Errorf("events: got kinds %v, want exactly %v", kinds, want)
		for _, e := range got {
			t.Logf("  %+v", e)
		}
	}
	return byKind
}

// checkPlan asserts the methods this kernel is known to allow were chosen.
func checkPlan(t *testing.T, plan Plan, tr tier) {
	t.Helper()
	for _, hp := range plan {
		if len(tr.only) > 0 && hp.Via != event.ViaNone && !slices.Contains(tr.only, hp.Via) {
			t.Errorf("%s attached via %s outside the tier %v", hp.Hook, hp.Via, tr.only)
		}
	}
	if tr.name != "best" {
		for _, h := range []event.Hook{event.HookNFNat, event.HookICMPSend, event.HookICMP6Send, event.HookNFSendReset,
			event.HookNFSendReset6, event.HookTCPSendReset, event.HookTCPSendReset6, event.HookKfreeSkb} {
			if plan[slices.IndexFunc(plan, func(p HookPlan) bool { return p.Hook == h })].Via == event.ViaNone {
				t.Errorf("tier %s: %s did not attach: %s", tr.name, h, plan.Reasons())
			}
		}
		return
	}
	for h, want := range expectedVia() {
		for _, hp := range plan {
			if hp.Hook == h && hp.Via != want && !(h == event.HookIPVSConnNew && hp.Via == event.ViaNone && vmKernel() == "") {
				t.Errorf("%s: attached via %s, want %s on this kernel (%s)", h, hp.Via, want, hp.Summary())
			}
		}
	}
}

// ipStat reads one of the Ip: counters of /proc/net/snmp in ns.
func ipStat(t *testing.T, ns netlab.Namespace, name string) uint64 {
	t.Helper()
	var b []byte
	must(t, ns.Do(func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	}))
	var names []string
	for line := range strings.Lines(string(b)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "Ip:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		if i := slices.Index(names, name); i > 0 && i < len(fields) {
			n, err := strconv.ParseUint(fields[i], 10, 64)
			must(t, err)
			return n
		}
	}
	t.Fatalf("/proc/net/snmp has no Ip: %s", name)
	return 0
}
