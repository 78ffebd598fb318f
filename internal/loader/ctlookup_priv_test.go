package loader

import (
	"fmt"
	"net/netip"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netlab"
)

// ctLookupTable fills ns's conntrack table with `conntrack -I`: a DNAT'd
// TCP connection (reply from the backend's port), an SNAT'd UDP one, an
// IPv6 TCP one in SYN_SENT and n plain UDP entries; it returns the
// table as `conntrack -L` lists it, and the marks it set by original
// tuple.
func ctLookupTable(tb testing.TB, ns netlab.Namespace, n int) ([]netlab.ConntrackEntry, map[event.Tuple]uint32) {
	tb.Helper()
	inserts := [][]string{
		{"-p", "tcp", "-s", "10.61.0.2", "-d", "10.96.0.10", "--sport", "40000", "--dport", "80",
			"-r", "10.62.0.5", "-q", "10.61.0.2", "--reply-port-src", "8080", "--reply-port-dst", "40000",
			"--state", "ESTABLISHED", "-u", "SEEN_REPLY,ASSURED", "-t", "100", "-m", "7"},
		{"-p", "udp", "-s", "10.61.0.3", "-d", "10.63.0.9", "--sport", "5353", "--dport", "53",
			"-r", "10.63.0.9", "-q", "10.64.0.1", "--reply-port-src", "53", "--reply-port-dst", "1024",
			"-u", "SEEN_REPLY", "-t", "100", "-m", "0x10000"},
		{"-p", "tcp", "-s", "fd61::2", "-d", "fd96::10", "--sport", "41000", "--dport", "443",
			"-r", "fd96::10", "-q", "fd61::2", "--reply-port-src", "443", "--reply-port-dst", "41000",
			"--state", "SYN_SENT", "-t", "100"},
	}
	for i := range n {
		inserts = append(inserts, []string{"-p", "udp", "-s", "10.65.0.1", "-d", "10.66.0.1",
			"--sport", fmt.Sprint(1000 + i), "--dport", "53", "-r", "10.66.0.1", "-q", "10.65.0.1",
			"--reply-port-src", "53", "--reply-port-dst", fmt.Sprint(1000 + i), "-t", "100", "-m", fmt.Sprint(i)})
	}
	for _, args := range inserts {
		if out, err := ns.Run("conntrack", append([]string{"-I"}, args...)...); err != nil {
			tb.Fatalf("conntrack -I %v: %v: %s", args, err, out)
		}
	}
	entries, err := ns.ConntrackList()
	if err != nil {
		tb.Fatal(err)
	}
	if len(entries) != len(inserts) {
		tb.Fatalf("conntrack -L lists %d entries, %d were inserted", len(entries), len(inserts))
	}
	marks := map[event.Tuple]uint32{}
	for _, args := range inserts {
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-m" {
				var m uint32
				fmt.Sscan(args[i+1], &m)
				marks[toolOrig(tb, args)] = m
			}
		}
	}
	return entries, marks
}

// toolOrig is the original tuple of a `conntrack -I` command's arguments.
func toolOrig(tb testing.TB, args []string) event.Tuple {
	var tu event.Tuple
	for i := 0; i+1 < len(args); i++ {
		v := args[i+1]
		switch args[i] {
		case "-p":
			tu.Proto = map[string]uint8{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP}[v]
		case "-s":
			tu.Src = netip.MustParseAddr(v)
		case "-d":
			tu.Dst = netip.MustParseAddr(v)
		case "--sport":
			fmt.Sscan(v, &tu.SrcPort)
		case "--dport":
			fmt.Sscan(v, &tu.DstPort)
		}
	}
	return tu
}

func ctLookupIn(tb testing.TB, ns netlab.Namespace, tus []event.Tuple) ([]CTEntry, []bool) {
	tb.Helper()
	c, err := OpenCTLookup()
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	entries, found := make([]CTEntry, len(tus)), make([]bool, len(tus))
	if err := ns.Do(func() error { return c.LookupAll(tus, entries, found) }); err != nil {
		tb.Fatal(err)
	}
	return entries, found
}

// TestCTLookupAgreesWithConntrackTool: every entry the conntrack tool
// lists is found by its original tuple and by its reply tuple, with the
// tool's tuples, TCP state and assured bit and the mark it was inserted
// with; a tuple of no entry, and the entries looked up from another
// namespace, are not found. Truth: `conntrack -L`.
func TestCTLookupAgreesWithConntrackTool(t *testing.T) {
	requirePrivileged(t)
	lab, err := netlab.New(fmt.Sprintf("trctl%d", os.Getpid()%10000))
	must(t, err)
	t.Cleanup(func() { lab.Close() })
	ns, err := lab.Namespace("r")
	must(t, err)
	other, err := lab.Namespace("o")
	must(t, err)
	table, marks := ctLookupTable(t, ns, 40)
	// After the table: conntrack -I loaded nf_conntrack, whose BTF has
	// the kfuncs where it is a module.
	c, err := OpenCTLookup()
	switch {
	case err != nil && !CTLookupExpected():
		t.Skipf("no conntrack kfuncs on this kernel (5.18 and later have them): %v", err)
	case err != nil:
		t.Fatalf("the kernel has the conntrack kfuncs: %v", err)
	}
	c.Close()

	var tus []event.Tuple
	for _, e := range table {
		tus = append(tus, e.Orig, e.Reply)
	}
	// The first inserted entry's tuple from another source: built, not
	// taken from the table, whose order is the kernel's hash order and
	// whose first entry may be the IPv6 one.
	absent := event.Tuple{Src: netip.MustParseAddr("10.67.0.1"), Dst: netip.MustParseAddr("10.96.0.10"),
		SrcPort: 40000, DstPort: 80, Proto: unix.IPPROTO_TCP}
	tus = append(tus, absent)
	entries, found := ctLookupIn(t, ns, tus)
	for i, e := range table {
		for dir, k := range []int{2 * i, 2*i + 1} {
			got := entries[k]
			switch {
			case !found[k]:
				t.Errorf("%v (direction %d) not found", tus[k], dir)
			case got.Orig != e.Orig || got.Reply != e.Reply:
				t.Errorf("%v: tuples %v / %v, conntrack -L says %v / %v", tus[k], got.Orig, got.Reply, e.Orig, e.Reply)
			case tcpStateName(got.TCPState, e.Orig.Proto) != e.State,
				e.Orig.Proto != unix.IPPROTO_TCP && got.TCPState != 0:
				t.Errorf("%v: TCP state %d, conntrack -L says %q", tus[k], got.TCPState, e.State)
			case got.Status&ipsAssured != 0 != e.Assured:
				t.Errorf("%v: status %#x, conntrack -L says assured %v", tus[k], got.Status, e.Assured)
			case got.Mark != marks[e.Orig]:
				t.Errorf("%v: mark %d, inserted with %d", tus[k], got.Mark, marks[e.Orig])
			}
		}
	}
	if found[len(tus)-1] {
		t.Errorf("%v has no entry, found %+v", absent, entries[len(tus)-1])
	}
	_, found = ctLookupIn(t, other, tus[:2])
	if found[0] || found[1] {
		t.Errorf("looked up from namespace %s, found %s's entry", other.Name, ns.Name)
	}
}

const ipsAssured = 1 << 2

// tcpStateName is conntrack's name of enum tcp_conntrack, as the tool
// prints it.
func tcpStateName(state, proto uint8) string {
	if proto != unix.IPPROTO_TCP {
		return ""
	}
	names := []string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT",
		"CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}
	if int(state) < len(names) {
		return names[state]
	}
	return fmt.Sprint(state)
}

// BenchmarkPrivCTLookup: ns/lookup is per entry, 256 entries a call
// (BenchmarkPrivGetAll in internal/conntrack is the same by
// netlink GETs).
func BenchmarkPrivCTLookup(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("privileged benchmark: needs root to create a network namespace")
	}
	lab, err := netlab.New(fmt.Sprintf("trctb%d", os.Getpid()%10000))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lab.Close() })
	ns, err := lab.Namespace("r")
	if err != nil {
		b.Fatal(err)
	}
	table, _ := ctLookupTable(b, ns, 253)
	var tus []event.Tuple
	for _, e := range table {
		tus = append(tus, e.Orig)
	}
	c, err := OpenCTLookup()
	if err != nil {
		b.Skipf("no conntrack kfuncs: %v", err)
	}
	defer c.Close()
	entries, found := make([]CTEntry, len(tus)), make([]bool, len(tus))
	err = ns.Do(func() error {
		for b.Loop() {
			if err := c.LookupAll(tus, entries, found); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	for i, ok := range found {
		if !ok {
			b.Fatalf("%v not found", tus[i])
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(tus)), "ns/lookup")
}
