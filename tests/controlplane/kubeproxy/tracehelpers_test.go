package kubeproxy

// Helpers of TestPrivTraceKubeProxyNFT, TestPrivTraceKubeProxyIPTables and
// TestPrivTraceKubeProxyIPVS:
// pod namespaces routed through the kube-proxy namespace, servers that name themselves, real connections
// from a fixed source port, the node's own truth (conntrack, ICMP
// counters). The live tracer itself is internal/live/livetest's, shared
// with internal/enrich's privileged tests.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// requireTools fails (not skips) when a tool the test reads the node's
// truth with is missing: a privileged run must not pass by testing nothing.
func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the test reads the node's truth with %s: %v", tool, err)
		}
	}
}

func nsRun(t *testing.T, ns netlab.Namespace, args ...string) string {
	t.Helper()
	out, err := ns.Run(args[0], args[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// doIn runs fn on an OS thread switched into ns, then switches the thread
// back and releases it. netlab.Namespace.Do retires its thread instead,
// and here that kills the cluster: the parent-death signal follows the
// thread that started a child, not the process, so a retired thread
// SIGKILLs every child it happened to start with Pdeathsig (kube-proxy,
// etcd, kube-apiserver; the first run lost kube-proxy that way). Only
// when switching back fails does the thread stay locked, so that the
// runtime ends it rather than reuse it in the wrong namespace.
func doIn(ns netlab.Namespace, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(ns.Path())
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open network namespace %s: %w", ns.Name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", ns.Name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return from network namespace %s: %w", ns.Name, err)
			return // still locked: the runtime ends this thread
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// podGateway is the node's address on every pod's veth, as with a routed
// CNI (Calico-like): each pod has a /32 and a default route through it.
// There is no bridge, so pod-to-pod replies also pass the node's routing
// and conntrack undoes the DNAT (a bridge without br_netfilter would
// deliver them around it).
const podGateway = "10.180.0.1"

// podLink joins pod to node with a veth pair created inside pod, its peer
// moved straight into node (no link ever appears in the host's namespace),
// gives the pod ip/32 and a default route through the node, and routes ip
// to the pod in the node.
func podLink(t *testing.T, pod, node netlab.Namespace, nodeIf, ip string) {
	t.Helper()
	nsRun(t, pod, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", nodeIf, "netns", node.Name)
	nsRun(t, pod, "ip", "addr", "add", ip+"/32", "dev", "eth0")
	nsRun(t, pod, "ip", "link", "set", "eth0", "up")
	nsRun(t, pod, "ip", "route", "add", podGateway, "dev", "eth0", "scope", "link")
	nsRun(t, pod, "ip", "route", "add", "default", "via", podGateway, "dev", "eth0")
	nsRun(t, node, "ip", "addr", "add", podGateway+"/32", "dev", nodeIf)
	nsRun(t, node, "ip", "link", "set", nodeIf, "up")
	nsRun(t, node, "ip", "route", "add", ip+"/32", "dev", nodeIf)
}

// podLink6 gives pod, already joined to node by podLink on nodeIf, the
// IPv6 address ip/128 and a default route through the node's link-local
// podGateway6 on that veth, and routes ip to the pod in the node: the
// IPv6 twin of podLink, as a routed CNI does it on a dual-stack node.
// nodad: the addresses are unique by design and usable at once.
func podLink6(t *testing.T, pod, node netlab.Namespace, nodeIf, ip string) {
	t.Helper()
	nsRun(t, pod, "ip", "-6", "addr", "add", ip+"/128", "dev", "eth0", "nodad")
	nsRun(t, node, "ip", "-6", "addr", "add", podGateway6+"/64", "dev", nodeIf, "nodad")
	nsRun(t, pod, "ip", "-6", "route", "add", "default", "via", podGateway6, "dev", "eth0")
	nsRun(t, node, "ip", "-6", "route", "add", ip+"/128", "dev", nodeIf)
}

// podGateway6 is the node's link-local address on every pod veth, the
// pods' IPv6 default gateway (Calico gives its veths one too).
const podGateway6 = "fe80::1"

// isIPv6 reports whether s, an address or an endpoint ("IP:PORT",
// "[IP]:PORT"), is IPv6.
func isIPv6(s string) bool {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Is6()
	}
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6()
}

// inet is network ("tcp", "udp") for the family of addr, an address or
// an endpoint: a socket of the test binds or dials one family explicitly.
func inet(network, addr string) string {
	if isIPv6(addr) {
		return network + "6"
	}
	return network + "4"
}

// dualStack clears IPV6_V6ONLY on a socket before it binds: one socket on
// [::] then takes both families. Go sets the option itself for "tcp6" and
// "udp6" and picks the family of "tcp" from a probe made once per process,
// so a dual-stack socket is asked for explicitly.
func dualStack(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0)
	}); err != nil {
		return fmt.Errorf("clear IPV6_V6ONLY: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("clear IPV6_V6ONLY: %w", serr)
	}
	return nil
}

// listenConfig is how the servers bind addr: dual-stack on [::], one
// family otherwise.
func listenConfig(addr string) net.ListenConfig {
	if host, _, err := net.SplitHostPort(addr); err == nil && host == "::" {
		return net.ListenConfig{Control: dualStack}
	}
	return net.ListenConfig{}
}

// serveTCP answers every connection to addr in ns with what, then closes
// it: the client's read names the server that answered. addr [::]:PORT
// is one dual-stack socket.
func serveTCP(t *testing.T, ns netlab.Namespace, addr, what string) {
	t.Helper()
	var l net.Listener
	lc := listenConfig(addr)
	if err := doIn(ns, func() (err error) {
		l, err = lc.Listen(context.Background(), inet("tcp", addr), addr)
		return err
	}); err != nil {
		t.Fatalf("listen on tcp %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return // closed
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, what)
			c.Close()
		}
	}()
}

// serveUDP answers every datagram to addr in ns with what; [::]:PORT is
// one dual-stack socket.
func serveUDP(t *testing.T, ns netlab.Namespace, addr, what string) {
	t.Helper()
	var pc net.PacketConn
	lc := listenConfig(addr)
	if err := doIn(ns, func() (err error) {
		pc, err = lc.ListenPacket(context.Background(), inet("udp", addr), addr)
		return err
	}); err != nil {
		t.Fatalf("listen on udp %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		b := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(b)
			if err != nil {
				return // closed
			}
			pc.WriteTo([]byte(what), from)
		}
	}()
}

// localPort is a source port the client has not used in this run, so
// every attempt is its own five-tuple (and conntrack entry).
var (
	usedMu    sync.Mutex
	usedPorts = map[int]bool{}
)

func localPort() int {
	usedMu.Lock()
	defer usedMu.Unlock()
	for {
		p := 20000 + rand.IntN(20000)
		if !usedPorts[p] {
			usedPorts[p] = true
			return p
		}
	}
}

// fetchTCP connects from ns's address from to addr from a fixed local port
// (a refused connection still names its five-tuple) and reads until the
// server closes. It returns the local endpoint and what the server wrote.
func fetchTCP(ns netlab.Namespace, from, addr string) (src, answer string, err error) {
	local := &net.TCPAddr{IP: net.ParseIP(from), Port: localPort()}
	var b []byte
	err = doIn(ns, func() error {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: local}
		c, err := d.Dial(inet("tcp", from), addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		b, err = io.ReadAll(c)
		return err
	})
	if err != nil {
		return local.String(), "", fmt.Errorf("connect %s from %s: %w", addr, local, err)
	}
	return local.String(), string(b), nil
}

// askUDP sends one datagram from a fixed local port to addr and returns
// the local endpoint and the answer.
func askUDP(ns netlab.Namespace, from, addr string) (src, answer string, err error) {
	local := &net.UDPAddr{IP: net.ParseIP(from), Port: localPort()}
	raddr, err := net.ResolveUDPAddr(inet("udp", from), addr)
	if err != nil {
		return local.String(), "", fmt.Errorf("udp address %s: %w", addr, err)
	}
	var c *net.UDPConn
	if err := doIn(ns, func() (err error) {
		c, err = net.DialUDP(inet("udp", from), local, raddr)
		return err
	}); err != nil {
		return local.String(), "", fmt.Errorf("udp socket %s → %s: %w", local, addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("who")); err != nil {
		return local.String(), "", fmt.Errorf("send to udp %s: %w", addr, err)
	}
	b := make([]byte, 512)
	n, err := c.Read(b)
	if err != nil {
		return local.String(), "", fmt.Errorf("answer from udp %s: %w", addr, err)
	}
	return local.String(), string(b[:n]), nil
}

// pingOnce sends one ICMP echo request from ns's address from to dst (a
// raw socket: the host has no ping command, and the echo id is ours) and
// returns the ICMP type and code of the first answer about it: an echo
// reply (0, 0) or an error whose quoted packet is this echo request. An
// IPv6 dst gets an ICMPv6 echo request (ping6Once).
func pingOnce(ns netlab.Namespace, from, dst string, id uint16) (typ, code int, err error) {
	if isIPv6(dst) {
		return ping6Once(ns, from, dst, id)
	}
	var pc net.PacketConn
	if err := doIn(ns, func() (err error) {
		pc, err = net.ListenPacket("ip4:icmp", from)
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("icmp socket in %s: %w", ns.Name, err)
	}
	defer pc.Close()
	msg := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 't', 'r', 'k', 'p'}
	binary.BigEndian.PutUint16(msg[2:], icmpChecksum(msg))
	if _, err := pc.WriteTo(msg, &net.IPAddr{IP: net.ParseIP(dst)}); err != nil {
		return 0, 0, fmt.Errorf("send echo request to %s: %w", dst, err)
	}
	pc.SetDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 1500)
	for {
		// Go strips the IPv4 header of an ip4:icmp socket's reads.
		n, _, err := pc.ReadFrom(b)
		if err != nil {
			return 0, 0, fmt.Errorf("answer to the echo request to %s: %w", dst, err)
		}
		m := b[:n]
		if len(m) < 8 {
			continue
		}
		switch {
		case m[0] == 0 && binary.BigEndian.Uint16(m[4:]) == id:
			return 0, 0, nil
		case m[0] == 3 || m[0] == 11:
			// Quoted: the IPv4 header of our request, then its first 8 bytes.
			q := m[8:]
			if len(q) < 20 {
				continue
			}
			ihl := int(q[0]&0x0f) * 4
			if len(q) < ihl+8 || q[9] != 1 || net.IP(q[16:20]).String() != dst ||
				q[ihl] != 8 || binary.BigEndian.Uint16(q[ihl+4:]) != id {
				continue
			}
			return int(m[0]), int(m[1]), nil
		}
	}
}

// ping6Once is pingOnce for IPv6: an ICMPv6 echo request (128), whose
// checksum the kernel fills in for every ICMPv6 raw socket (RFC 3542), and
// the first echo reply (129, 0) or error (1 destination unreachable, 3 time
// exceeded) quoting it. Reads of an IPv6 raw socket carry no IPv6 header.
func ping6Once(ns netlab.Namespace, from, dst string, id uint16) (typ, code int, err error) {
	var pc net.PacketConn
	if err := doIn(ns, func() (err error) {
		pc, err = net.ListenPacket("ip6:ipv6-icmp", from)
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("icmpv6 socket in %s: %w", ns.Name, err)
	}
	defer pc.Close()
	msg := []byte{128, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 't', 'r', 'k', 'p'}
	if _, err := pc.WriteTo(msg, &net.IPAddr{IP: net.ParseIP(dst)}); err != nil {
		return 0, 0, fmt.Errorf("send echo request to %s: %w", dst, err)
	}
	pc.SetDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 1500)
	for {
		n, _, err := pc.ReadFrom(b)
		if err != nil {
			return 0, 0, fmt.Errorf("answer to the echo request to %s: %w", dst, err)
		}
		if m := b[:n]; len(m) >= 8 && quotesEcho6(m, dst, id) {
			return int(m[0]), int(m[1]), nil
		}
	}
}

// quotesEcho6 reports whether the ICMPv6 message m is about our echo
// request to dst with id: its reply, or an error whose quoted packet (the
// IPv6 header, then the request) is it. The socket also gets neighbour
// discovery and everything else ICMPv6 the namespace receives.
func quotesEcho6(m []byte, dst string, id uint16) bool {
	switch m[0] {
	case 129:
		return binary.BigEndian.Uint16(m[4:]) == id
	case 1, 3:
		q := m[8:]
		return len(q) >= 48 && q[6] == 58 && net.IP(q[24:40]).Equal(net.ParseIP(dst)) &&
			q[40] == 128 && binary.BigEndian.Uint16(q[44:]) == id
	}
	return false
}

func icmpChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// icmpDestUnreachs is ns's count of ICMP destination unreachable errors
// received (/proc/net/snmp, Icmp InDestUnreachs).
func icmpDestUnreachs(t *testing.T, ns netlab.Namespace) int64 {
	t.Helper()
	return snmpCount(t, ns, "Icmp:InDestUnreachs")
}

// destUnreachs is ns's count of destination unreachable errors received
// (dir "In") or sent ("Out"), of ICMP (Icmp InDestUnreachs of
// /proc/net/snmp) or ICMPv6 when v6 (Icmp6 InDestUnreachs of
// /proc/net/snmp6).
func destUnreachs(t *testing.T, ns netlab.Namespace, dir string, v6 bool) int64 {
	t.Helper()
	if v6 {
		return snmpCount(t, ns, "Icmp6:"+dir+"DestUnreachs")
	}
	return snmpCount(t, ns, "Icmp:"+dir+"DestUnreachs")
}

func snmpCount(t *testing.T, ns netlab.Namespace, key string) int64 {
	t.Helper()
	snmp, err := ns.SNMP()
	if err != nil {
		t.Fatal(err)
	}
	n, ok := snmp[key]
	if !ok {
		t.Fatalf("no %s in %s's /proc/net/snmp or snmp6", key, ns.Name)
	}
	return n
}

// conntrackReplySource is where the node's conntrack entry of the
// connection src → dst says the reply comes from: the endpoint of a
// DNAT'd connection.
func conntrackReplySource(ns netlab.Namespace, proto, src, dst string) (string, error) {
	shost, sport, err := net.SplitHostPort(src)
	if err != nil {
		return "", fmt.Errorf("client endpoint %q: %w", src, err)
	}
	dhost, dport, err := net.SplitHostPort(dst)
	if err != nil {
		return "", fmt.Errorf("destination %q: %w", dst, err)
	}
	return conntrackReply(ns, proto, src+" → "+dst, "", "--orig-src", shost, "--orig-port-src", sport,
		"--orig-dst", dhost, "--orig-port-dst", dport)
}

// conntrackICMPReply is where the node's conntrack entry of the ICMP echo
// with id from src to dst says the reply comes from (an address).
func conntrackICMPReply(ns netlab.Namespace, src, dst string, id uint16) (string, error) {
	return conntrackReply(ns, "icmp", fmt.Sprintf("%s → %s id %d", src, dst, id), fmt.Sprintf(" id=%d ", id),
		"--orig-src", src, "--orig-dst", dst)
}

// conntrackReply reads the one entry of `conntrack -L -p proto filter...`
// in ns (whose line contains has, when given) and returns its reply
// tuple's source: address:port, or the address alone for a protocol
// without ports. conntrack lists IPv4 unless told the family, so filters
// on IPv6 addresses add -f ipv6.
func conntrackReply(ns netlab.Namespace, proto, what, has string, filter ...string) (string, error) {
	args := []string{"-L", "-p", proto}
	if slices.ContainsFunc(filter, isIPv6) {
		args = append(args, "-f", "ipv6")
	}
	out, err := ns.Run("conntrack", append(args, filter...)...)
	if err != nil {
		return "", fmt.Errorf("read the node's conntrack: %w", err)
	}
	var replies []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, proto+" ") || !strings.Contains(line+" ", has) {
			continue // conntrack's "N flow entries have been shown"
		}
		// The second src= and sport= are the reply tuple's.
		var srcs, sports []string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "src="); ok {
				srcs = append(srcs, v)
			} else if v, ok := strings.CutPrefix(f, "sport="); ok {
				sports = append(sports, v)
			}
		}
		switch {
		case len(srcs) == 2 && len(sports) == 2:
			replies = append(replies, net.JoinHostPort(srcs[1], sports[1]))
		case len(srcs) == 2 && len(sports) == 0:
			replies = append(replies, srcs[1])
		default:
			return "", fmt.Errorf("conntrack entry %q: want an original and a reply tuple", line)
		}
	}
	if len(replies) != 1 {
		return "", fmt.Errorf("%d conntrack entries for %s %s in the node, want one:\n%s", len(replies), proto, what, out)
	}
	return replies[0], nil
}

// nftRule is a rule as `nft -a list` shows it: its table's family, its
// chain, handle and text without the handle comment.
type nftRule struct {
	family string
	chain  string
	handle uint64
	text   string
}

var nftHandleRE = regexp.MustCompile(`^(.*) # handle (\d+)$`)

// listedRules are the rules of `nft -a list table FAMILY kube-proxy` (the
// node's own listing), in order.
func listedRules(family, listing string) ([]nftRule, error) {
	var rules []nftRule
	chain := ""
	for _, line := range strings.Split(listing, "\n") {
		l := strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(l, "chain "); ok {
			chain, _, _ = strings.Cut(name, " ")
			continue
		}
		if chain == "" {
			continue
		}
		m := nftHandleRE.FindStringSubmatch(l)
		if m == nil || strings.HasPrefix(l, "set ") || strings.HasPrefix(l, "map ") {
			continue
		}
		h, err := strconv.ParseUint(m[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("handle of %q: %w", l, err)
		}
		rules = append(rules, nftRule{family: family, chain: chain, handle: h, text: m[1]})
	}
	return rules, nil
}

// findRule is the one rule of the listing in a chain accepted by inChain
// whose text starts with prefix.
func findRule(t *testing.T, rules []nftRule, listing string, inChain func(string) bool, prefix string) nftRule {
	t.Helper()
	var found []nftRule
	for _, r := range rules {
		if inChain(r.chain) && strings.HasPrefix(r.text, prefix) {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d rules starting %q in the chosen chain of kube-proxy's table, want one: %+v\n%s", len(found), prefix, found, listing)
	}
	return found[0]
}

// isRefused: ECONNREFUSED, which Linux gives a connecting TCP socket only
// for a RST or an ICMP port unreachable.
func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
