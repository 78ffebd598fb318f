package node

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Socket diagnostics are asked directly (rather than through vishvananda's
// SocketDiagTCP, which dumps sockets in every state): a node with a million
// connections must not pay for them every poll, so the kernel is asked for
// listening sockets only.
const (
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY
	inetDiagReqLen   = 56 // struct inet_diag_req_v2
	inetDiagMsgLen   = 72 // struct inet_diag_msg
	inetDiagV6Only   = 11 // INET_DIAG_SKV6ONLY
	tcpListen        = 10 // TCP_LISTEN
	tcpClose         = 7  // TCP_CLOSE: an unconnected UDP socket
)

// sockDiag is a NETLINK_SOCK_DIAG socket created in the observed namespace;
// sock_diag answers for the namespace the socket lives in.
type sockDiag struct {
	c *netlink.Conn
}

func dialSockDiag(nsFD int) (*sockDiag, error) {
	c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, &netlink.Config{NetNS: nsFD})
	if err != nil {
		return nil, fmt.Errorf("open sock_diag socket: %w", err)
	}
	return &sockDiag{c: c}, nil
}

func (d *sockDiag) Close() error { return d.c.Close() }

// listeners lists TCP sockets in LISTEN and UDP sockets that are bound and
// unconnected, both families.
func (d *sockDiag) listeners() ([]Listener, error) {
	var out []Listener
	for _, q := range []struct {
		proto  string
		ipProt uint8
		state  uint32
	}{{"tcp", unix.IPPROTO_TCP, tcpListen}, {"udp", unix.IPPROTO_UDP, tcpClose}} {
		for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
			ls, err := d.dump(fam, q.ipProt, q.state, q.proto)
			if err != nil {
				return nil, err
			}
			out = append(out, ls...)
		}
	}
	return out, nil
}

func (d *sockDiag) dump(family, proto uint8, state uint32, name string) ([]Listener, error) {
	req := make([]byte, inetDiagReqLen)
	req[0], req[1] = family, proto
	binary.NativeEndian.PutUint32(req[4:], 1<<state)
	// The cookie must be "no cookie" (all ones) for a dump.
	binary.NativeEndian.PutUint32(req[48:], ^uint32(0))
	binary.NativeEndian.PutUint32(req[52:], ^uint32(0))
	msgs, err := d.c.Execute(netlink.Message{
		Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request | netlink.Dump},
		Data:   req,
	})
	if err != nil {
		return nil, fmt.Errorf("sock_diag dump %s family %d: %w", name, family, err)
	}
	var out []Listener
	for _, m := range msgs {
		l, ok := parseDiagMsg(m.Data, name)
		if ok {
			out = append(out, l)
		}
	}
	return out, nil
}

// parseDiagMsg reads a struct inet_diag_msg and its attributes.
func parseDiagMsg(b []byte, proto string) (Listener, bool) {
	if len(b) < inetDiagMsgLen {
		return Listener{}, false
	}
	fam := b[0]
	sport := binary.BigEndian.Uint16(b[4:6])
	if sport == 0 {
		// An unbound (or send-only, not yet bound) UDP socket takes
		// nothing.
		return Listener{}, false
	}
	var addr netip.Addr
	switch fam {
	case unix.AF_INET:
		addr = netip.AddrFrom4([4]byte(b[8:12]))
	case unix.AF_INET6:
		addr = netip.AddrFrom16([16]byte(b[8:24]))
	default:
		return Listener{}, false
	}
	if proto == "udp" {
		// A connected UDP socket has a peer; only unconnected ones
		// receive from anyone.
		if binary.BigEndian.Uint16(b[6:8]) != 0 {
			return Listener{}, false
		}
	}
	l := Listener{Proto: proto, Addr: netip.AddrPortFrom(addr, sport), Inode: binary.NativeEndian.Uint32(b[68:72])}
	if ad, err := netlink.NewAttributeDecoder(b[inetDiagMsgLen:]); err == nil {
		for ad.Next() {
			if ad.Type() == inetDiagV6Only {
				l.V6Only = ad.Uint8() != 0
			}
		}
	}
	return l, true
}

// processNames maps socket inodes to "comm[pid]" by reading /proc/*/fd.
// It costs a readlink per open file on the machine, so it only runs when
// the set of listening sockets changed. Inodes it does not find stay
// unnamed (a socket held by a process in another PID namespace, or a
// process that exited).
func processNames(inodes map[uint32]bool) map[uint32]string {
	out := map[uint32]string{}
	if len(inodes) == 0 {
		return out
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", p.Name(), "fd")
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		var comm string
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(dir, fd.Name()))
			if err != nil || !strings.HasPrefix(target, "socket:[") {
				continue
			}
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]"), 10, 32)
			if err != nil || !inodes[uint32(n)] {
				continue
			}
			if _, done := out[uint32(n)]; done {
				continue
			}
			if comm == "" {
				c, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
				comm = strings.TrimSpace(string(c))
			}
			out[uint32(n)] = fmt.Sprintf("%s[%d]", comm, pid)
		}
		if len(out) == len(inodes) {
			break
		}
	}
	return out
}
