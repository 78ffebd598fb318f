package nft

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// vtype is the datatype of a value: it decides how a constant on the right
// of a match is read ("tcp" is a protocol number, "local" a route type).
type vtype uint8

const (
	tInt vtype = iota
	tAddr
	tProto
	tPort
	tMark
	tCTState
	tCTStatus
	tFibType
	tICMPType
	tICMP6Type
	tTCPFlags
	tIfname
	tNFProto
)

// typeByName maps nft's type names (set "type" fields) to vtypes.
var typeByName = map[string]vtype{
	"ipv4_addr": tAddr, "ipv6_addr": tAddr, "inet_proto": tProto, "inet_service": tPort,
	"mark": tMark, "ct_state": tCTState, "ct_status": tCTStatus, "fib_addrtype": tFibType,
	"icmp_type": tICMPType, "icmpv6_type": tICMP6Type, "tcp_flag": tTCPFlags,
	"ifname": tIfname, "nf_proto": tNFProto, "integer": tInt,
}

// val is one field's value: an address or a number (protocols, ports,
// marks, flag bits and route types are numbers).
type val struct {
	addr netip.Addr
	n    uint64
}

func (v val) isAddr() bool { return v.addr.IsValid() }

func (v val) cmp(w val) int {
	if v.isAddr() || w.isAddr() {
		return v.addr.Compare(w.addr)
	}
	switch {
	case v.n < w.n:
		return -1
	case v.n > w.n:
		return 1
	}
	return 0
}

// keyPart is one field of a set element or of a constant on the right of
// a match: a single value (lo == hi), a prefix or a range, inclusive.
type keyPart struct {
	lo, hi val
	text   string
}

func (k keyPart) contains(v val) bool { return v.cmp(k.lo) >= 0 && v.cmp(k.hi) <= 0 }

var (
	protoByName = map[string]uint64{"icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "esp": 50,
		"ah": 51, "ipv6-icmp": 58, "icmpv6": 58, "sctp": 132, "udplite": 136, "dccp": 33}
	// nf_conntrack_common.h: NF_CT_STATE_BIT(IP_CT_*) and UNTRACKED.
	ctStateBits  = map[string]uint64{"invalid": 1, "established": 2, "related": 4, "new": 8, "untracked": 64}
	ctStatusBits = map[string]uint64{"expected": 1, "seen-reply": 2, "assured": 4, "confirmed": 8,
		"snat": 16, "dnat": 32, "dying": 512}
	// rtnetlink.h route types, what fib ... type returns.
	fibTypes = map[string]uint64{"unspec": 0, "unicast": 1, "local": 2, "broadcast": 3, "anycast": 4,
		"multicast": 5, "blackhole": 6, "unreachable": 7, "prohibit": 8}
	icmpTypes = map[string]uint64{"echo-reply": 0, "destination-unreachable": 3, "source-quench": 4,
		"redirect": 5, "echo-request": 8, "router-advertisement": 9, "router-solicitation": 10,
		"time-exceeded": 11, "parameter-problem": 12, "timestamp-request": 13, "timestamp-reply": 14}
	icmp6Types = map[string]uint64{"destination-unreachable": 1, "packet-too-big": 2, "time-exceeded": 3,
		"parameter-problem": 4, "echo-request": 128, "echo-reply": 129, "nd-router-solicit": 133,
		"nd-router-advert": 134, "nd-neighbor-solicit": 135, "nd-neighbor-advert": 136}
	tcpFlagBits = map[string]uint64{"fin": 1, "syn": 2, "rst": 4, "psh": 8, "ack": 16, "urg": 32, "ecn": 64, "cwr": 128}
	nfProtos    = map[string]uint64{"ipv4": 2, "ipv6": 10}
)

// constPart reads a JSON constant of type t: a string or number, a
// {"prefix":...}, a {"range":[lo,hi]}, or for flag types a list of names.
func constPart(raw any, t vtype) (keyPart, error) {
	switch v := raw.(type) {
	case map[string]any:
		if p, ok := v["prefix"].(map[string]any); ok {
			addr, _ := p["addr"].(string)
			bits, _ := p["len"].(float64)
			pfx, err := netip.ParsePrefix(fmt.Sprintf("%s/%d", addr, int(bits)))
			if err != nil {
				return keyPart{}, fmt.Errorf("read prefix: %w", err)
			}
			pfx = pfx.Masked()
			return keyPart{lo: val{addr: pfx.Addr()}, hi: val{addr: lastAddr(pfx)}, text: pfx.String()}, nil
		}
		if r, ok := v["range"].([]any); ok && len(r) == 2 {
			lo, err := constPart(r[0], t)
			if err != nil {
				return keyPart{}, err
			}
			hi, err := constPart(r[1], t)
			if err != nil {
				return keyPart{}, err
			}
			return keyPart{lo: lo.lo, hi: hi.hi, text: lo.text + "-" + hi.text}, nil
		}
	case []any:
		// A list of flag names ORed together: ct state {established,related}
		// with "in", tcp flags & (syn|ack).
		var bits uint64
		text := make([]string, 0, len(v))
		for _, n := range v {
			p, err := constPart(n, t)
			if err != nil {
				return keyPart{}, err
			}
			bits |= p.lo.n
			text = append(text, p.text)
		}
		x := val{n: bits}
		return keyPart{lo: x, hi: x, text: strings.Join(text, ",")}, nil
	case string:
		x, err := named(v, t)
		if err != nil {
			return keyPart{}, err
		}
		return keyPart{lo: x, hi: x, text: v}, nil
	case float64:
		if v >= 0 && v <= math.MaxUint64 && v == math.Trunc(v) {
			x := val{n: uint64(v)}
			return keyPart{lo: x, hi: x, text: strconv.FormatUint(x.n, 10)}, nil
		}
	}
	return keyPart{}, fmt.Errorf("value %s is not a constant this package reads", clip(raw))
}

// named reads a string constant as type t.
func named(s string, t vtype) (val, error) {
	var table map[string]uint64
	switch t {
	case tAddr:
		a, err := netip.ParseAddr(s)
		if err != nil {
			return val{}, fmt.Errorf("read address %q: %w", s, err)
		}
		return val{addr: a}, nil
	case tProto:
		table = protoByName
	case tCTState:
		table = ctStateBits
	case tCTStatus:
		table = ctStatusBits
	case tFibType:
		table = fibTypes
	case tICMPType:
		table = icmpTypes
	case tICMP6Type:
		table = icmp6Types
	case tTCPFlags:
		table = tcpFlagBits
	case tNFProto:
		table = nfProtos
	case tIfname:
		// Interface names are never known for a traced packet: matches on
		// them are undecidable whatever the name.
		return val{}, nil
	}
	if n, ok := table[s]; ok {
		return val{n: n}, nil
	}
	if n, err := strconv.ParseUint(s, 0, 64); err == nil {
		return val{n: n}, nil
	}
	return val{}, fmt.Errorf("value %q of this type is not one this package reads", s)
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// clip renders a JSON value for a message, cut short.
func clip(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 80 {
		return string(b[:80]) + "…"
	}
	return string(b)
}
