package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TestConntrackTableFull: the observed namespace's conntrack table is full
// of established connections, so conntrack drops a client's new
// connections to a Service VIP, over IPv4 and over IPv6 (one table holds
// both families' entries). The tracer names each drop as conntrack's,
// with its table's size, and counts conntrack's drops in the summary.
// Truth: the client's connection attempt times out where the same attempt
// succeeded before the table filled; `conntrack -C` and the namespace's
// nf_conntrack_max say the table is full; `conntrack -S` counts the drops.
func TestConntrackTableFull(t *testing.T) {
	requirePriv(t)
	lab, err := netlab.New("trctf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	node, client := mustNamespace(t, lab, "node"), mustNamespace(t, lab, "client")
	if err := lab.Link(node, "eth0", "10.77.0.1/24", client, "eth0", "10.77.0.2/24"); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		ns   netlab.Namespace
		args []string
	}{
		{node, []string{"ip", "addr", "add", "10.78.0.1/32", "dev", "lo"}},
		{node, []string{"iptables", "-t", "nat", "-A", "PREROUTING", "-d", "10.96.77.1", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.78.0.1:8080"}},
		{client, []string{"ip", "route", "add", "default", "via", "10.77.0.1"}},
		{node, []string{"ip", "addr", "add", "fd77::1/64", "dev", "eth0", "nodad"}},
		{node, []string{"ip", "addr", "add", "fd78::1/128", "dev", "lo"}},
		{node, []string{"ip6tables", "-t", "nat", "-A", "PREROUTING", "-d", "fd96:77::1", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "[fd78::1]:8080"}},
		{client, []string{"ip", "addr", "add", "fd77::2/64", "dev", "eth0", "nodad"}},
		{client, []string{"ip", "-6", "route", "add", "default", "via", "fd77::1"}},
	} {
		if _, err := step.ns.Run(step.args[0], step.args[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	vips := []string{"10.96.77.1:80", "[fd96:77::1]:80"}
	listenAndHold(t, node, "10.78.0.1:8080")
	listenAndHold(t, node, "[fd78::1]:8080")
	for _, vip := range vips {
		if err := dialAndReset(client, vip, 2*time.Second); err != nil {
			t.Fatalf("before the table filled, the client could not connect to %s: %v", vip, err)
		}
	}
	// Those connections end with a reset, and are gone from both sides
	// before the flush: a half-closed one retransmits its FIN after the
	// flush, the full table drops each retransmission, and conntrack -S
	// counts those drops before and after the trace's window as well.
	waitNoTCPSockets(t, client, node)

	// That connection's entry, closing, is one early drop may evict
	// (tcp_can_early_drop): only the established ones stay.
	if _, err := node.Run("conntrack", "-F"); err != nil {
		t.Fatal(err)
	}
	max := conntrackMaxFor(t, node)
	filled := fillConntrack(t, node, max)
	if count := conntrackCount(t, node); count != max {
		t.Fatalf("conntrack -C says %d entries after filling, nf_conntrack_max is %d", count, max)
	}
	t.Logf("filled the node's conntrack table with %d established entries: %d of %d", filled, max, max)
	dropsBefore := conntrackStatDrops(t, node)

	cmd, stdout, stderr := startTrace(t, selfTracer(t), node, "-o", "json", "--linger", "1s")
	dialErrs := make([]error, len(vips))
	var wg sync.WaitGroup
	for i, vip := range vips {
		wg.Go(func() { dialErrs[i] = dialFrom(client, vip, 2500*time.Millisecond) })
	}
	wg.Wait()
	for i, dialErr := range dialErrs {
		var ne net.Error
		if !errors.As(dialErr, &ne) || !ne.Timeout() {
			t.Fatalf("with the table full the client's connection to %s ended with %v, want a timeout (its SYNs dropped)", vips[i], dialErr)
		}
	}
	time.Sleep(1500 * time.Millisecond) // past --linger and the next reading of the counters
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("trace: %v; stderr %s", err, stderr.String())
	}
	drops := conntrackStatDrops(t, node) - dropsBefore
	h, flows, sum := readNDJSON(t, stdout.Bytes())
	t.Logf("conntrack -S: drop rose by %d; summary conntrack_drops %d", drops, sum.ConntrackDrops)
	if drops == 0 {
		t.Fatal("conntrack -S counted no drop: the table did not refuse the connection")
	}
	if sum.ConntrackDrops != drops {
		t.Errorf("summary conntrack_drops %d, conntrack -S says %d", sum.ConntrackDrops, drops)
	}
	if !strings.Contains(strings.Join(h.Warnings, "\n"), fmt.Sprintf("100%% full (%d of %d entries", max, max)) {
		t.Errorf("header warnings %q do not say the table is full", h.Warnings)
	}
	seen := 0
	for _, vip := range vips {
		seen += checkTableFullFlow(t, flowTo(flows, vip), vip, max)
	}
	if kernelHasDropReasons() && (seen == 0 || uint64(seen) > drops) {
		t.Errorf("%d drop events; conntrack -S counted %d drops", seen, drops)
	}
}

// checkTableFullFlow checks the flow of the connection to vip that a full
// table of max entries refused, and returns its drop events' count.
func checkTableFullFlow(t *testing.T, f *trace.Flow, vip string, max int) int {
	t.Helper()
	if !kernelHasDropReasons() {
		// 5.10 gives no drop reason: a netfilter drop of a packet nobody
		// followed is not reported; the summary's count is all.
		if f != nil && f.Verdict != trace.VerdictConntrackTableFull {
			t.Errorf("flow %+v on a kernel without drop reasons", f)
		}
		return 0
	}
	if f == nil {
		t.Errorf("no flow for the refused connection to %s", vip)
		return 0
	}
	t.Logf("%s: verdict %s: %s", vip, f.Verdict, f.Explanation)
	if f.Verdict != trace.VerdictConntrackTableFull || f.Rule != nil {
		t.Errorf("%s: verdict %q, rule %+v: want %s and no rule", vip, f.Verdict, f.Rule, trace.VerdictConntrackTableFull)
	}
	seen := 0
	for _, e := range f.Events {
		if e.Kind != trace.KindDrop {
			continue
		}
		seen++
		t.Logf("drop %s %s -> %s no_conntrack=%v table=%+v", e.Time.Format("15:04:05.000"), e.Packet.Src, e.Packet.Dst, e.NoConntrack, e.ConntrackTable)
		if !e.NoConntrack || e.ConntrackTable == nil || e.ConntrackTable.Max != uint32(max) || e.ConntrackTable.Entries != uint32(max) {
			t.Errorf("drop event %+v (table %+v): want no conntrack entry, a table of %d of %d", e, e.ConntrackTable, max, max)
		}
	}
	if seen == 0 {
		t.Errorf("%s: the flow has no drop event", vip)
	}
	return seen
}

func mustNamespace(t *testing.T, lab *netlab.Lab, name string) netlab.Namespace {
	t.Helper()
	ns, err := lab.Namespace(name)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// listenAndHold accepts connections on addr inside ns and keeps them open;
// accepted counts them. The held connections send no keepalive probes: a
// probe of a connection whose conntrack entry a test flushed needs a new
// entry, which a full table refuses, and conntrack counts that drop
// whenever it falls, inside a trace's window or not.
func listenAndHold(t *testing.T, ns netlab.Namespace, addr string) (accepted func() int) {
	t.Helper()
	var ln net.Listener
	lc := net.ListenConfig{KeepAlive: -1}
	if err := ns.Do(func() (err error) { ln, err = lc.Listen(context.Background(), "tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		held []net.Conn
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(held)
	}
}

func dialFrom(ns netlab.Namespace, addr string, timeout time.Duration) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// dialAndReset connects from ns to addr and ends the connection with a
// reset (SO_LINGER 0), which leaves no socket on either side.
func dialAndReset(ns netlab.Namespace, addr string, timeout time.Duration) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		if err := c.(*net.TCPConn).SetLinger(0); err != nil {
			c.Close()
			return err
		}
		return c.Close()
	})
}

// waitNoTCPSockets waits until no namespace of nss has a TCP socket other
// than its listeners, as ss lists them.
func waitNoTCPSockets(t *testing.T, nss ...netlab.Namespace) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, ns := range nss {
		for {
			out, err := ns.Run("ss", "-Htan", "exclude", "listening")
			if err != nil {
				t.Fatalf("ss in %s: %v %s", ns.Name, err, out)
			}
			if strings.TrimSpace(out) == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("TCP sockets in %s still open after 5s:\n%s", ns.Name, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// conntrackMaxFor is the limit the node's table is filled to. The limit
// is nf_conntrack_max, which this kernel may let a namespace lower for
// itself; otherwise it is global: in a VM guest, which is the test's own
// machine, it is lowered for the test; on the host it is left as it is and
// the namespace's table is filled up to it.
func conntrackMaxFor(t *testing.T, ns netlab.Namespace) int {
	t.Helper()
	const small = "256"
	if err := ns.Sysctl("net.netfilter.nf_conntrack_max", small); err == nil {
		return readConntrackMax(t, ns)
	}
	if os.Getenv("TRACER_VM_KERNEL") != "" {
		const global = "/proc/sys/net/netfilter/nf_conntrack_max"
		old, err := os.ReadFile(global)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(global, []byte(small), 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.WriteFile(global, old, 0) })
		return readConntrackMax(t, ns)
	}
	max := readConntrackMax(t, ns)
	if max > 1<<20 {
		t.Skipf("nf_conntrack_max is global on this kernel and %d here: filling a namespace's table to it would take too long (the tests never write the host's sysctls); the VM matrix runs this test", max)
	}
	return max
}

func readConntrackMax(t *testing.T, ns netlab.Namespace) int {
	t.Helper()
	var b []byte
	if err := ns.Do(func() (err error) {
		b, err = os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_max")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fillConntrack creates assured TCP entries (which early drop never
// evicts) in ns's table through ctnetlink until the kernel refuses one
// for want of room; it returns how many it created.
func fillConntrack(t *testing.T, ns netlab.Namespace, max int) int {
	t.Helper()
	fd, err := unix.Open(ns.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := ct.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dst := netip.MustParseAddr("10.79.255.254")
	start := time.Now()
	for i := 0; ; i++ {
		if i > max {
			t.Fatalf("created %d entries, more than nf_conntrack_max %d", i, max)
		}
		src := netip.AddrFrom4([4]byte{10, 79, byte(i >> 16), byte(i >> 8)})
		// CONFIRMED too: the kernel refuses (EBUSY) a status that would
		// change that bit of the entry it inserts.
		f := ct.NewFlow(unix.IPPROTO_TCP, ct.StatusConfirmed|ct.StatusAssured|ct.StatusSeenReply, src, dst, uint16(1024+i&0xff), 9, 600, 0)
		f.ProtoInfo.TCP = &ct.ProtoInfoTCP{State: tcpConntrackEstablished}
		if err := c.Create(f); err != nil {
			if !errors.Is(err, unix.ENOMEM) {
				t.Fatalf("create conntrack entry %d: %v", i, err)
			}
			t.Logf("created %d entries in %s; the next was refused: %v", i, time.Since(start).Round(time.Millisecond), err)
			return i
		}
	}
}

// tcpConntrackEstablished is TCP_CONNTRACK_ESTABLISHED.
const tcpConntrackEstablished = 3

// conntrackCount is `conntrack -C` inside ns.
func conntrackCount(t *testing.T, ns netlab.Namespace) int {
	t.Helper()
	out, err := ns.Run("conntrack", "-C")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("conntrack -C: %q: %v", out, err)
	}
	return n
}

// conntrackStatDrops sums the drop= counters `conntrack -S` prints per CPU.
func conntrackStatDrops(t *testing.T, ns netlab.Namespace) uint64 {
	t.Helper()
	out, err := ns.Run("conntrack", "-S")
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "drop="); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("conntrack -S: %q", f)
			}
			sum += n
		}
	}
	return sum
}

// kernelHasDropReasons: the kernel's BTF names the netfilter drop reason
// (5.17 on); the tracer reports a netfilter drop of a packet it did not
// follow only then.
func kernelHasDropReasons() bool {
	b, err := os.ReadFile("/sys/kernel/btf/vmlinux")
	return err == nil && bytes.Contains(b, []byte("SKB_DROP_REASON_NETFILTER_DROP"))
}
