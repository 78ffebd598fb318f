package trace_test

import (
	"net/netip"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

func tuple(proto uint8, src, dst string) event.Tuple {
	s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
	return event.Tuple{Src: s.Addr(), Dst: d.Addr(), SrcPort: s.Port(), DstPort: d.Port(), Proto: proto}
}

// The event kinds are named as the trace format names them.
func TestKindNamesAreTheFormats(t *testing.T) {
	for kind, name := range map[event.Kind]string{
		event.KindDNAT: trace.KindDNAT, event.KindSNAT: trace.KindSNAT, event.KindIPVS: trace.KindIPVS,
		event.KindIPVSNoDest: trace.KindIPVSNoDest, event.KindReject: trace.KindReject,
		event.KindReset: trace.KindReset, event.KindDrop: trace.KindDrop,
	} {
		if got := trace.EventOf(event.Event{Kind: kind}, nil).Kind; got != name {
			t.Errorf("kind %d is %q in a trace, want %q", kind, got, name)
		}
	}
}

func TestEventOfDNAT(t *testing.T) {
	be := netip.MustParseAddr("10.244.1.5")
	e := event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaFentry, NFHook: 0,
		Orig: tuple(6, "10.244.2.9:40000", "10.96.0.20:3306"), Reply: tuple(6, "10.96.0.20:3306", "10.244.2.9:40000"),
		To: event.Range{MinAddr: be, MaxAddr: be, MinPort: 3306, MaxPort: 3306}, CTStatus: 1<<3 | 1<<5}
	r := trace.EventOf(e, nil)
	if r.Kind != trace.KindDNAT || r.Via != "fentry" || r.Hook != "nf_nat_setup_info" || r.Proto != "tcp" || r.NFHook != "PREROUTING" ||
		r.Orig.Dst != "10.96.0.20:3306" || r.Reply.Src != "10.96.0.20:3306" || r.To != "10.244.1.5:3306" ||
		len(r.CTStatus) != 2 || r.CTStatus[0] != "CONFIRMED" || r.CTStatus[1] != "DST_NAT" || r.Packet != nil {
		t.Errorf("record %+v", r)
	}
}

func TestEventOfICMPAndIPv6(t *testing.T) {
	icmp := event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet: tuple(1, "10.244.1.7:7", "10.96.0.10:2048"), ICMPType: 3, ICMPCode: 3}
	r := trace.EventOf(icmp, nil)
	if r.Reason != "icmp-port-unreachable" || r.Packet.Dst != "10.96.0.10" || r.Proto != "icmp" || r.NFHook != "" {
		t.Errorf("icmp record %+v packet %+v", r, r.Packet)
	}
	// An ICMPv6 error whose packet could not be read is named by its hook.
	unread6 := event.Event{Kind: event.KindReject, Hook: event.HookICMP6Send, Via: event.ViaFentry, NFHook: event.NFHookNone, ICMPType: 1, ICMPCode: 4}
	if r := trace.EventOf(unread6, nil); r.Reason != "icmp6-port-unreachable" {
		t.Errorf("an unread packet's ICMPv6 error named %q", r.Reason)
	}
	udp6 := event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet: tuple(17, "[fd00::1]:53", "[fd00::2]:5353")}
	if r := trace.EventOf(udp6, nil); r.Packet.Src != "[fd00::1]:53" || r.Proto != "udp" {
		t.Errorf("ipv6 record %+v packet %+v", r, r.Packet)
	}
}

// Whatever the decoder accepts, the encoder writes, and an Encoder that
// has written other endpoints before writes the same.
func FuzzEventOf(f *testing.F) {
	f.Add(make([]byte, event.Size))
	var enc trace.Encoder
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, err := event.Decode(b, event.Clock{BootWall: time.Unix(0, 0)}); err == nil {
			want := trace.EventOf(e, nil)
			if got := enc.Event(e, nil); !reflect.DeepEqual(got, want) {
				t.Fatalf("Encoder wrote %+v, EventOf %+v", got, want)
			}
		}
	})
}

// TestEncoderReusesOnlyItsOwnEndpoints: endpoints that share a slot of
// the Encoder's memory are each written as themselves, and an endpoint
// written before comes back as the same string.
func TestEncoderReusesOnlyItsOwnEndpoints(t *testing.T) {
	var enc trace.Encoder
	for round := range 2 {
		for i := range 5000 {
			a := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1})
			if i%3 == 0 {
				a = netip.AddrFrom16([16]byte{0xfd, 15: byte(i)})
			}
			tu := event.Tuple{Src: a, Dst: netip.MustParseAddr("10.96.0.10"), SrcPort: uint16(30000 + i), DstPort: 443, Proto: 6}
			got, want := enc.Tuple(tu), trace.TupleOf(tu)
			if *got != *want {
				t.Fatalf("round %d, endpoint %d: got %+v, want %+v", round, i, got, want)
			}
		}
	}
	tu := event.Tuple{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.96.0.10"), SrcPort: 1, DstPort: 443, Proto: 6}
	first, second := enc.Tuple(tu), enc.Tuple(tu)
	if unsafe.StringData(first.Dst) != unsafe.StringData(second.Dst) {
		t.Error("the same endpoint twice was written twice")
	}
}

// TestEncoderICMPAndNATRanges: an ICMP tuple's addresses and a NAT's
// range, written from the encoder's cache, read as EventOf writes them
// without it: one endpoint or a range of addresses or ports, IPv4 or
// IPv6, with a port or none; 5,000 ICMP addresses through the cache's
// slots; and an ICMP address seen twice is one string.
func TestEncoderICMPAndNATRanges(t *testing.T) {
	var enc trace.Encoder
	v4, v4b := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.1.9")
	v6, v6b := netip.MustParseAddr("fd00::5"), netip.MustParseAddr("fd00::9")
	ranges := []event.Range{
		{MinAddr: v4, MinPort: 8080, MaxPort: 8080},
		{MinAddr: v4, MaxAddr: v4, MinPort: 8080, MaxPort: 8080},
		{MinAddr: v6, MaxAddr: v6, MinPort: 53, MaxPort: 53},
		{MinAddr: v4, MaxAddr: v4b, MinPort: 8080, MaxPort: 8080},
		{MinAddr: v6, MaxAddr: v6b},
		{MinAddr: v4, MinPort: 1024, MaxPort: 65535},
		{MinAddr: v4},
		{MinAddr: v4, MaxAddr: v4},
		{},
	}
	for round := range 2 {
		for _, r := range ranges {
			e := event.Event{Kind: event.KindDNAT, Orig: event.Tuple{Src: v4, Dst: v4b, SrcPort: 1, DstPort: 2, Proto: 6}, To: r}
			if got, want := enc.Event(e, nil).To, trace.EventOf(e, nil).To; got != want || want != r.String() {
				t.Errorf("round %d, range %+v: encoder %q, EventOf %q, Range.String %q", round, r, got, want, r.String())
			}
		}
		for _, a := range []netip.Addr{v4, v6} {
			e := event.Event{Kind: event.KindReject, Packet: event.Tuple{Src: a, Dst: a, SrcPort: 7, DstPort: 8 << 8, Proto: 1}}
			if got, want := *enc.Event(e, nil).Packet, *trace.EventOf(e, nil).Packet; got != want {
				t.Errorf("round %d, ICMP tuple of %v: encoder %+v, EventOf %+v", round, a, got, want)
			}
		}
	}
	for i := range 5000 {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1})
		if i%3 == 0 {
			a = netip.AddrFrom16([16]byte{0xfd, 15: byte(i)})
		}
		// An ICMP tuple's bare address and the same address with port 0
		// share a slot in turn.
		for _, tu := range []event.Tuple{{Src: a, Dst: v4, Proto: 1}, {Src: a, Dst: v4, Proto: 17}, {Src: a, Dst: v4, Proto: 1}} {
			if got, want := enc.Tuple(tu), trace.TupleOf(tu); *got != *want {
				t.Fatalf("address %d, protocol %d: got %+v, want %+v", i, tu.Proto, got, want)
			}
		}
	}
	icmp := event.Tuple{Src: v4, Dst: v4b, Proto: 1}
	if first, second := enc.Tuple(icmp), enc.Tuple(icmp); unsafe.StringData(first.Src) != unsafe.StringData(second.Src) {
		t.Error("the same ICMP address twice was written twice")
	}
}
