package rules

import (
	"math/bits"
	"net/netip"
	"strings"
)

// Protocol numbers the matches and ipsets know by name.
const (
	ProtoICMP    uint8 = 1
	ProtoTCP     uint8 = 6
	ProtoUDP     uint8 = 17
	ProtoICMPv6  uint8 = 58
	ProtoSCTP    uint8 = 132
	ProtoUDPLite uint8 = 136
)

var protoNames = map[string]uint8{
	"all": 0, "icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "esp": 50,
	"ah": 51, "icmpv6": 58, "ipv6-icmp": 58, "sctp": 132, "udplite": 136, "dccp": 33,
}

// ProtoNumber is the number of a protocol named as iptables or the trace
// names it ("tcp", "icmpv6", ...), 0 when unknown.
func ProtoNumber(name string) uint8 { return protoNames[name] }

// ProtoName is the name iptables uses for a protocol number, or "".
func ProtoName(p uint8) string {
	switch p {
	case ProtoICMP:
		return "icmp"
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoICMPv6:
		return "ipv6-icmp"
	case ProtoSCTP:
		return "sctp"
	case ProtoUDPLite:
		return "udplite"
	}
	return ""
}

func hasPorts(p uint8) bool {
	return p == ProtoTCP || p == ProtoUDP || p == ProtoSCTP || p == ProtoUDPLite || p == 33
}

// CTState is a set of conntrack states, as --ctstate takes them.
type CTState uint8

const (
	CTInvalid CTState = 1 << iota
	CTNew
	CTEstablished
	CTRelated
	CTUntracked
	// CTSNAT and CTDNAT are the virtual states of --ctstate: the connection
	// is (or is not) source/destination translated.
	CTSNAT
	CTDNAT
)

var ctStateNames = []struct {
	s    CTState
	name string
}{
	{CTInvalid, "INVALID"}, {CTNew, "NEW"}, {CTEstablished, "ESTABLISHED"},
	{CTRelated, "RELATED"}, {CTUntracked, "UNTRACKED"}, {CTSNAT, "SNAT"}, {CTDNAT, "DNAT"},
}

func (s CTState) String() string {
	var parts []string
	for _, n := range ctStateNames {
		if s&n.s != 0 {
			parts = append(parts, n.name)
		}
	}
	return strings.Join(parts, ",")
}

// Packet is what the evaluator matches rules against: the packet as the
// given hook sees it.
type Packet struct {
	Proto uint8 // ProtoTCP, ProtoUDP, ...
	Src   netip.AddrPort
	Dst   netip.AddrPort
	// ICMPType and ICMPCode are used when Proto is ICMP or ICMPv6 and
	// ICMPKnown is set; ipsets see them as the port dimension, as the
	// kernel does.
	ICMPType, ICMPCode uint8
	ICMPKnown          bool
	// InIface and OutIface are the interface names; "" means unknown (or
	// none at this hook), which makes -i/-o matches uncertain.
	InIface, OutIface string
	// State is the conntrack state of the packet: exactly one of CTNew,
	// CTEstablished, CTRelated, CTInvalid, CTUntracked. Zero means unknown:
	// --ctstate matches are then uncertain, and the nat table is walked as
	// for the first packet of a connection (the only one it sees).
	State CTState
	// NATed may add CTSNAT/CTDNAT when the caller knows the connection's
	// translation (for --ctstate SNAT/DNAT); KnowNAT says it does.
	NATed   CTState
	KnowNAT bool
	// OrigDst is the conntrack original-direction destination for
	// --ctorigdst; invalid means unknown.
	OrigDst netip.Addr
	// Mark is the packet mark on entry; MARK targets change it as the walk
	// goes on and the Result reports the mark on exit.
	Mark uint32
	// Reads, when set, is told which of the packet's fields an evaluation
	// depended on, so that a caller can reuse one packet's answer for
	// packets that differ only in fields no rule looked at. It is shared by
	// every copy of the packet an evaluation makes.
	Reads *Reads
}

// Reads records the packet fields an evaluation read that callers may
// leave out of a cache key: the source port, which every connection has
// its own of and few rules look at, and how much of the source address,
// which rules mostly test against prefixes.
type Reads struct {
	SrcPort bool
	// SrcBits is how many leading bits of the source address the
	// evaluation's tests needed: every test it made has the same outcome
	// for any source address of the family that shares them.
	SrcBits int
}

// srcPort is the packet's source port, recorded as read.
func (p *Packet) srcPort() uint16 {
	if p.Reads != nil {
		p.Reads.SrcPort = true
	}
	return p.Src.Port()
}

// SrcPortRead reads the source port for another rule source's evaluator
// (internal/nft), recording the read.
func (p *Packet) SrcPortRead() uint16 { return p.srcPort() }

// srcAddr is the packet's source address, recorded as read whole.
func (p *Packet) srcAddr() netip.Addr {
	a := p.Src.Addr()
	p.readSrcBits(a.BitLen())
	return a
}

// SrcAddrRead reads the source address for another rule source's
// evaluator (internal/nft), recording it as read whole.
func (p *Packet) SrcAddrRead() netip.Addr { return p.srcAddr() }

// srcIn says whether the source address (an IPv4-mapped one as IPv4) is
// in pre, recording only the bits the answer took: the prefix's when it
// is, and when it is not, those up to the first bit where the two differ,
// since every address that shares them is outside it too.
func (p *Packet) srcIn(pre netip.Prefix) bool {
	a := p.Src.Addr()
	if a.Is4In6() {
		// Its bits are not where the prefix's are: the key holds it whole.
		p.readSrcBits(a.BitLen())
		return pre.Contains(a.Unmap())
	}
	if pre.Addr().BitLen() != a.BitLen() {
		// The other family's prefix holds no address of this one.
		return false
	}
	in := pre.Contains(a)
	if in {
		p.readSrcBits(pre.Bits())
	} else {
		p.readSrcBits(min(commonBits(a, pre.Addr())+1, pre.Bits()))
	}
	return in
}

func (p *Packet) readSrcBits(n int) {
	if p.Reads != nil && n > p.Reads.SrcBits {
		p.Reads.SrcBits = n
	}
}

// commonBits is how many leading bits two addresses of one family share.
func commonBits(a, b netip.Addr) int {
	x, y := a.As16(), b.As16()
	n := 0
	if a.Is4() {
		n = -96 // As16 puts an IPv4 address after 96 bits of ::ffff:0:0/96
	}
	for i := range x {
		if d := x[i] ^ y[i]; d != 0 {
			return n + bits.LeadingZeros8(d)
		}
		n += 8
	}
	return n
}

// port returns the value ipset and port matches see for one side of the
// packet: the port for port protocols, type<<8|code for ICMP (as ipset's
// ip_set_get_ip4_port does).
func (p *Packet) port(d Dir) (uint16, bool) {
	switch {
	case hasPorts(p.Proto):
		if d == DirSrc {
			return p.srcPort(), true
		}
		return p.Dst.Port(), true
	case p.Proto == ProtoICMP || p.Proto == ProtoICMPv6:
		return uint16(p.ICMPType)<<8 | uint16(p.ICMPCode), p.ICMPKnown
	}
	return 0, true
}
