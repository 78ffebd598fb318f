package nft

import (
	"fmt"
	"net/netip"

	"github.com/tracer-dev/tracer/internal/rules"
)

// expr is a value expression on the left of a match, a vmap key or a mark
// statement: a packet field, metadata, conntrack, a route lookup, numgen, a
// bitwise operation on one of those, or a concatenation.
type expr struct {
	kind  ekind
	typ   vtype
	proto string // payload protocol: ip, ip6, tcp, udp, sctp, th, icmp, icmpv6
	field string // payload field, meta/ct key, fib result
	flags []string
	op    string // binop: &, |, ^
	x     *expr
	y     val
	parts []*expr // concat
	text  string  // for reasons: "numgen random mod 2"
}

type ekind uint8

const (
	ePayload ekind = iota + 1
	eMeta
	eCT
	eFib
	eNumgen
	eBinop
	eConcat
	eConst
	eUnknown
)

// known says whether a field's value could be read from what the tracer
// knows of the packet.
type known uint8

const (
	isKnown known = iota
	isUnknown
	// isAbsent: the packet has no such field (tcp dport of a UDP packet, ip
	// saddr of an IPv6 packet in an inet table): every match on it fails,
	// as nft's implicit protocol dependency makes it.
	isAbsent
)

// pktEnv is the packet as a chain sees it, with the mark the walk has set.
type pktEnv struct {
	pkt    *rules.Packet
	family string // ip or ip6
	node   rules.NodeState
	mark   uint32
}

// eval reads one value; why says what was not known.
func (e *expr) eval(env *pktEnv) (val, known, string) {
	switch e.kind {
	case eConst:
		return e.y, isKnown, ""
	case ePayload:
		return env.payload(e.proto, e.field)
	case eMeta:
		return env.meta(e.field)
	case eCT:
		return env.ct(e.field)
	case eFib:
		return env.fib(e)
	case eBinop:
		v, k, why := e.x.eval(env)
		if k != isKnown {
			return v, k, why
		}
		switch e.op {
		case "&":
			v.n &= e.y.n
		case "|":
			v.n |= e.y.n
		case "^":
			v.n ^= e.y.n
		case "<<":
			v.n <<= e.y.n
		case ">>":
			v.n >>= e.y.n
		default:
			return val{}, isUnknown, "operator " + e.op
		}
		return v, isKnown, ""
	}
	return val{}, isUnknown, e.text
}

func (env *pktEnv) payload(proto, field string) (val, known, string) {
	p := env.pkt
	switch proto {
	case "ip", "ip6":
		if proto != env.family {
			return val{}, isAbsent, ""
		}
		switch field {
		case "saddr":
			return val{addr: p.SrcAddrRead().Unmap()}, isKnown, ""
		case "daddr":
			return val{addr: p.Dst.Addr().Unmap()}, isKnown, ""
		case "protocol", "nexthdr":
			return val{n: uint64(p.Proto)}, isKnown, ""
		}
	case "tcp", "udp", "sctp", "udplite", "dccp", "th":
		if proto != "th" && protoByName[proto] != uint64(p.Proto) {
			return val{}, isAbsent, ""
		}
		if !portProto(p.Proto) {
			if proto == "th" {
				return val{}, isUnknown, "th " + field + " of a packet without ports"
			}
			return val{}, isAbsent, ""
		}
		switch field {
		case "sport":
			return val{n: uint64(p.SrcPortRead())}, isKnown, ""
		case "dport":
			return val{n: uint64(p.Dst.Port())}, isKnown, ""
		case "flags":
			if p.Proto == rules.ProtoTCP && p.State == rules.CTNew {
				return val{n: tcpFlagBits["syn"]}, isKnown, "" // the first packet of a connection
			}
		}
	case "icmp", "icmpv6":
		want := uint64(rules.ProtoICMP)
		if proto == "icmpv6" {
			want = uint64(rules.ProtoICMPv6)
		}
		if uint64(p.Proto) != want {
			return val{}, isAbsent, ""
		}
		if !p.ICMPKnown {
			return val{}, isUnknown, proto + " " + field + " not known"
		}
		switch field {
		case "type":
			return val{n: uint64(p.ICMPType)}, isKnown, ""
		case "code":
			return val{n: uint64(p.ICMPCode)}, isKnown, ""
		}
	}
	return val{}, isUnknown, fmt.Sprintf("%s %s", proto, field)
}

func portProto(p uint8) bool {
	return p == rules.ProtoTCP || p == rules.ProtoUDP || p == rules.ProtoSCTP || p == rules.ProtoUDPLite || p == 33
}

func (env *pktEnv) meta(key string) (val, known, string) {
	p := env.pkt
	switch key {
	case "l4proto", "protocol":
		if key == "protocol" {
			break // the ethertype: not kept
		}
		return val{n: uint64(p.Proto)}, isKnown, ""
	case "nfproto":
		if env.family == "ip6" {
			return val{n: 10}, isKnown, ""
		}
		return val{n: 2}, isKnown, ""
	case "mark":
		return val{n: uint64(env.mark)}, isKnown, ""
	}
	return val{}, isUnknown, "meta " + key
}

func (env *pktEnv) ct(key string) (val, known, string) {
	p := env.pkt
	switch key {
	case "state":
		for s, bit := range map[rules.CTState]uint64{rules.CTNew: 8, rules.CTEstablished: 2, rules.CTRelated: 4,
			rules.CTInvalid: 1, rules.CTUntracked: 64} {
			if p.State == s {
				return val{n: bit}, isKnown, ""
			}
		}
		return val{}, isUnknown, "ct state not known"
	case "status":
		if !p.KnowNAT {
			return val{}, isUnknown, "ct status not known"
		}
		var n uint64
		if p.NATed&rules.CTSNAT != 0 {
			n |= ctStatusBits["snat"]
		}
		if p.NATed&rules.CTDNAT != 0 {
			n |= ctStatusBits["dnat"]
		}
		return val{n: n}, isKnown, ""
	}
	return val{}, isUnknown, "ct " + key
}

// fib answers `fib daddr type` (and saddr) from the node's local routes,
// which is what the kernel's route lookup decides for local addresses.
func (env *pktEnv) fib(e *expr) (val, known, string) {
	if e.field != "type" || len(e.flags) != 1 || (e.flags[0] != "daddr" && e.flags[0] != "saddr") {
		return val{}, isUnknown, e.text
	}
	a := env.pkt.Dst.Addr()
	if e.flags[0] == "saddr" {
		a = env.pkt.SrcAddrRead()
	}
	a = a.Unmap()
	if env.node == nil {
		return val{}, isUnknown, e.text + ": no node state"
	}
	local, err := env.node.IsLocal(a)
	if err != nil {
		return val{}, isUnknown, fmt.Sprintf("%s: %v", e.text, err)
	}
	switch {
	case local:
		return val{n: fibTypes["local"]}, isKnown, ""
	case a.IsMulticast():
		return val{n: fibTypes["multicast"]}, isKnown, ""
	case a == netip.IPv4Unspecified() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return val{}, isUnknown, e.text + " of a broadcast address"
	}
	return val{n: fibTypes["unicast"]}, isKnown, ""
}
