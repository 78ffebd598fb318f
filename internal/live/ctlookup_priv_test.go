package live

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/conntrack"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/netlab"
)

// TestKernelLookupsAnswerAsGETs: the pipeline's trackers, which ask the
// kernel's table by BPF where it can, answer every lookup exactly as a
// tracker of netlink GETs alone does (the tuples, status, mark, zone and
// TCP state of entries the conntrack tool inserted: DNAT'd TCP, SNAT'd
// UDP, IPv6, ICMP, in a zone, and a tuple of no entry), and the BPF
// lookups answered every TCP and UDP tuple of the default zone while
// netlink took the rest.
func TestKernelLookupsAnswerAsGETs(t *testing.T) {
	if testing.Short() {
		t.Skip("privileged tier: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged tier: needs root (CAP_BPF, CAP_NET_ADMIN)")
	}
	lab, err := netlab.New(fmt.Sprintf("trklk%d", os.Getpid()%10000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	ns, err := lab.Namespace("r")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-p", "tcp", "-s", "10.61.0.2", "-d", "10.96.0.10", "--sport", "40000", "--dport", "80",
			"-r", "10.62.0.5", "-q", "10.61.0.2", "--reply-port-src", "8080", "--reply-port-dst", "40000",
			"--state", "TIME_WAIT", "-u", "SEEN_REPLY,ASSURED", "-t", "100", "-m", "7"},
		{"-p", "udp", "-s", "10.61.0.3", "-d", "10.63.0.9", "--sport", "5353", "--dport", "53",
			"-r", "10.63.0.9", "-q", "10.64.0.1", "--reply-port-src", "53", "--reply-port-dst", "1024",
			"-u", "SEEN_REPLY", "-t", "100"},
		{"-p", "tcp", "-s", "fd61::2", "-d", "fd96::10", "--sport", "41000", "--dport", "443",
			"-r", "fd96::10", "-q", "fd61::2", "--reply-port-src", "443", "--reply-port-dst", "41000",
			"--state", "SYN_SENT", "-t", "100"},
		{"-p", "icmp", "-s", "10.61.0.2", "-d", "10.96.0.10", "--icmp-type", "8", "--icmp-code", "0", "--icmp-id", "77", "-t", "30"},
		{"-p", "udp", "-s", "10.61.0.4", "-d", "10.63.0.9", "--sport", "5354", "--dport", "53",
			"-r", "10.63.0.9", "-q", "10.61.0.4", "--reply-port-src", "53", "--reply-port-dst", "5354",
			"-t", "100", "--zone", "3"},
	} {
		if out, err := ns.Run("conntrack", append([]string{"-I"}, args...)...); err != nil {
			t.Fatalf("conntrack -I %v: %v: %s", args, err, out)
		}
	}
	table, err := ns.ConntrackList()
	if err != nil {
		t.Fatal(err)
	}
	// After the table: conntrack -I loaded nf_conntrack, whose BTF has
	// the kfuncs where it is a module.
	l, err := loader.OpenCTLookup()
	switch {
	case err != nil && !loader.CTLookupExpected():
		t.Skipf("no conntrack kfuncs on this kernel (5.18 and later have them): %v", err)
	case err != nil:
		t.Fatalf("the kernel has the conntrack kfuncs: %v", err)
	}
	l.Close()
	var tus []event.Tuple
	for _, e := range table {
		tus = append(tus, e.Orig, e.Reply)
	}
	absent := tus[0]
	absent.SrcPort = 9
	tus = append(tus, absent)

	ctx := context.Background()
	answers := func(opts conntrack.Options) ([]conntrack.Entry, []bool, conntrack.Stats) {
		tr, err := conntrack.OpenWith(ctx, ns.Path(), opts)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		entries, found := make([]conntrack.Entry, len(tus)), make([]bool, len(tus))
		tr.LookupAll(append([]event.Tuple(nil), tus...), entries, found)
		for i := range entries {
			entries[i].Seen = time.Time{}
		}
		return entries, found, tr.Stats()
	}
	got, gotFound, st := answers(ConntrackOptions())
	want, wantFound, _ := answers(conntrack.Options{})
	kernelAsked := 0
	for i, tu := range tus {
		if loader.CTLookupAnswers(tu) {
			kernelAsked++
		}
		if gotFound[i] != wantFound[i] || got[i] != want[i] {
			t.Errorf("%v: found %v %+v, netlink GETs found %v %+v", tu, gotFound[i], got[i], wantFound[i], want[i])
		}
	}
	if st.KernelLookupsOff != "" || st.KernelLookups != uint64(kernelAsked) {
		t.Errorf("BPF lookups answered %d (off: %q), want %d", st.KernelLookups, st.KernelLookupsOff, kernelAsked)
	}
	// Truth for the reference: every entry the tool listed is found by
	// either tuple but the one in zone 3 (a GET without a zone asks the
	// default zone), and the absent tuple is not.
	zoned := netip.MustParseAddr("10.61.0.4")
	for i, tu := range tus {
		inZone := i < 2*len(table) && table[i/2].Orig.Src == zoned
		if want := i < 2*len(table) && !inZone; wantFound[i] != want {
			t.Errorf("netlink GETs: %v found %v, want %v", tu, wantFound[i], want)
		}
	}

	// One tuple at a time: by BPF where the tracker asks in place (its
	// namespace is the caller's), by a GET where a thread would have to
	// be woken for it. Both answer as the GETs did.
	single := func(opts conntrack.Options, tu event.Tuple) (conntrack.Entry, bool, uint64) {
		tr, err := conntrack.OpenWith(ctx, "", opts)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		e, ok := tr.Lookup(tu)
		e.Seen = time.Time{}
		return e, ok, tr.Stats().KernelLookups
	}
	k := slices.IndexFunc(tus, func(tu event.Tuple) bool { return tu.Proto == unix.IPPROTO_TCP })
	if !wantFound[k] {
		t.Fatalf("netlink GETs did not find %v", tus[k])
	}
	err = ns.Do(func() error {
		e, ok, n := single(ConntrackOptions(), tus[k])
		if e != want[k] || !ok || n != 1 {
			t.Errorf("in place: %v found %v %+v by %d BPF lookups, want %+v by 1", tus[k], ok, e, n, want[k])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := conntrack.OpenWith(ctx, ns.Path(), ConntrackOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	e, ok := tr.Lookup(tus[k])
	e.Seen = time.Time{}
	if n := tr.Stats().KernelLookups; e != want[k] || !ok || n != 0 {
		t.Errorf("on the tracker's thread: %v found %v %+v by %d BPF lookups, want %+v by a GET", tus[k], ok, e, n, want[k])
	}
}
