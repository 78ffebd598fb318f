package conntrack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netlab"
)

type ctToolEntry = netlab.ConntrackEntry

// conntrackList is the namespace's table as `conntrack -L` prints it,
// for the truth the tracker is compared with.
func conntrackList(t *testing.T, ns netlab.Namespace, args ...string) []ctToolEntry {
	t.Helper()
	entries, err := ns.ConntrackList(args...)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// TestPrivLookup: a tracker's entry of a real DNAT'd
// connection is what `conntrack -L` shows, by either tuple and after the
// connection changed state; once `conntrack -D` deleted it, it is the
// destroyed entry.
func TestPrivLookup(t *testing.T) {
	requirePriv(t)
	node, backend := natLab(t, "trcc-t1")
	tr, err := OpenWith(context.Background(), node.Path(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	hold := serveHolding(t, backend)
	var c net.Conn
	if err := node.Do(func() (err error) { c, err = net.DialTimeout("tcp", "10.96.0.10:80", 3*time.Second); return err }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-hold // the server has accepted: the connection is established
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	sport := fmt.Sprint(local.Port())

	tool := conntrackList(t, node, "-p", "tcp", "--sport", sport)
	if len(tool) != 1 {
		t.Fatalf("conntrack -L has %d entries for the connection: %+v", len(tool), tool)
	}
	want := tool[0]
	for _, tu := range []event.Tuple{want.Orig, want.Reply} {
		e, ok := tr.Lookup(tu)
		if !ok || e.Orig != want.Orig || e.Reply != want.Reply || e.State != want.State ||
			(e.Status&StatusAssured != 0) != want.Assured || e.Replied == want.Unreplied || e.Destroyed {
			t.Fatalf("lookup %v: tracker %+v %v (status %v), conntrack -L %+v", tu, e, ok, FormatStatus(e.Status), want)
		}
	}

	// FIN: the entry moves on without any event the tracker reads. It
	// passes FIN_WAIT for as long as the server's ACK takes and rests in
	// CLOSE_WAIT, since the server holds its end open; comparing in
	// FIN_WAIT would race that ACK.
	c.Close()
	waitFor(t, "the kernel's entry to reach CLOSE_WAIT", func() bool {
		l := conntrackList(t, node, "-p", "tcp", "--sport", sport)
		return len(l) == 1 && l[0].State == "CLOSE_WAIT"
	})
	if e, ok := tr.Lookup(want.Orig); !ok || e.State != "CLOSE_WAIT" {
		t.Fatalf("after close: tracker %+v %v, conntrack -L state CLOSE_WAIT", e, ok)
	}

	mustRun(t, node, "conntrack", "-D", "-p", "tcp", "--sport", sport)
	waitFor(t, "the destroy event", func() bool { return tr.Stats().Entries == 1 })
	if e, ok := tr.Lookup(want.Reply); !ok || !e.Destroyed || e.Orig != want.Orig {
		t.Fatalf("after conntrack -D: %+v %v", e, ok)
	}
	if s := tr.Stats(); s.QueryErrors != 0 || s.Overruns != 0 {
		t.Errorf("stats %+v", s)
	}
}

// serveHolding accepts connections on 10.0.0.2:8080 in ns and keeps them
// open until the test ends; the channel ticks at each accept.
func serveHolding(t *testing.T, ns netlab.Namespace) <-chan struct{} {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", "10.0.0.2:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 16)
	var held []net.Conn
	t.Cleanup(func() {
		ln.Close()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			accepted <- struct{}{}
		}
	}()
	return accepted
}

// TestPrivBySource: the kernel-filtered dump of a source endpoint
// lists exactly the entries `conntrack -L` shows from it (UDP, TCP, IPv6
// and ICMP by echo id), and none of its neighbours'.
func TestPrivBySource(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "trcc-t2")
	insert := inserter(t, ns)
	for _, dst := range []string{"10.2.0.1", "10.2.0.2", "10.2.0.3"} {
		insert("-p", "udp", "-s", "10.1.0.5", "-d", dst, "--sport", "5353", "--dport", "53")
	}
	insert("-p", "udp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--sport", "5354", "--dport", "53") // another port
	insert("-p", "udp", "-s", "10.1.0.6", "-d", "10.2.0.1", "--sport", "5353", "--dport", "53") // another address
	insert("-p", "tcp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--sport", "5353", "--dport", "80", "--state", "ESTABLISHED")
	insert("-p", "udp", "-s", "fd00::5", "-d", "fd00::1", "--sport", "5353", "--dport", "53")
	insert("-p", "icmp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--icmp-type", "8", "--icmp-code", "0", "--icmp-id", "77")
	insert("-p", "icmp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--icmp-type", "8", "--icmp-code", "0", "--icmp-id", "78")

	tr, err := OpenWith(context.Background(), ns.Path(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	table := conntrackList(t, ns) // both families
	for _, q := range []struct {
		proto uint8
		src   string
	}{{17, "10.1.0.5:5353"}, {6, "10.1.0.5:5353"}, {17, "[fd00::5]:5353"}, {1, "10.1.0.5:77"}, {17, "10.1.0.7:5353"}} {
		src := netip.MustParseAddrPort(q.src)
		var want, got []event.Tuple
		for _, e := range table {
			if e.Orig.Proto == q.proto && e.Orig.SrcAddrPort() == src {
				want = append(want, e.Orig)
			}
		}
		for _, e := range tr.BySource(q.proto, src) {
			got = append(got, e.Orig)
		}
		sortTuples(want)
		sortTuples(got)
		if !slices.Equal(got, want) {
			t.Errorf("BySource(%d, %v) = %v, conntrack -L has %v", q.proto, src, got, want)
		}
	}
	if s := tr.Stats(); s.QueryErrors != 0 {
		t.Errorf("query errors %d", s.QueryErrors)
	}
}

func sortTuples(ts []event.Tuple) {
	slices.SortFunc(ts, func(a, b event.Tuple) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
}

// TestPrivOverrun floods a tracker with DESTROYs on the smallest receive
// buffer: the overrun must be counted, the tracker keep going, and
// lookups still answer from the kernel.
func TestPrivOverrun(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "trcc-t3")
	tr, err := OpenWith(context.Background(), ns.Path(), Options{ReadBuffer: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	total := 0
	for batch := 0; batch < 10 && tr.Stats().Overruns == 0; batch++ {
		createFlows(t, ns, 0, 4000)
		total += 4000
		mustRun(t, ns, "conntrack", "-F")
		time.Sleep(50 * time.Millisecond)
	}
	s := tr.Stats()
	if s.Overruns == 0 {
		t.Fatalf("no overrun after %d destroys with a tiny buffer", total)
	}
	if s.Err != "" {
		t.Errorf("stats after overrun %+v", s)
	}
	createFlows(t, ns, 7, 1)
	want := fromFlow(&dumpFlows(t, ns)[0])
	if e, ok := tr.Lookup(want.Reply); !ok || e.Destroyed || e.Orig != want.Orig {
		t.Fatalf("lookup after the overrun: %+v %v, kernel has %+v", e, ok, want)
	}
	t.Logf("%d destroys: %d overruns, %d ended entries kept", total, s.Overruns, s.Entries)
}

// TestPrivExpired: entries that time out before they are looked up
// (the kernel destroys an expired entry when asked for it, or its garbage
// collector did) are answered as destroyed, every one, never a miss.
func TestPrivExpired(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "trcc-t4")
	tr, err := OpenWith(context.Background(), ns.Path(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c := dialIn(t, ns)
	defer c.Close()
	var tuples []event.Tuple
	for i := range 200 {
		src := netip.AddrFrom4([4]byte{10, 1, 0, byte(i)})
		f := ct.NewFlow(17, 0, src, netip.MustParseAddr("10.2.0.1"), uint16(20000+i), 53, 1, 0)
		if err := c.Create(f); err != nil {
			t.Fatalf("create flow %d: %v", i, err)
		}
		tuples = append(tuples, fromFlow(&f).Orig)
	}
	time.Sleep(1500 * time.Millisecond)
	missed := 0
	for _, tu := range tuples {
		if e, ok := tr.Lookup(tu); !ok || !e.Destroyed {
			missed++
		}
	}
	if len(conntrackList(t, ns)) != 0 {
		t.Fatal("the kernel still has entries past their timeout")
	}
	if missed > 0 {
		t.Fatalf("%d of %d expired entries not answered as destroyed (stats %+v)", missed, len(tuples), tr.Stats())
	}
}

// TestPrivWaitsInNoSystemCall: while a tracker waits for
// DESTROYs, no thread of the process is blocked in poll(2) or ppoll(2),
// as the kernel's /proc/self/task/*/syscall tells; the DESTROYs of a
// `conntrack -F` are still applied without anyone asking.
func TestPrivWaitsInNoSystemCall(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "trcc-t5")
	tr, err := OpenWith(context.Background(), ns.Path(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	createFlows(t, ns, 0, 50)
	mustRun(t, ns, "conntrack", "-F")
	for deadline := time.Now().Add(5 * time.Second); tr.Stats().Entries < 50; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the tracker applied %d of 50 DESTROYs within 5s; stats %+v", tr.Stats().Entries, tr.Stats())
		}
	}
	time.Sleep(100 * time.Millisecond) // the wait loop is between drains
	for _, tid := range blockedIn(t, unix.SYS_POLL, unix.SYS_PPOLL) {
		t.Errorf("thread %s is blocked in poll: a wait in a system call hands the thread's processor away and back", tid)
	}
}

// blockedIn lists the threads of this process blocked in one of the
// system calls: /proc/self/task/TID/syscall starts with the number of the
// call a blocked thread is in.
func blockedIn(t *testing.T, calls ...int) []string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/syscall")
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		if n, err := strconv.Atoi(f[0]); err == nil && slices.Contains(calls, n) {
			out = append(out, task.Name())
		}
	}
	return out
}
