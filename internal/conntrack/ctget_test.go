package conntrack

import (
	"testing"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
)

// destroyMessage is a DESTROY event as ctnetlink lays it out: a DNAT'd TCP
// connection with its TCP protoinfo, status, mark and zone.
func destroyMessage(t testing.TB) netlink.Message {
	t.Helper()
	tuple := func(typ uint16, src, dst [4]byte, sport, dport uint16) netfilter.Attribute {
		return netfilter.Attribute{Type: typ, Nested: true, Children: []netfilter.Attribute{
			{Type: ctaTupleIP, Nested: true, Children: []netfilter.Attribute{{Type: ctaIPv4Src, Data: src[:]}, {Type: ctaIPv4Dst, Data: dst[:]}}},
			{Type: ctaTupleProto, Nested: true, Children: []netfilter.Attribute{
				{Type: ctaProtoNum, Data: []byte{6}}, {Type: ctaProtoSrcPort, Data: be16(sport)}, {Type: ctaProtoDstPort, Data: be16(dport)}}},
		}}
	}
	attrs := []netfilter.Attribute{
		tuple(ctaTupleOrig, [4]byte{10, 244, 1, 7}, [4]byte{10, 96, 0, 10}, 40000, 80),
		tuple(ctaTupleReply, [4]byte{10, 244, 2, 5}, [4]byte{10, 244, 1, 7}, 8080, 40000),
		{Type: ctaStatus, Data: netfilter.Uint32Bytes(StatusSeenReply | StatusAssured | StatusConfirmed | StatusDstNAT)},
		{Type: ctaMark, Data: netfilter.Uint32Bytes(77)},
		{Type: ctaZone, Data: be16(3)},
		{Type: ctaProtoInfo, Nested: true, Children: []netfilter.Attribute{
			{Type: ctaProtoInfoTCP, Nested: true, Children: []netfilter.Attribute{{Type: ctaProtoInfoTCPSt, Data: []byte{7}}}}}},
	}
	m, err := netfilter.MarshalNetlink(netfilter.Header{SubsystemID: netfilter.NFSubsysCTNetlink,
		MessageType: netfilter.MessageType(ctMsgDelete), Family: netfilter.ProtoIPv4}, attrs)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// timoEntry is the entry as the full tracker reads it: ti-mo/conntrack's
// decoding and fromFlow.
func timoEntry(t testing.TB, m netlink.Message) Entry {
	t.Helper()
	var ev ct.Event
	if err := ev.Unmarshal(m); err != nil || ev.Flow == nil {
		t.Fatalf("ti-mo decode: %v", err)
	}
	return fromFlow(ev.Flow)
}

// TestParseEntryMatchesTiMo: the tracker's decoder reads a
// DESTROY as ti-mo/conntrack does.
func TestParseEntryMatchesTiMo(t *testing.T) {
	m := destroyMessage(t)
	got, err := parseEntry(m.Data[nfgenHdrLen:])
	if err != nil {
		t.Fatal(err)
	}
	if want := timoEntry(t, m); got != want {
		t.Fatalf("parseEntry\n got %+v\nti-mo %+v", got, want)
	}
	if got.State != "TIME_WAIT" || got.Mark != 77 || got.Zone != 3 || !got.Replied {
		t.Errorf("entry %+v", got)
	}
}

// BenchmarkDecodeDestroy is one DESTROY event decoded by the tracker's
// decoder and, for comparison, by ti-mo/conntrack.
func BenchmarkDecodeDestroy(b *testing.B) {
	m := destroyMessage(b)
	b.Run("parseEntry", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := parseEntry(m.Data[nfgenHdrLen:]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ti-mo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ev ct.Event
			if err := ev.Unmarshal(m); err != nil {
				b.Fatal(err)
			}
			_ = fromFlow(ev.Flow)
		}
	})
}
