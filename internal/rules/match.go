package rules

import (
	"fmt"
	"net/netip"
	"strings"
)

// tri is a three-valued match result.
type tri uint8

const (
	no tri = iota
	yes
	maybe
)

func (t tri) not() tri {
	switch t {
	case no:
		return yes
	case yes:
		return no
	}
	return maybe
}

func boolTri(b bool) tri {
	if b {
		return yes
	}
	return no
}

// matchRule ANDs the rule's matches. A certain "no" anywhere wins over any
// "maybe": the rule cannot match whatever the undecidable parts say.
func (w *walker) matchRule(r *Rule, mark uint32) (tri, string) {
	res, reason := yes, ""
	for i := range r.Matches {
		m := &r.Matches[i]
		v, why := w.match(m, mark)
		if m.Negate {
			v = v.not()
		}
		switch v {
		case no:
			return no, ""
		case maybe:
			if res != maybe {
				res, reason = maybe, why
			}
		}
	}
	return res, reason
}

// match evaluates m without its negation.
func (w *walker) match(m *Match, mark uint32) (tri, string) {
	p := w.pkt
	switch m.Kind {
	case MatchComment:
		return yes, ""
	case MatchSource:
		return boolTri(p.srcIn(m.Prefix)), ""
	case MatchDest:
		return addrIn(m.Prefix, p.Dst.Addr()), ""
	case MatchProto:
		return boolTri(m.Proto == 0 || m.Proto == p.Proto), ""
	case MatchInIface, MatchOutIface:
		name, what := p.InIface, "in"
		if m.Kind == MatchOutIface {
			name, what = p.OutIface, "out"
		}
		if name == "" {
			return maybe, fmt.Sprintf("%s interface of the packet unknown (rule needs %s)", what, m.Value)
		}
		if m.IfWild {
			return boolTri(strings.HasPrefix(name, m.Iface)), ""
		}
		return boolTri(name == m.Iface), ""
	case MatchFragment:
		// Conntrack reassembles before the tables run, so rules never see
		// a non-first fragment of a tracked connection.
		return no, ""
	case MatchSrcPort, MatchDstPort, MatchAnyPort:
		if !hasPorts(p.Proto) {
			return no, ""
		}
		dp := p.Dst.Port()
		var sp uint16
		if m.Kind != MatchDstPort {
			sp = p.srcPort()
		}
		for _, pr := range m.Ports {
			switch {
			case m.Kind != MatchDstPort && pr.contains(sp),
				m.Kind != MatchSrcPort && pr.contains(dp):
				return yes, ""
			}
		}
		return no, ""
	case MatchSrcType:
		return w.addrType(m, p.srcAddr())
	case MatchDstType:
		return w.addrType(m, p.Dst.Addr())
	case MatchSet:
		return w.set(m)
	case MatchMark:
		return boolTri(mark&m.Mask == m.Mark), ""
	case MatchCTState:
		if p.State == 0 {
			return maybe, "conntrack state of the packet unknown"
		}
		st := p.State
		if p.KnowNAT {
			st |= p.NATed & (CTSNAT | CTDNAT)
		}
		if m.States&st != 0 {
			return yes, ""
		}
		if !p.KnowNAT && m.States&(CTSNAT|CTDNAT) != 0 {
			return maybe, "conntrack NAT status (--ctstate SNAT/DNAT) of the packet unknown"
		}
		return no, ""
	case MatchCTOrigDst:
		if !p.OrigDst.IsValid() {
			return maybe, "conntrack original destination of the packet unknown"
		}
		return addrIn(m.Prefix, p.OrigDst), ""
	case MatchICMPType:
		if p.Proto != ProtoICMP && p.Proto != ProtoICMPv6 {
			return no, ""
		}
		if m.ICMP.Any {
			return yes, ""
		}
		if !p.ICMPKnown {
			return maybe, "ICMP type of the packet unknown"
		}
		return boolTri(p.ICMPType == m.ICMP.Type && (m.ICMP.Code < 0 || int16(p.ICMPCode) == m.ICMP.Code)), ""
	case MatchCTStatus:
		return maybe, m.Reason
	}
	return maybe, m.Reason
}

func addrIn(p netip.Prefix, a netip.Addr) tri {
	return boolTri(p.Contains(a.Unmap()))
}

// addrType decides -m addrtype for one address. Only LOCAL needs the node
// (its local routing table); MULTICAST and the limited broadcast follow
// from the address; other route types (UNICAST, BLACKHOLE, subnet
// broadcasts, ...) need the full routing table, so they stay uncertain
// unless the address is LOCAL, which excludes them.
func (w *walker) addrType(m *Match, a netip.Addr) (tri, string) {
	a = a.Unmap()
	res := no
	reason := ""
	var local tri = maybe
	localWhy := ""
	isLocal := func() tri {
		if local == maybe && localWhy == "" {
			if w.node == nil {
				localWhy = "no node state to tell LOCAL addresses"
			} else if l, err := w.node.IsLocal(a); err != nil {
				localWhy = err.Error()
			} else {
				local = boolTri(l)
			}
		}
		return local
	}
	for _, typ := range m.Types {
		var v tri
		why := ""
		switch strings.ToUpper(typ) {
		case "LOCAL":
			v, why = isLocal(), localWhy
		case "MULTICAST":
			v = boolTri(a.IsMulticast())
		case "BROADCAST":
			if a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
				v = yes
			} else if a.Is6() || a.IsMulticast() || isLocal() == yes {
				v = no
			} else {
				v, why = maybe, fmt.Sprintf("whether %s is a broadcast address needs the routing table", a)
			}
		default:
			if a.IsMulticast() || isLocal() == yes {
				v = no
			} else {
				v, why = maybe, fmt.Sprintf("addrtype %s of %s needs the routing table", typ, a)
			}
		}
		switch v {
		case yes:
			return yes, ""
		case maybe:
			res, reason = maybe, why
		}
	}
	return res, reason
}

// set builds one lookup per --match-set flag: the packet's address and
// port on that side, and asks the node.
func (w *walker) set(m *Match) (tri, string) {
	if w.node == nil {
		return maybe, fmt.Sprintf("no node state to look up ipset %s", m.SetName)
	}
	p := w.pkt
	n := len(m.SetDirs)
	if n > len(w.lookups) {
		return maybe, fmt.Sprintf("ipset %s: %d dimensions", m.SetName, n)
	}
	ls := w.lookups[:n]
	for i, d := range m.SetDirs {
		a := p.Dst.Addr()
		if d == DirSrc {
			a = p.srcAddr()
		}
		port, known := p.port(d)
		ls[i] = SetLookup{Dir: d, Addr: a, Proto: p.Proto, Port: port, PortKnown: known}
	}
	ok, err := w.node.SetMember(m.SetName, ls)
	if err != nil {
		return maybe, err.Error()
	}
	return boolTri(ok), ""
}
