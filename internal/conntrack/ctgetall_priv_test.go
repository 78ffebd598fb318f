package conntrack

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// batchTable fills a table with 41 entries (more than two batches): TCP
// in three states, half DNAT'd and replied, UDP over IPv4 and IPv6, ICMP.
func batchTable(t testing.TB, insert func(args ...string)) {
	t.Helper()
	states := []string{"SYN_SENT", "ESTABLISHED", "TIME_WAIT"}
	for i := range 30 {
		args := []string{"-p", "tcp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--sport", fmt.Sprint(41000 + i), "--dport", "80", "--state", states[i%3]}
		if i%2 == 0 {
			args = append(args, "-r", "10.3.0.9", "-q", "10.1.0.5", "--reply-port-src", "8080", "--reply-port-dst", fmt.Sprint(41000+i), "-u", "SEEN_REPLY")
		}
		insert(args...)
	}
	for i := range 5 {
		insert("-p", "udp", "-s", "10.1.0.6", "-d", "10.2.0.2", "--sport", fmt.Sprint(5300+i), "--dport", "53")
		insert("-p", "udp", "-s", "fd00::5", "-d", "fd00::1", "--sport", fmt.Sprint(5300+i), "--dport", "53")
	}
	insert("-p", "icmp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--icmp-type", "8", "--icmp-code", "0", "--icmp-id", "77")
}

// TestPrivGetterAllMatchesConntrackTool: asked for 41 entries by both of
// their tuples and for tuples nobody has, interleaved, in one getAll (eight
// writes of requests), the getter answers each as `conntrack -L` shows the
// kernel's table: the same tuples, TCP state, ASSURED and UNREPLIED; and a
// miss for the rest. One write answers all of its requests, none asked
// again alone.
func TestPrivGetterAllMatchesConntrackTool(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "trcc-ga")
	batchTable(t, inserter(t, ns))
	tool := conntrackList(t, ns)
	if len(tool) != 41 {
		t.Fatalf("conntrack -L lists %d entries, inserted 41", len(tool))
	}
	var tus []event.Tuple
	var want []*ctToolEntry
	for i := range tool {
		miss := tool[i].Orig
		miss.SrcPort += 1000
		tus = append(tus, tool[i].Orig, miss, tool[i].Reply)
		want = append(want, &tool[i], nil, &tool[i])
	}
	g := getterIn(t, ns)
	defer g.Close()
	entries, found := make([]Entry, len(tus)), make([]bool, len(tus))
	if err := g.getAll(tus, entries, found); err != nil {
		t.Fatal(err)
	}
	checkAgainstTool(t, tus, entries, found, want)
	if answered, err := g.askTogether(tus[:getBatch], entries, found); answered != 1<<getBatch-1 || err != nil {
		t.Errorf("one write of %d GETs: answered %b, %v", getBatch, answered, err)
	}
}

// TestPrivGetterAllOverrun: with a receive buffer too small for a batch's
// replies the kernel drops most of them (ENOBUFS, then silently while the
// socket is congested); askTogether answers the rest, and getAll asks
// for the lost ones again alone, twice over: every answer is still the
// kernel's.
func TestPrivGetterAllOverrun(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "trcc-go")
	batchTable(t, inserter(t, ns))
	tool := conntrackList(t, ns)
	var tus []event.Tuple
	var want []*ctToolEntry
	for i := range tool[:getBatch] {
		tus = append(tus, tool[i].Orig)
		want = append(want, &tool[i])
	}
	g := getterIn(t, ns)
	defer g.Close()
	// The smallest buffer the kernel allows (it doubles the 1 asked for
	// to its minimum) holds about one reply.
	if err := unix.SetsockoptInt(g.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1); err != nil {
		t.Fatal(err)
	}
	entries, found := make([]Entry, len(tus)), make([]bool, len(tus))
	answered, err := g.askTogether(tus, entries, found)
	if err != nil || answered == 0 || answered == 1<<len(tus)-1 {
		t.Fatalf("one write of %d GETs into a minimal buffer: answered %b, %v; want some, not all", len(tus), answered, err)
	}
	for range 2 {
		clear(entries)
		clear(found)
		if err := g.getAll(tus, entries, found); err != nil {
			t.Fatal(err)
		}
		checkAgainstTool(t, tus, entries, found, want)
	}
}

func checkAgainstTool(t *testing.T, tus []event.Tuple, entries []Entry, found []bool, want []*ctToolEntry) {
	t.Helper()
	for i, tu := range tus {
		w, e := want[i], entries[i]
		switch {
		case w == nil && found[i]:
			t.Errorf("%v: nobody has it, got %+v", tu, e)
		case w == nil:
		case !found[i]:
			t.Errorf("%v: not found; conntrack -L has %+v", tu, *w)
		case e.Orig != w.Orig || e.Reply != w.Reply || e.State != w.State ||
			(e.Status&StatusAssured != 0) != w.Assured || e.Replied == w.Unreplied:
			t.Errorf("%v: getter %+v (status %v), conntrack -L %+v", tu, e, FormatStatus(e.Status), *w)
		}
	}
}

// BenchmarkPrivGetAll is the 41 entries of batchTable asked for one GET
// at a time (get) and getBatch to a write (getAll); ns/get is per entry.
func BenchmarkPrivGetAll(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("privileged benchmark: needs root to create a network namespace")
	}
	ns := nodeNamespace(b, "trcc-b2")
	batchTable(b, inserter(b, ns))
	var tus []event.Tuple
	for _, f := range dumpFlows(b, ns) {
		tus = append(tus, fromFlow(&f).Orig)
	}
	g := getterIn(b, ns)
	defer g.Close()
	entries, found := make([]Entry, len(tus)), make([]bool, len(tus))
	perGet := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(tus)), "ns/get")
	}
	b.Run("get", func(b *testing.B) {
		for b.Loop() {
			for _, tu := range tus {
				if _, ok, err := g.get(tu); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		}
		perGet(b)
	})
	b.Run("getAll", func(b *testing.B) {
		for b.Loop() {
			if err := g.getAll(tus, entries, found); err != nil || slices.Contains(found, false) {
				b.Fatal(err, found)
			}
		}
		perGet(b)
	})
}
