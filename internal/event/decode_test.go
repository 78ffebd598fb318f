package event

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

// record builds a raw ring buffer record as bpf/tracer.c writes it.
func record(kind Kind, hook Hook, via Via) []byte {
	b := make([]byte, Size)
	b[OffKind], b[OffHook], b[OffVia] = byte(kind), byte(hook), byte(via)
	b[OffNFHook] = NFHookNone
	return b
}

func putTuple(b []byte, off int, src, dst string, sport, dport uint16, proto uint8) {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	if s.Is4() {
		b[off+TupleOffFamily] = afInet
		a4, b4 := s.As4(), d.As4()
		copy(b[off+TupleOffSrc:], a4[:])
		copy(b[off+TupleOffDst:], b4[:])
	} else {
		b[off+TupleOffFamily] = afInet6
		a16, b16 := s.As16(), d.As16()
		copy(b[off+TupleOffSrc:], a16[:])
		copy(b[off+TupleOffDst:], b16[:])
	}
	binary.BigEndian.PutUint16(b[off+TupleOffSport:], sport)
	binary.BigEndian.PutUint16(b[off+TupleOffDport:], dport)
	b[off+TupleOffProto] = proto
}

func TestDecodeDNAT(t *testing.T) {
	b := record(KindDNAT, HookNFNat, ViaFentry)
	binary.LittleEndian.PutUint64(b[OffTsNs:], 1500)
	binary.LittleEndian.PutUint32(b[OffNetns:], 4026531840)
	binary.LittleEndian.PutUint32(b[OffCTStatus:], 1<<3|1<<5)
	binary.LittleEndian.PutUint32(b[OffRangeFlags:], 3)
	putTuple(b, OffOrig, "10.244.2.9", "10.96.0.20", 40000, 3306, 6)
	putTuple(b, OffReply, "10.96.0.20", "10.244.2.9", 3306, 40000, 6)
	putTuple(b, OffTo, "10.244.1.5", "10.244.1.5", 3306, 3306, 6)
	boot := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e, err := Decode(b, Clock{BootWall: boot})
	if err != nil {
		t.Fatal(err)
	}
	if e.Kind != KindDNAT || e.Hook != HookNFNat || e.Via != ViaFentry {
		t.Fatalf("enums: %v %v %v", e.Kind, e.Hook, e.Via)
	}
	if !e.Time.Equal(boot.Add(1500)) {
		t.Errorf("time %v", e.Time)
	}
	if e.Netns != 4026531840 {
		t.Errorf("netns %d", e.Netns)
	}
	if got := e.Orig.SrcAddrPort().String(); got != "10.244.2.9:40000" {
		t.Errorf("orig src %s", got)
	}
	if got := e.Orig.DstAddrPort().String(); got != "10.96.0.20:3306" {
		t.Errorf("orig dst %s", got)
	}
	if got := e.To.String(); got != "10.244.1.5:3306" {
		t.Errorf("to %s", got)
	}
	if e.Packet.Valid() {
		t.Errorf("packet should be absent: %+v", e.Packet)
	}
	if got := CTStatusNames(e.CTStatus); len(got) != 2 || got[0] != "CONFIRMED" || got[1] != "DST_NAT" {
		t.Errorf("status names %v", got)
	}
	if e.Kind != KindDNAT || e.Via != ViaFentry || e.Hook != HookNFNat || e.Orig.Proto != 6 ||
		e.Reply.SrcAddrPort().String() != "10.96.0.20:3306" {
		t.Errorf("event %+v", e)
	}
}

func TestDecodeIPv6AndICMP(t *testing.T) {
	b := record(KindReject, HookICMPSend, ViaTracepoint)
	putTuple(b, OffPkt, "fd00::1", "fd00::2", 0, 0, 17)
	b[OffICMPType], b[OffICMPCode] = 3, 3
	e, err := Decode(b, Clock{})
	if err != nil {
		t.Fatal(err)
	}
	if !e.Packet.Src.Is6() || e.Packet.Src.String() != "fd00::1" {
		t.Errorf("v6 src %v", e.Packet.Src)
	}
	b = record(KindReject, HookICMPSend, ViaTracepoint)
	putTuple(b, OffPkt, "10.244.1.7", "10.96.0.10", 7, 0x0800, 1)
	b[OffICMPType], b[OffICMPCode] = 3, 3
	e, err = Decode(b, Clock{})
	if err != nil {
		t.Fatal(err)
	}
	if e.Packet.Proto != 1 || e.Packet.Dst.String() != "10.96.0.10" || e.ICMPType != 3 || e.ICMPCode != 3 {
		t.Errorf("icmp event %+v", e)
	}
}

func TestDecodeRejectsBadRecords(t *testing.T) {
	if _, err := Decode(make([]byte, Size-1), Clock{}); err == nil {
		t.Error("short record decoded")
	}
	for _, b := range [][]byte{
		record(0, HookNFNat, ViaFentry),
		record(KindDrop, 99, ViaFentry),
		record(KindDrop, HookKfreeSkb, 9),
	} {
		if _, err := Decode(b, Clock{}); err == nil {
			t.Errorf("bad enums decoded: kind %d hook %d via %d", b[OffKind], b[OffHook], b[OffVia])
		}
	}
	b := record(KindDrop, HookKfreeSkb, ViaTracepoint)
	b[OffPkt+TupleOffFamily] = 7
	if _, err := Decode(b, Clock{}); err == nil {
		t.Error("unknown family decoded")
	}
}

func TestRangeString(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.9")
	cases := map[string]Range{
		"10.0.0.1":                      {MinAddr: a, MaxAddr: a},
		"10.0.0.1-10.0.0.9:80":          {MinAddr: a, MaxAddr: b, MinPort: 80, MaxPort: 80},
		"10.0.0.1:1024-2048":            {MinAddr: a, MaxAddr: a, MinPort: 1024, MaxPort: 2048},
		"[fd00::1]:53":                  {MinAddr: netip.MustParseAddr("fd00::1"), MaxAddr: netip.MustParseAddr("fd00::1"), MinPort: 53, MaxPort: 53},
		"[fd00::1-fd00::9]:30000-32767": {MinAddr: netip.MustParseAddr("fd00::1"), MaxAddr: netip.MustParseAddr("fd00::9"), MinPort: 30000, MaxPort: 32767},
		"10.0.0.1-10.0.0.9":             {MinAddr: a, MaxAddr: b},
		"10.0.0.9":                      {MinAddr: b, MaxPort: 80}, // no ports without a first one
		"":                              {},
	}
	for want, r := range cases {
		if got := r.String(); got != want {
			t.Errorf("%+v: got %q want %q", r, got, want)
		}
		if got := string(r.AppendTo([]byte("x"))); got != "x"+want {
			t.Errorf("%+v: AppendTo gave %q", r, got)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(record(KindDNAT, HookNFNat, ViaFentry))
	f.Add(make([]byte, 3))
	dnat6 := record(KindDNAT, HookNFNat, ViaKprobe)
	putTuple(dnat6, OffOrig, "fd00::2", "fd96::20", 40000, 3306, 6)
	putTuple(dnat6, OffReply, "fd44::5", "fd00::2", 3306, 40000, 6)
	putTuple(dnat6, OffTo, "fd44::5", "fd44::5", 3306, 3306, 6)
	f.Add(dnat6)
	reject6 := record(KindReject, HookICMP6Send, ViaTracepoint)
	putTuple(reject6, OffPkt, "fd00::2", "fd96::20", 128, 0, 58)
	f.Add(reject6)
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Decode(b, Clock{})
		if err == nil {
			_ = e.To.String()
		}
	})
}
