package conntrack

import (
	"context"
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

// TestPrivUnrepliedSYN: a SYN DNAT'd to an address nobody has leaves an
// entry in SYN_SENT, never replied, found by either tuple.
func TestPrivUnrepliedSYN(t *testing.T) {
	requirePriv(t)
	node, _ := natLab(t, "enct2")
	tr, err := OpenWith(context.Background(), node.Path(), Options{})
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
