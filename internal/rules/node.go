package rules

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
)

// NodeState is what the evaluator needs to know about the node beyond the
// rules. Errors make the match that asked uncertain; they never fail the
// evaluation.
type NodeState interface {
	// IsLocal reports whether addr has a "local" route in the node's local
	// routing table, which is what -m addrtype --dst-type LOCAL tests. In
	// IPVS mode every ClusterIP and LB IP is local (bound to kube-ipvs0).
	IsLocal(addr netip.Addr) (bool, error)
	// SetMember reports whether the packet, seen through the lookups (one
	// per --match-set flag, in order), is a member of the named ipset.
	SetMember(name string, lookups []SetLookup) (bool, error)
}

// SetLookup is one dimension of an ipset test: the packet's address and
// port on the side a --match-set flag names. The set type decides which of
// the two a dimension uses (hash:ip,port takes Addr then Proto/Port).
type SetLookup struct {
	Dir   Dir
	Addr  netip.Addr
	Proto uint8
	// Port is the port, or type<<8|code for ICMP, as ipset sees it.
	Port uint16
	// PortKnown is false for ICMP when the packet's type is unknown.
	PortKnown bool
}

// MemNode is an in-memory NodeState: local prefixes (as in
// `ip route show table local`) and ipsets (from `ipset save`).
type MemNode struct {
	Local []netip.Prefix
	Sets  map[string]*IPSet
	// LocalUnknown makes IsLocal answer with an error for addresses not in
	// Local, for callers that could not read the local table in full.
	LocalUnknown bool
}

// NewMemNode returns a MemNode with the loopback ranges every Linux node
// has as local routes.
func NewMemNode() *MemNode {
	return &MemNode{Local: Loopback(), Sets: map[string]*IPSet{}}
}

// Loopback are the loopback ranges, local on every node.
func Loopback() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
}

// AddLocal adds local addresses or prefixes ("172.18.0.2", "10.96.0.10/32").
func (n *MemNode) AddLocal(addrs ...string) error {
	for _, a := range addrs {
		p, err := parsePrefix(a)
		if err != nil {
			return fmt.Errorf("add local address %q: %w", a, err)
		}
		n.Local = append(n.Local, p)
	}
	return nil
}

// IsLocal implements NodeState.
func (n *MemNode) IsLocal(addr netip.Addr) (bool, error) {
	addr = addr.Unmap()
	for _, p := range n.Local {
		if p.Contains(addr) {
			return true, nil
		}
	}
	if n.LocalUnknown {
		return false, fmt.Errorf("local routing table unknown for %s", addr)
	}
	return false, nil
}

// SetMember implements NodeState.
func (n *MemNode) SetMember(name string, lookups []SetLookup) (bool, error) {
	s := n.Sets[name]
	if s == nil {
		return false, fmt.Errorf("ipset %q is not known", name)
	}
	return s.Test(lookups)
}

// LoadIPSetSave adds the sets of an `ipset save` dump to the node.
func (n *MemNode) LoadIPSetSave(r io.Reader) error {
	sets, err := ParseIPSetSave(r)
	if err != nil {
		return err
	}
	if n.Sets == nil {
		n.Sets = map[string]*IPSet{}
	}
	for name, s := range sets {
		n.Sets[name] = s
	}
	return nil
}

// dimKind is what one dimension of an ipset type holds.
type dimKind uint8

const (
	dimIP dimKind = iota
	dimNet
	dimPort
)

// IPSet is one set of a supported type: hash:ip, hash:net, hash:ip,port,
// hash:ip,port,ip, hash:ip,port,net, hash:net,port or bitmap:port.
type IPSet struct {
	Name   string
	Type   string
	Family Family
	dims   []dimKind
	// Entries are kept as parsed; hash:ip /32 entries also go in exact for
	// a map lookup on the hot path.
	entries []setEntry
	exact   map[setKey]bool
	ports   map[uint16]bool // bitmap:port
	// netmask of hash:ip ("netmask 24"): addresses are masked before lookup.
	netmask int
}

type setEntry struct {
	nets    [3]netip.Prefix
	proto   uint8
	port    uint16
	nomatch bool
}

// setKey is an exact entry of an IP-only or IP,port type.
type setKey struct {
	a1, a2 netip.Addr
	proto  uint8
	port   uint16
}

var setTypes = map[string][]dimKind{
	"hash:ip":          {dimIP},
	"hash:net":         {dimNet},
	"hash:ip,port":     {dimIP, dimPort},
	"hash:ip,port,ip":  {dimIP, dimPort, dimIP},
	"hash:ip,port,net": {dimIP, dimPort, dimNet},
	"hash:net,port":    {dimNet, dimPort},
	"bitmap:port":      {dimPort},
}

// NewIPSet makes an empty set of a supported type.
func NewIPSet(name, typ string, family Family) (*IPSet, error) {
	dims, ok := setTypes[typ]
	if !ok {
		return nil, fmt.Errorf("new ipset %q: type %q is not supported", name, typ)
	}
	return &IPSet{Name: name, Type: typ, Family: family, dims: dims,
		exact: map[setKey]bool{}, ports: map[uint16]bool{}}, nil
}

// Add adds an entry in `ipset add` syntax ("10.96.0.10,tcp:80", "30080",
// "10.0.0.0/8 nomatch"); options such as "timeout 300" are ignored.
func (s *IPSet) Add(entry string) error {
	f := strings.Fields(entry)
	if len(f) == 0 {
		return fmt.Errorf("add to ipset %q: empty entry", s.Name)
	}
	nomatch := false
	for _, opt := range f[1:] {
		if opt == "nomatch" {
			nomatch = true
		}
	}
	parts := strings.Split(f[0], ",")
	if len(parts) != len(s.dims) {
		return fmt.Errorf("add to ipset %q: entry %q has %d parts, %s has %d", s.Name, f[0], len(parts), s.Type, len(s.dims))
	}
	var e setEntry
	e.nomatch = nomatch
	ni := 0
	for i, d := range s.dims {
		switch d {
		case dimIP, dimNet:
			p, err := parsePrefix(parts[i])
			if err != nil {
				// "10.0.0.1-10.0.0.3" ranges are expanded by ipset
				// itself on add; a save never prints them.
				return fmt.Errorf("add to ipset %q: %w", s.Name, err)
			}
			if (s.Family == IPv6) != p.Addr().Is6() {
				return fmt.Errorf("add to ipset %q: %s is not %s", s.Name, p, s.Family)
			}
			e.nets[ni] = p
			ni++
		case dimPort:
			proto, port, err := parseSetPort(parts[i], s.Type == "bitmap:port")
			if err != nil {
				return fmt.Errorf("add to ipset %q: %w", s.Name, err)
			}
			e.proto, e.port = proto, port
		}
	}
	if s.Type == "bitmap:port" {
		s.ports[e.port] = true
		return nil
	}
	if !nomatch && s.isExact(e) {
		k := setKey{a1: e.nets[0].Addr(), proto: e.proto, port: e.port}
		if len(s.dims) == 3 {
			k.a2 = e.nets[1].Addr()
		}
		s.exact[k] = true
		return nil
	}
	s.entries = append(s.entries, e)
	return nil
}

// isExact reports whether an entry is host-only in every address
// dimension, so a map lookup finds it.
func (s *IPSet) isExact(e setEntry) bool {
	if s.netmask != 0 {
		return false
	}
	for i := 0; i < 3; i++ {
		if e.nets[i].IsValid() && e.nets[i].Bits() != e.nets[i].Addr().BitLen() {
			return false
		}
	}
	return true
}

// parseSetPort parses "tcp:80", "80" (tcp), "icmp:echo-request", "icmp:8/0",
// "udp:53". bitmap:port entries are bare ports without a protocol.
func parseSetPort(s string, bare bool) (uint8, uint16, error) {
	protoS, portS, hasProto := strings.Cut(s, ":")
	if !hasProto {
		portS, protoS = s, "tcp"
		if bare {
			protoS = ""
		}
	}
	var proto uint8
	if protoS != "" {
		p, ok := parseProto(protoS)
		if !ok {
			return 0, 0, fmt.Errorf("unknown protocol %q", protoS)
		}
		proto = p
	}
	if proto == ProtoICMP || proto == ProtoICMPv6 {
		spec, ok := parseICMPType(portS, proto == ProtoICMPv6)
		if !ok || spec.Any {
			return 0, 0, fmt.Errorf("bad icmp type %q", portS)
		}
		code := spec.Code
		if code < 0 {
			code = 0
		}
		return proto, uint16(spec.Type)<<8 | uint16(code), nil
	}
	n, err := strconv.ParseUint(portS, 10, 16)
	if err != nil {
		return 0, 0, fmt.Errorf("bad port %q", portS)
	}
	return proto, uint16(n), nil
}

// Test reports whether the lookups (one per --match-set flag) find a member,
// with the kernel's rules: fewer flags than dimensions never match, extra
// flags are ignored, an address of another family never matches. A set
// of ports alone (bitmap:port) has no family (NFPROTO_UNSPEC) and matches
// packets of both: kube-proxy's KUBE-6-NODE-PORT-TCP is one.
func (s *IPSet) Test(lookups []SetLookup) (bool, error) {
	if len(lookups) < len(s.dims) {
		return false, nil
	}
	for i, l := range lookups[:len(s.dims)] {
		if s.dims[i] != dimPort && l.Addr.IsValid() && l.Addr.Unmap().Is6() != (s.Family == IPv6) {
			return false, nil
		}
	}
	var (
		addrs   [3]netip.Addr
		na      int
		proto   uint8
		port    uint16
		hasPort bool
	)
	for i, d := range s.dims {
		l := lookups[i]
		switch d {
		case dimIP, dimNet:
			if !l.Addr.IsValid() {
				return false, fmt.Errorf("ipset %q: packet %s address unknown", s.Name, l.Dir)
			}
			addrs[na] = l.Addr.Unmap()
			na++
		case dimPort:
			if !l.PortKnown {
				return false, fmt.Errorf("ipset %q: packet %s port (ICMP type) unknown", s.Name, l.Dir)
			}
			proto, port, hasPort = l.Proto, l.Port, true
		}
	}
	if s.Type == "bitmap:port" {
		if !hasPorts(proto) {
			// Kernels differ on whether bitmap:port looks at non-port
			// protocols (ICMP type/code as a port); it only matters when
			// that value is in the set.
			if s.ports[port] || s.ports[0] {
				return false, fmt.Errorf("ipset %q: bitmap:port test of protocol %d is kernel-dependent", s.Name, proto)
			}
			return false, nil
		}
		return s.ports[port], nil
	}
	if hasPort && !hasPorts(proto) && proto != ProtoICMP && proto != ProtoICMPv6 {
		// ipset stores other protocols with port 0.
		port = 0
	}
	if s.netmask != 0 {
		if p, err := addrs[0].Prefix(s.netmask); err == nil {
			addrs[0] = p.Addr()
		}
	}
	k := setKey{a1: addrs[0], proto: proto, port: port}
	if len(s.dims) == 3 {
		k.a2 = addrs[1]
	}
	if s.exact[k] {
		return true, nil
	}
	// Network entries: the kernel tries the most specific prefix first, so
	// a more specific "nomatch" entry wins over a wider match.
	best, bestBits, found := false, -1, false
	for _, e := range s.entries {
		if hasPort && (e.proto != proto || e.port != port) {
			continue
		}
		bits := 0
		ok := true
		for i := 0; i < na; i++ {
			if !e.nets[i].Contains(addrs[i]) {
				ok = false
				break
			}
			bits += e.nets[i].Bits()
		}
		if ok && bits > bestBits {
			best, bestBits, found = !e.nomatch, bits, true
		}
	}
	return found && best, nil
}

// IPPorts calls fn with each entry's address, protocol and port, in no
// particular order (a map holds the exact ones), for a set of type
// hash:ip,port; other types have none. nomatch entries are left out.
func (s *IPSet) IPPorts(fn func(a netip.Addr, proto uint8, port uint16)) {
	if s.Type != "hash:ip,port" {
		return
	}
	for k := range s.exact {
		fn(k.a1, k.proto, k.port)
	}
	for _, e := range s.entries {
		if !e.nomatch {
			fn(e.nets[0].Addr(), e.proto, e.port)
		}
	}
}

// ParseIPSetSave parses `ipset save` output ("create NAME TYPE opts...",
// "add NAME ENTRY"). Sets of types it does not support are kept out of the
// result, so a rule using them is uncertain rather than wrong.
func ParseIPSetSave(r io.Reader) (map[string]*IPSet, error) {
	sets := map[string]*IPSet{}
	skipped := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		var err error
		switch {
		case f[0] == "create" && len(f) >= 3:
			fam := IPv4
			netmask := 0
			for i := 3; i+1 < len(f); i++ {
				switch f[i] {
				case "family":
					if f[i+1] == "inet6" {
						fam = IPv6
					}
				case "netmask":
					netmask, err = strconv.Atoi(f[i+1])
				}
			}
			if err != nil {
				break
			}
			s, nerr := NewIPSet(f[1], f[2], fam)
			if nerr != nil {
				skipped[f[1]] = true
				break
			}
			if netmask != 0 && netmask != fam.bits() {
				s.netmask = netmask
			}
			sets[f[1]] = s
		case f[0] == "add" && len(f) >= 3:
			s := sets[f[1]]
			if s == nil {
				if skipped[f[1]] {
					break
				}
				err = fmt.Errorf("set %q not created", f[1])
				break
			}
			err = s.Add(strings.Join(f[2:], " "))
		default:
			err = errors.New("unrecognised line")
		}
		if err != nil {
			return nil, fmt.Errorf("parse ipset save line %d %q: %w", lineNo, clip(line), err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse ipset save: read: %w", err)
	}
	return sets, nil
}

func (f Family) bits() int {
	if f == IPv6 {
		return 128
	}
	return 32
}
