package conntrack

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// Get is one lookup: the kernel finds the entry by either tuple, asked
// by the KernelTable where it answers in place, else by a ctnetlink GET.
// A table on a thread of its own is left to batches: handing it one tuple
// costs two thread wake-ups, which a GET does not.
func (s *netlinkSource) Get(tu event.Tuple) (Entry, bool, error) {
	if s.kernel != nil && s.kernel.inPlace() && s.kernel.table.Answers(tu) {
		var e [1]Entry
		var ok [1]bool
		if err := s.GetAll([]event.Tuple{tu}, e[:], ok[:]); err != nil {
			return Entry{}, false, err
		}
		return e[0], ok[0], nil
	}
	e, ok, err := s.getter.get(tu)
	if err != nil {
		return Entry{}, false, fmt.Errorf("get conntrack entry %v: %w", tu, err)
	}
	return e, ok, nil
}

// GetAll asks for many entries: the KernelTable those it answers, the
// rest a few GETs to a write (getter.getAll).
func (s *netlinkSource) GetAll(tus []event.Tuple, entries []Entry, found []bool) error {
	var err error
	if s.kernel != nil {
		err = s.kernel.getAll(tus, entries, found, s.getter.getAll)
	} else {
		err = s.getter.getAll(tus, entries, found)
	}
	if err != nil {
		return fmt.Errorf("get %d conntrack entries: %w", len(tus), err)
	}
	return nil
}

// ctnetlink's dump filter (linux/netfilter/nfnetlink_conntrack.h, 5.8+):
// CTA_FILTER's CTA_FILTER_ORIG_FLAGS say which fields of CTA_TUPLE_ORIG an
// entry's original tuple must match.
const (
	ctaTupleOrig      = 1
	ctaTupleIP        = 1
	ctaTupleProto     = 2
	ctaIPv4Src        = 1
	ctaIPv6Src        = 3
	ctaProtoNum       = 1
	ctaProtoSrcPort   = 2
	ctaProtoICMPID    = 4
	ctaProtoICMPv6ID  = 7
	ctaFilter         = 25
	ctaFilterOrigFlag = 1

	filterIPSrc    = 1 << 0
	filterProtoNum = 1 << 3
	filterSrcPort  = 1 << 4
	filterICMPID   = 1 << 8
	filterICMPv6ID = 1 << 11
	ipctnlMsgCTGet = 1
)

// DumpSource has the kernel walk its table and send only the entries
// whose original tuple leaves from src: one round trip whatever the
// table's size, instead of copying the table to find a few.
func (s *netlinkSource) DumpSource(proto uint8, src netip.AddrPort) ([]Entry, error) {
	req, err := sourceDumpRequest(proto, src)
	if err != nil {
		return nil, fmt.Errorf("dump conntrack entries from %v: %w", src, err)
	}
	msgs, err := s.query.Query(req)
	if err != nil {
		return nil, fmt.Errorf("dump conntrack entries from %v: %w", src, err)
	}
	out := make([]Entry, 0, len(msgs))
	for _, m := range msgs {
		var ev ct.Event
		if err := ev.Unmarshal(m); err != nil || ev.Flow == nil {
			return nil, fmt.Errorf("dump conntrack entries from %v: decode: %w", src, err)
		}
		// The kernel does not compare an IPv6 source (see
		// sourceDumpRequest): the address is checked here.
		if e := fromFlow(ev.Flow); e.Orig.Proto == proto && e.Orig.SrcAddrPort() == src {
			out = append(out, e)
		}
	}
	return out, nil
}

// sourceDumpRequest is the filtered dump request: CTA_TUPLE_ORIG with the
// source address, protocol and source port (ICMP: echo id), and the
// flags that make the kernel compare exactly those.
func sourceDumpRequest(proto uint8, src netip.AddrPort) (netlink.Message, error) {
	addr, family, ipAttr := src.Addr(), netfilter.ProtoIPv4, uint16(ctaIPv4Src)
	flags := uint32(filterIPSrc | filterProtoNum)
	if addr.Is6() {
		// Linux 6.18 inverts the filter's IPv6 source comparison: a
		// dump filtered on one IPv6 source returns the other sources'
		// entries and none of its own. Only the protocol and port are
		// left to it.
		family, ipAttr = netfilter.ProtoIPv6, ctaIPv6Src
		flags &^= filterIPSrc
	}
	protoAttrs := []netfilter.Attribute{{Type: ctaProtoNum, Data: []byte{proto}}}
	if portAttr, portFlag, ok := sourcePortAttr(proto); ok {
		protoAttrs = append(protoAttrs, netfilter.Attribute{Type: portAttr, Data: netfilter.Uint16Bytes(src.Port())})
		flags |= portFlag
	}
	// The flags are an NLA_U32, in host byte order unlike the tuple.
	nativeFlags := make([]byte, 4)
	binary.NativeEndian.PutUint32(nativeFlags, flags)
	attrs := []netfilter.Attribute{
		{Type: ctaTupleOrig, Nested: true, Children: []netfilter.Attribute{
			{Type: ctaTupleIP, Nested: true, Children: []netfilter.Attribute{{Type: ipAttr, Data: addr.AsSlice()}}},
			{Type: ctaTupleProto, Nested: true, Children: protoAttrs},
		}},
		{Type: ctaFilter, Nested: true, Children: []netfilter.Attribute{{Type: ctaFilterOrigFlag, Data: nativeFlags}}},
	}
	return netfilter.MarshalNetlink(netfilter.Header{
		SubsystemID: netfilter.NFSubsysCTNetlink,
		MessageType: netfilter.MessageType(ipctnlMsgCTGet),
		Family:      family,
		Flags:       netlink.Request | netlink.Dump,
	}, attrs)
}

// sourcePortAttr is the attribute of the protocol's source port (ICMP:
// its echo id) and its filter flag, for the protocols conntrack keys by
// port.
func sourcePortAttr(proto uint8) (attr uint16, flag uint32, ok bool) {
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_UDPLITE, unix.IPPROTO_SCTP, unix.IPPROTO_DCCP:
		return ctaProtoSrcPort, filterSrcPort, true
	case unix.IPPROTO_ICMP:
		return ctaProtoICMPID, filterICMPID, true
	case unix.IPPROTO_ICMPV6:
		return ctaProtoICMPv6ID, filterICMPv6ID, true
	}
	return 0, 0, false
}
