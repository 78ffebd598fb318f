package conntrack

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netlab"
)

func requirePriv(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged test: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged test: needs root to create network namespaces and read conntrack")
	}
}

func mustRun(t testing.TB, ns netlab.Namespace, args ...string) {
	t.Helper()
	if out, err := ns.Run(args[0], args[1:]...); err != nil {
		t.Fatalf("%v: %v %s", args, err, out)
	}
}

// nodeNamespace is a throwaway namespace "node" under prefix, removed when
// the test ends.
func nodeNamespace(t testing.TB, prefix string) netlab.Namespace {
	t.Helper()
	lab, err := netlab.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	ns, err := lab.Namespace("node")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// inserter adds entries to ns's conntrack table with `conntrack -I`, for
// ten minutes.
func inserter(t testing.TB, ns netlab.Namespace) func(args ...string) {
	return func(args ...string) {
		t.Helper()
		mustRun(t, ns, append([]string{"conntrack", "-I", "--timeout", "600"}, args...)...)
	}
}

// natLab is a "node" namespace with a DNAT rule for a VIP to a backend
// namespace listening on 10.0.0.2:8080, and a DNAT of a second VIP to an
// address nobody has.
func natLab(t *testing.T, prefix string) (node, backend netlab.Namespace) {
	t.Helper()
	lab, err := netlab.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	node, err = lab.Namespace("node")
	if err != nil {
		t.Fatal(err)
	}
	backend, err = lab.Namespace("be")
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.Link(node, "eth0", "10.0.0.1/24", backend, "eth0", "10.0.0.2/24"); err != nil {
		t.Fatal(err)
	}
	mustRun(t, node, "ip", "route", "add", "default", "via", "10.0.0.2")
	mustRun(t, node, "iptables", "-t", "nat", "-A", "OUTPUT", "-d", "10.96.0.10", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.0.0.2:8080")
	mustRun(t, node, "iptables", "-t", "nat", "-A", "OUTPUT", "-d", "10.96.0.11", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.0.0.99:8080")
	return node, backend
}

func TestPrivDNATConnection(t *testing.T) {
	requirePriv(t)
	node, backend := natLab(t, "enct1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr, err := Open(ctx, node.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()

	var ln net.Listener
	if err := backend.Do(func() (err error) { ln, err = net.Listen("tcp", "10.0.0.2:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("x"))
			c.Close()
		}
	}()

	var local netip.AddrPort
	if err := node.Do(func() error {
		c, err := net.DialTimeout("tcp", "10.96.0.10:80", 3*time.Second)
		if err != nil {
			return fmt.Errorf("dial vip: %w", err)
		}
		defer c.Close()
		local = c.LocalAddr().(*net.TCPAddr).AddrPort()
		_, err = io.ReadAll(c)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	orig := event.Tuple{Src: local.Addr().Unmap(), SrcPort: local.Port(), Dst: netip.MustParseAddr("10.96.0.10"), DstPort: 80, Proto: 6}
	reply := event.Tuple{Src: netip.MustParseAddr("10.0.0.2"), SrcPort: 8080, Dst: local.Addr().Unmap(), DstPort: local.Port(), Proto: 6}

	// The update stream must carry the connection, replied and DNAT'd.
	deadline := time.After(3 * time.Second)
	for got := false; !got; {
		select {
		case e := <-tr.Updates():
			got = e.Orig == orig && e.Replied
		case <-deadline:
			t.Fatal("no replied update for the connection")
		}
	}
	for _, tu := range []event.Tuple{orig, reply} {
		e, ok := tr.Lookup(tu)
		if !ok {
			t.Fatalf("lookup %+v failed", tu)
		}
		if e.Status&StatusDstNAT == 0 || !e.Replied || e.Orig != orig || e.Reply != reply {
			t.Errorf("entry %+v status %v", e, FormatStatus(e.Status))
		}
	}
	if s := tr.Stats(); s.Overruns != 0 || s.Err != "" {
		t.Errorf("stats %+v", s)
	}
}

func TestPrivUnrepliedSYN(t *testing.T) {
	requirePriv(t)
	node, _ := natLab(t, "enct2")
	tr, err := Open(context.Background(), node.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var local netip.AddrPort
	node.Do(func() error {
		d := net.Dialer{Timeout: 1500 * time.Millisecond}
		// Bind a known source port so the tuple is known although the
		// dial fails.
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 41234}
		c, err := d.Dial("tcp", "10.96.0.11:80")
		if err == nil {
			c.Close()
		}
		local = netip.MustParseAddrPort("10.0.0.1:41234")
		return nil
	})
	orig := event.Tuple{Src: local.Addr(), SrcPort: local.Port(), Dst: netip.MustParseAddr("10.96.0.11"), DstPort: 80, Proto: 6}
	e, ok := tr.Lookup(orig)
	if !ok {
		t.Fatal("SYN to the DNAT'd VIP has no entry")
	}
	if e.Replied || e.Status&StatusSeenReply != 0 || e.Status&StatusDstNAT == 0 || e.State != "SYN_SENT" {
		t.Errorf("unreplied entry %+v status %v", e, FormatStatus(e.Status))
	}
	if e2, ok := tr.Lookup(e.Reply); !ok || e2.Orig != orig || e.Reply.Src != netip.MustParseAddr("10.0.0.99") {
		t.Errorf("reply lookup %+v %v", e2, ok)
	}
}

// dialIn opens a ctnetlink connection in ns; the caller closes it.
func dialIn(t testing.TB, ns netlab.Namespace) *ct.Conn {
	t.Helper()
	fd, err := unix.Open(ns.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd) // the socket stays in ns once made
	c, err := ct.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createFlows inserts n UDP entries into the namespace's table through
// ctnetlink, as `conntrack -I` does but without a process per entry.
func createFlows(t *testing.T, ns netlab.Namespace, base, n int) {
	t.Helper()
	c := dialIn(t, ns)
	defer c.Close()
	for i := base; i < base+n; i++ {
		src := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		f := ct.NewFlow(17, 0, src, netip.MustParseAddr("10.2.0.1"), uint16(10000+i%50000), 53, 600, 0)
		if err := c.Create(f); err != nil {
			t.Fatalf("create flow %d: %v", i, err)
		}
	}
}

// dumpFlows is the namespace's conntrack table as the kernel has it.
func dumpFlows(t testing.TB, ns netlab.Namespace) []ct.Flow {
	t.Helper()
	c := dialIn(t, ns)
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		t.Fatal(err)
	}
	return flows
}

// TestPrivOverrunRedump floods a tracker whose event socket has the
// smallest receive buffer the kernel allows: it must see ENOBUFS, re-dump,
// and end with exactly the kernel's table.
func TestPrivOverrunRedump(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "enct3")
	tr, err := OpenWith(context.Background(), ns.Path(), Options{ReadBuffer: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	total := 0
	for batch := 0; batch < 20 && tr.Stats().Overruns == 0; batch++ {
		createFlows(t, ns, total, 2000)
		total += 2000
	}
	if tr.Stats().Overruns == 0 {
		t.Fatalf("no overrun after %d entries with a tiny buffer", total)
	}
	flows := dumpFlows(t, ns)
	if len(flows) != total {
		t.Fatalf("kernel has %d entries, created %d", len(flows), total)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		s := tr.Stats()
		if s.Redumps > 0 && s.Entries-s.Destroyed == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for the tracker in step with the kernel's %d entries: %+v", total, s)
		}
	}
	for _, f := range flows {
		e := fromFlow(&f)
		got, ok := tr.Lookup(e.Reply)
		if !ok || got.Destroyed || got.Orig != e.Orig {
			t.Fatalf("entry %+v: tracker has %+v %v", e.Orig, got, ok)
		}
	}
	s := tr.Stats()
	t.Logf("%d entries: overruns %d, redumps %d, last dump %v for %d entries", total, s.Overruns, s.Redumps, s.LastDump, s.DumpedEntries)
}

// TestPrivDumpTime measures the initial dump of a large table. The VM
// matrix dumps 10,000 entries: creating 50,000 through ctnetlink costs
// 30-45 s per guest under TCG, and the dump's paging is the same at 10,000.
func TestPrivDumpTime(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "enct4")
	n := 50_000
	if os.Getenv("TRACER_VM_KERNEL") != "" {
		n = 10_000
	}
	start := time.Now()
	createFlows(t, ns, 0, n)
	created := time.Since(start)
	tr, err := Open(context.Background(), ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	s := tr.Stats()
	if s.DumpedEntries != n || s.Entries != n {
		t.Fatalf("dumped %d, holding %d, want %d", s.DumpedEntries, s.Entries, n)
	}
	t.Logf("created %d entries in %v; initial dump+index %v (%.1f µs/entry)", n, created, s.LastDump, float64(s.LastDump.Microseconds())/float64(n))
}
