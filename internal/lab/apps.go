package lab

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// How long a client waits before it calls an attempt a timeout: longer
// than the first SYN retransmission (1 s), so a dropped SYN is retried once.
const (
	connectTimeout = 3 * time.Second
	answerTimeout  = 2 * time.Second
)

// serve starts, inside ns, a server for every port that answers each
// connection (TCP) or datagram (UDP) with the pod's name.
func (c *cluster) serve(ns netlab.Namespace, name string, ports []containerPort) error {
	for _, p := range ports {
		var err error
		switch p.Proto {
		case "tcp":
			err = c.serveTCP(ns, name, c.network("tcp"), p.Port)
		case "udp":
			err = c.serveUDP(ns, name, c.network("udp"), p.Port)
		default:
			err = fmt.Errorf("unknown protocol %q", p.Proto)
		}
		if err != nil {
			return fmt.Errorf("serve %s %s/%d: %w", name, p.Proto, p.Port, err)
		}
	}
	return nil
}

// network is what the servers listen on: IPv4 only, or in a dual-stack
// cluster one dual-stack socket ([::] without IPV6_V6ONLY) for both
// families, as most servers do. The socket is asked for explicitly:
// Go's "tcp" takes dual-stack only where its once-per-process probe,
// made in whichever namespace it first ran, found IPv4-mapped addresses.
func (c *cluster) network(proto string) string {
	if c.dualStack {
		return proto + "6"
	}
	return proto + "4"
}

// listenConfig clears IPV6_V6ONLY, which Go sets on every tcp6 and udp6
// socket, so an IPv6 wildcard socket takes IPv4 too.
var listenConfig = net.ListenConfig{Control: func(network, _ string, rc syscall.RawConn) error {
	if network != "tcp6" && network != "udp6" {
		return nil
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
	}); err != nil {
		return err
	}
	return serr
}}

func (c *cluster) serveTCP(ns netlab.Namespace, name, network string, port int) error {
	var ln net.Listener
	err := ns.Do(func() error {
		var err error
		ln, err = listenConfig.Listen(context.Background(), network, ":"+strconv.Itoa(port))
		return err
	})
	if err != nil {
		return err
	}
	c.closers = append(c.closers, ln.Close)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // closed
			}
			go func() {
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(answerTimeout))
				fmt.Fprintf(conn, "%s\n", name)
			}()
		}
	}()
	return nil
}

func (c *cluster) serveUDP(ns netlab.Namespace, name, network string, port int) error {
	var pc net.PacketConn
	err := ns.Do(func() error {
		var err error
		pc, err = listenConfig.ListenPacket(context.Background(), network, ":"+strconv.Itoa(port))
		return err
	})
	if err != nil {
		return err
	}
	c.closers = append(c.closers, pc.Close)
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			pc.WriteTo([]byte(name+"\n"), from)
		}
	}()
	return nil
}

// dialTCP connects from srcIP inside ns to dst and reports the source
// address it used and what it saw: "connected to NAME", refused, reset or
// timeout. The source port is bound before connect so it is known even
// when the connection fails.
func dialTCP(ctx context.Context, ns netlab.Namespace, srcIP, dst string) (src, saw string, err error) {
	err = ns.Do(func() error {
		var port int
		d := net.Dialer{Timeout: connectTimeout, Control: bindControl(srcIP, &port)}
		conn, derr := d.DialContext(ctx, familyNetwork("tcp", srcIP), dst)
		src = net.JoinHostPort(srcIP, strconv.Itoa(port))
		if derr != nil {
			saw = classify(derr)
			return nil
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(answerTimeout))
		line, rerr := bufio.NewReader(conn).ReadString('\n')
		if rerr != nil && line == "" {
			saw = "connected, no answer: " + classify(rerr)
			return nil
		}
		saw = Connected(strings.TrimSpace(line))
		return nil
	})
	if err != nil {
		return "", "", fmt.Errorf("dial %s from %s: %w", dst, ns.Name, err)
	}
	return src, saw, nil
}

// familyNetwork is proto4 or proto6, by the family of the source address.
func familyNetwork(proto, srcIP string) string {
	if strings.Contains(srcIP, ":") {
		return proto + "6"
	}
	return proto + "4"
}

// bindControl binds the socket to ip with an ephemeral port before connect
// and records the port.
func bindControl(ip string, port *int) func(string, string, syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var berr error
		err := rc.Control(func(fd uintptr) {
			var sa unix.Sockaddr
			if a := net.ParseIP(ip); a.To4() != nil {
				sa4 := &unix.SockaddrInet4{}
				copy(sa4.Addr[:], a.To4())
				sa = sa4
			} else {
				sa6 := &unix.SockaddrInet6{}
				copy(sa6.Addr[:], a.To16())
				sa = sa6
			}
			if berr = unix.Bind(int(fd), sa); berr != nil {
				return
			}
			var got unix.Sockaddr
			if got, berr = unix.Getsockname(int(fd)); berr == nil {
				switch g := got.(type) {
				case *unix.SockaddrInet4:
					*port = g.Port
				case *unix.SockaddrInet6:
					*port = g.Port
				}
			}
		})
		if err != nil {
			return err
		}
		if berr != nil {
			return fmt.Errorf("bind %s: %w", ip, berr)
		}
		return nil
	}
}

// classify turns a socket error into what a user would say they saw.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return OutcomeRefused
	case errors.Is(err, syscall.ECONNRESET):
		return OutcomeReset
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return OutcomeTimeout
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	}
	return "error: " + err.Error()
}

// exchangeUDP sends one datagram from srcIP inside ns to dst on a connected
// socket (so an ICMP error comes back as ECONNREFUSED) and reports the
// answer.
func exchangeUDP(ctx context.Context, ns netlab.Namespace, srcIP, dst string) (src, saw string, err error) {
	err = ns.Do(func() error {
		network := familyNetwork("udp", srcIP)
		raddr, err := net.ResolveUDPAddr(network, dst)
		if err != nil {
			return err
		}
		conn, err := net.DialUDP(network, &net.UDPAddr{IP: net.ParseIP(srcIP)}, raddr)
		if err != nil {
			return err
		}
		defer conn.Close()
		src = conn.LocalAddr().String()
		deadline := time.Now().Add(answerTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		conn.SetDeadline(deadline)
		if _, err := conn.Write([]byte("who\n")); err != nil {
			saw = classify(err)
			return nil
		}
		buf := make([]byte, 1500)
		n, err := conn.Read(buf)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			saw = OutcomeUnreachable
		case err != nil:
			saw = classify(err)
		default:
			saw = Connected(strings.TrimSpace(string(buf[:n])))
		}
		return nil
	})
	if err != nil {
		return "", "", fmt.Errorf("udp exchange %s from %s: %w", dst, ns.Name, err)
	}
	return src, saw, nil
}

// ping sends one ICMP echo request from srcIP inside ns to dst on a raw
// socket (no ping binary is needed, and datagram ICMP sockets are closed to
// root by net.ipv4.ping_group_range's default) and reports "echo reply",
// "icmp port unreachable", another ICMP error, or timeout.
func ping(ctx context.Context, ns netlab.Namespace, srcIP, dst string) (saw string, err error) {
	err = ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		if err != nil {
			return fmt.Errorf("raw icmp socket: %w", err)
		}
		defer unix.Close(fd)
		src, dstIP := net.ParseIP(srcIP).To4(), net.ParseIP(dst).To4()
		if src == nil || dstIP == nil {
			return fmt.Errorf("bad address %s -> %s", srcIP, dst)
		}
		sa := &unix.SockaddrInet4{}
		copy(sa.Addr[:], src)
		if err := unix.Bind(fd, sa); err != nil {
			return fmt.Errorf("bind %s: %w", srcIP, err)
		}
		id := uint16(rand.IntN(0xffff) + 1)
		to := &unix.SockaddrInet4{}
		copy(to.Addr[:], dstIP)
		if err := unix.Sendto(fd, echoRequest(id, 1), 0, to); err != nil {
			return fmt.Errorf("send echo to %s: %w", dst, err)
		}
		saw = awaitICMP(ctx, fd, func(pkt []byte, _ unix.Sockaddr) string { return matchICMP(pkt, dstIP, id) })
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("ping %s from %s: %w", dst, ns.Name, err)
	}
	return saw, nil
}

func echoRequest(id, seq uint16) []byte {
	b := make([]byte, 8, 8+16)
	b[0] = 8 // echo request
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	b = append(b, "trlab echo probe"...)
	binary.BigEndian.PutUint16(b[2:], checksum(b))
	return b
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// awaitICMP reads the raw socket (which sees every ICMP or ICMPv6 message
// arriving in the namespace) until match recognises the answer to our echo
// request, or the deadline.
func awaitICMP(ctx context.Context, fd int, match func(msg []byte, from unix.Sockaddr) string) string {
	deadline := time.Now().Add(answerTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	buf := make([]byte, 1500)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return OutcomeTimeout
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return "error: " + err.Error()
		}
		if saw := match(buf[:n], from); saw != "" {
			return saw
		}
	}
}

// matchICMP interprets one received IPv4 packet; "" when it is not about
// our echo request.
func matchICMP(pkt []byte, dst net.IP, id uint16) string {
	icmp, ok := ipPayload(pkt)
	if !ok || len(icmp) < 8 {
		return ""
	}
	switch icmp[0] {
	case 0: // echo reply
		if binary.BigEndian.Uint16(icmp[4:]) == id && net.IP(pkt[12:16]).Equal(dst) {
			return OutcomeEchoReply
		}
	case 3, 11: // destination unreachable, time exceeded: they quote our packet
		inner := icmp[8:]
		quoted, ok := ipPayload(inner)
		if !ok || len(quoted) < 8 || inner[9] != unix.IPPROTO_ICMP || !net.IP(inner[16:20]).Equal(dst) {
			return ""
		}
		if quoted[0] != 8 || binary.BigEndian.Uint16(quoted[4:]) != id {
			return ""
		}
		if icmp[0] == 3 && icmp[1] == 3 {
			return OutcomeUnreachable
		}
		return fmt.Sprintf("icmp type %d code %d", icmp[0], icmp[1])
	}
	return ""
}

// ipPayload returns what follows an IPv4 header.
func ipPayload(pkt []byte) ([]byte, bool) {
	if len(pkt) < 20 || pkt[0]>>4 != 4 {
		return nil, false
	}
	ihl := int(pkt[0]&0x0f) * 4
	if ihl < 20 || len(pkt) < ihl {
		return nil, false
	}
	return pkt[ihl:], true
}

// ping6 is ping over ICMPv6: one echo request from srcIP inside ns to dst
// on a raw ICMPv6 socket (the kernel fills in the checksum), and what came
// back: "echo reply", "icmp port unreachable" (ICMPv6 destination
// unreachable, port unreachable), another ICMPv6 error, or timeout.
func ping6(ctx context.Context, ns netlab.Namespace, srcIP, dst string) (saw string, err error) {
	err = ns.Do(func() error {
		src, dstIP := net.ParseIP(srcIP), net.ParseIP(dst)
		if src == nil || dstIP == nil || src.To4() != nil || dstIP.To4() != nil {
			return fmt.Errorf("bad address %s -> %s", srcIP, dst)
		}
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
		if err != nil {
			return fmt.Errorf("raw icmpv6 socket: %w", err)
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrInet6{}
		copy(sa.Addr[:], src)
		if err := unix.Bind(fd, sa); err != nil {
			return fmt.Errorf("bind %s: %w", srcIP, err)
		}
		id := uint16(rand.IntN(0xffff) + 1)
		to := &unix.SockaddrInet6{}
		copy(to.Addr[:], dstIP)
		if err := unix.Sendto(fd, echoRequest6(id, 1), 0, to); err != nil {
			return fmt.Errorf("send echo to %s: %w", dst, err)
		}
		saw = awaitICMP(ctx, fd, func(msg []byte, from unix.Sockaddr) string {
			var src net.IP
			if sa, ok := from.(*unix.SockaddrInet6); ok {
				src = net.IP(sa.Addr[:])
			}
			return matchICMP6(msg, src, dstIP, id)
		})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("ping6 %s from %s: %w", dst, ns.Name, err)
	}
	return saw, nil
}

func echoRequest6(id, seq uint16) []byte {
	b := make([]byte, 8, 8+16)
	b[0] = 128 // echo request
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	return append(b, "trlab echo probe"...)
}

// matchICMP6 interprets one ICMPv6 message from src; "" when it is not
// about our echo request.
func matchICMP6(msg []byte, src, dst net.IP, id uint16) string {
	if len(msg) < 8 {
		return ""
	}
	switch msg[0] {
	case 129: // echo reply
		if binary.BigEndian.Uint16(msg[4:]) == id && src.Equal(dst) {
			return OutcomeEchoReply
		}
	case 1, 3: // destination unreachable, time exceeded: they quote our packet
		inner := msg[8:]
		if len(inner) < 40+8 || inner[0]>>4 != 6 || inner[6] != unix.IPPROTO_ICMPV6 || !net.IP(inner[24:40]).Equal(dst) {
			return ""
		}
		quoted := inner[40:]
		if quoted[0] != 128 || binary.BigEndian.Uint16(quoted[4:]) != id {
			return ""
		}
		if msg[0] == 1 && msg[1] == 4 {
			return OutcomeUnreachable
		}
		return fmt.Sprintf("icmpv6 type %d code %d", msg[0], msg[1])
	}
	return ""
}
