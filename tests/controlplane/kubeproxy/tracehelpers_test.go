package kubeproxy

// Helpers of TestPrivTraceKubeProxyNFT, TestPrivTraceKubeProxyIPTables and
// TestPrivTraceKubeProxyIPVS:
// pod namespaces routed through the kube-proxy namespace, servers that name themselves, real connections
// from a fixed source port, the node's own truth (conntrack, ICMP
// counters). The live tracer itself is internal/live/livetest's, shared
// with internal/enrich's privileged tests.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"regexp"
	"runtime"
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

// serveTCP answers every connection to addr in ns with what, then closes
// it: the client's read names the server that answered.
func serveTCP(t *testing.T, ns netlab.Namespace, addr, what string) {
	t.Helper()
	var l net.Listener
	if err := doIn(ns, func() (err error) {
		l, err = net.Listen("tcp4", addr)
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

// serveUDP answers every datagram to addr in ns with what.
func serveUDP(t *testing.T, ns netlab.Namespace, addr, what string) {
	t.Helper()
	var pc net.PacketConn
	if err := doIn(ns, func() (err error) {
		pc, err = net.ListenPacket("udp4", addr)
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
		c, err := d.Dial("tcp4", addr)
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
	raddr, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return local.String(), "", fmt.Errorf("udp address %s: %w", addr, err)
	}
	var c *net.UDPConn
	if err := doIn(ns, func() (err error) {
		c, err = net.DialUDP("udp4", local, raddr)
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
// reply (0, 0) or an error whose quoted packet is this echo request.
func pingOnce(ns netlab.Namespace, from, dst string, id uint16) (typ, code int, err error) {
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
	snmp, err := ns.SNMP()
	if err != nil {
		t.Fatal(err)
	}
	n, ok := snmp["Icmp:InDestUnreachs"]
	if !ok {
		t.Fatalf("no Icmp InDestUnreachs in %s's /proc/net/snmp", ns.Name)
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
// without ports.
func conntrackReply(ns netlab.Namespace, proto, what, has string, filter ...string) (string, error) {
	out, err := ns.Run("conntrack", append([]string{"-L", "-p", proto}, filter...)...)
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

// nftRule is a rule as `nft -a list` shows it: its chain, handle and text
// without the handle comment.
type nftRule struct {
	chain  string
	handle uint64
	text   string
}

var nftHandleRE = regexp.MustCompile(`^(.*) # handle (\d+)$`)

// listedRules are the rules of `nft -a list table ip kube-proxy` (the
// node's own listing), in order.
func listedRules(listing string) ([]nftRule, error) {
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
		rules = append(rules, nftRule{chain: chain, handle: h, text: m[1]})
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
		t.Fatalf("%d rules starting %q in the chosen chain of ip kube-proxy, want one: %+v\n%s", len(found), prefix, found, listing)
	}
	return found[0]
}

// isRefused: ECONNREFUSED, which Linux gives a connecting TCP socket only
// for a RST or an ICMP port unreachable.
func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
