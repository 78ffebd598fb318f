package conntrack

import (
	"net/netip"
	"os"
	"testing"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netlab"
)

// getterIn opens a getter in ns; the caller closes it.
func getterIn(tb testing.TB, ns netlab.Namespace) *getter {
	tb.Helper()
	fd, err := unix.Open(ns.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	defer unix.Close(fd)
	g, err := newGetter(&netlink.Config{NetNS: fd})
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// toTuple is fromTuple's inverse, for asking ti-mo/conntrack.
func toTuple(tu event.Tuple) ct.Tuple {
	out := ct.Tuple{
		IP:    ct.IPTuple{SourceAddress: tu.Src, DestinationAddress: tu.Dst},
		Proto: ct.ProtoTuple{Protocol: tu.Proto, SourcePort: tu.SrcPort, DestinationPort: tu.DstPort},
	}
	if tu.Proto == unix.IPPROTO_ICMP || tu.Proto == unix.IPPROTO_ICMPV6 {
		out.Proto.SourcePort, out.Proto.DestinationPort = 0, 0
		out.Proto.ICMPID = tu.SrcPort
		out.Proto.ICMPType, out.Proto.ICMPCode = uint8(tu.DstPort>>8), uint8(tu.DstPort)
	}
	return out
}

// TestPrivGetterMatchesTiMo: for every entry of a table with TCP (with
// its protoinfo), UDP, ICMP, ICMPv6 and IPv6 entries, a mark and a zone,
// the getter's entry by either tuple is the one ti-mo/conntrack decodes
// from the kernel's own GET reply; a tuple nobody has is a miss.
func TestPrivGetterMatchesTiMo(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "trcc-g1")
	insert := inserter(t, ns)
	insert("-p", "tcp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--sport", "40000", "--dport", "80", "--state", "ESTABLISHED",
		"-r", "10.3.0.9", "-q", "10.1.0.5", "--reply-port-src", "8080", "--reply-port-dst", "40000", "--mark", "77", "-u", "SEEN_REPLY,ASSURED")
	insert("-p", "udp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--sport", "5353", "--dport", "53")
	insert("-p", "udp", "-s", "fd00::5", "-d", "fd00::1", "--sport", "5353", "--dport", "53")
	insert("-p", "icmp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--icmp-type", "8", "--icmp-code", "0", "--icmp-id", "77")
	insert("-p", "icmpv6", "-s", "fd00::5", "-d", "fd00::1", "--icmpv6-type", "128", "--icmpv6-code", "0", "--icmpv6-id", "78")
	insert("-p", "tcp", "-s", "10.1.0.6", "-d", "10.2.0.1", "--sport", "40001", "--dport", "80", "--state", "SYN_SENT", "-w", "3")

	g := getterIn(t, ns)
	defer g.Close()
	c := dialIn(t, ns)
	defer c.Close()
	flows := dumpFlows(t, ns)
	if len(flows) != 6 {
		t.Fatalf("kernel has %d entries, inserted 6", len(flows))
	}
	compared, states := 0, 0
	for _, f := range flows {
		want := fromFlow(&f)
		for _, tu := range []event.Tuple{want.Orig, want.Reply} {
			got, ok, err := g.get(tu)
			if !ok || err != nil {
				if want.Zone != 0 {
					continue // a GET without CTA_ZONE asks zone 0, as ti-mo's does
				}
				t.Fatalf("get %v: %v %v (kernel has %+v)", tu, ok, err, want)
			}
			tf, err := c.Get(ct.Flow{TupleOrig: toTuple(tu)})
			if err != nil {
				t.Fatalf("ti-mo get %v: %v", tu, err)
			}
			if timo := fromFlow(&tf); got != timo {
				t.Errorf("get %v:\n getter %+v\n ti-mo  %+v", tu, got, timo)
			}
			compared++
			if got.State != "" {
				states++
			}
		}
	}
	if compared != 10 || states != 2 {
		t.Errorf("compared %d entries (%d with a TCP state), want the 5 of zone 0 by both tuples (one TCP)", compared, states)
	}
	miss := flows[0]
	missTu := fromFlow(&miss).Orig
	missTu.SrcPort++
	if e, ok, err := g.get(missTu); ok || err != nil {
		t.Errorf("get of a tuple nobody has: %+v %v %v", e, ok, err)
	}
}

// BenchmarkPrivGet is one entry asked for by the getter and by ti-mo's Get.
func BenchmarkPrivGet(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("privileged benchmark: needs root to create a network namespace")
	}
	ns := nodeNamespace(b, "trcc-b1")
	inserter(b, ns)("-p", "udp", "-s", "10.1.0.5", "-d", "10.2.0.1", "--sport", "5353", "--dport", "53")
	tu := event.Tuple{Src: netip.MustParseAddr("10.1.0.5"), Dst: netip.MustParseAddr("10.2.0.1"), SrcPort: 5353, DstPort: 53, Proto: 17}
	g := getterIn(b, ns)
	defer g.Close()
	c := dialIn(b, ns)
	defer c.Close()
	b.Run("getter", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok, err := g.get(tu); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("ti-mo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Get(ct.Flow{TupleOrig: toTuple(tu)}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
