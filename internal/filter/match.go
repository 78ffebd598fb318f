package filter

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Match reports whether flow f passes every term.
func (f Filter) Match(fl *trace.Flow) bool {
	for i := range f.terms {
		t := &f.terms[i]
		if t.match(fl, f.node) == t.neg {
			return false
		}
	}
	return true
}

func (t *term) match(f *trace.Flow, node string) bool {
	switch t.kind {
	case kindVerdict:
		return f.Verdict == t.text
	case kindProto:
		return f.Proto == t.text
	case kindNS:
		return matchNS(f, t.text)
	case kindNode:
		if f.Node == "" && len(f.Nodes) == 0 {
			return node == t.text
		}
		return f.Node == t.text || slices.Contains(f.Nodes, t.text)
	case kindPod:
		return t.matchPod(f.SrcPod) || t.matchPod(f.DstPod) ||
			(f.Rule != nil && f.Rule.Owner != nil && t.matchPod(f.Rule.Owner.Pod))
	case kindPort, kindIP:
		return t.matchAddrs(f)
	default:
		return t.matchWord(f)
	}
}

func matchNS(f *trace.Flow, ns string) bool {
	return (f.SrcPod != nil && f.SrcPod.Namespace == ns) ||
		(f.DstPod != nil && f.DstPod.Namespace == ns) ||
		(f.Service != nil && f.Service.Namespace == ns) ||
		(f.Rule != nil && f.Rule.Owner != nil && f.Rule.Owner.Pod != nil && f.Rule.Owner.Pod.Namespace == ns)
}

// matchPod: pod:NAME also matches NAME-<suffix>, the pods of a Deployment
// or StatefulSet, since that is the name people know.
func (t *term) matchPod(p *trace.PodRef) bool {
	if p == nil || (t.text != "" && p.Namespace != t.text) {
		return false
	}
	return p.Name == t.name ||
		(len(p.Name) > len(t.name) && p.Name[len(t.name)] == '-' && strings.HasPrefix(p.Name, t.name))
}

// matchAddrs tries every address the flow carries: its tuples, and each
// event's packet, conntrack tuples, NAT target and IPVS virtual server.
func (t *term) matchAddrs(f *trace.Flow) bool {
	if t.tuple(&f.Orig) || t.tuple(f.Reply) {
		return true
	}
	for i := range f.Events {
		e := &f.Events[i]
		if t.tuple(e.Packet) || t.tuple(e.Orig) || t.tuple(e.Reply) ||
			t.addr(e.To) || t.addr(e.Virtual) {
			return true
		}
	}
	return false
}

func (t *term) tuple(tp *trace.Tuple) bool {
	return tp != nil && (t.addr(tp.Src) || t.addr(tp.Dst))
}

// addr matches one "IP:PORT", "[IPv6]:PORT", or NAT range
// "IP[-IP][:PORT[-PORT]]" against a port or ip term. The plain IPv4 forms
// that make up nearly every address are decided without netip.
func (t *term) addr(s string) bool {
	if s == "" {
		return false
	}
	plain := strings.IndexByte(s, '-') < 0 && s[0] != '['
	if t.kind == kindPort {
		if plain && strings.HasSuffix(s, t.portText) {
			return strings.IndexByte(s, ':') == len(s)-len(t.portText)
		}
		if i := strings.IndexByte(s, ':'); plain && i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
			return false // IPv4:PORT with another port
		}
		_, ports := splitHostPort(s)
		return portInRange(ports, t.port)
	}
	if plain && t.pfx.Addr().Is4() {
		if a, ok := leadingIPv4(s); ok {
			return a&t.v4mask == t.v4net
		}
	}
	host, _ := splitHostPort(s)
	lo, hi, isRange := strings.Cut(host, "-")
	a, err := netip.ParseAddr(lo)
	if err != nil {
		return false
	}
	if t.pfx.Contains(a.Unmap()) {
		return true
	}
	if isRange {
		b, err := netip.ParseAddr(hi)
		first, last := t.pfx.Addr(), lastAddr(t.pfx)
		return err == nil && a.Compare(last) <= 0 && b.Compare(first) >= 0
	}
	return false
}

// leadingIPv4 parses the dotted quad at the start of s, which must be all
// of s or be followed by ':'.
func leadingIPv4(s string) (uint32, bool) {
	var addr uint32
	i := 0
	for part := 0; part < 4; part++ {
		if part > 0 {
			if i >= len(s) || s[i] != '.' {
				return 0, false
			}
			i++
		}
		n, digits := 0, 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' && digits < 3 {
			n = n*10 + int(s[i]-'0')
			i++
			digits++
		}
		if digits == 0 || n > 255 {
			return 0, false
		}
		addr = addr<<8 | uint32(n)
	}
	if i < len(s) && s[i] != ':' {
		return 0, false
	}
	return addr, true
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().AsSlice()
	for bit := p.Bits(); bit < len(a)*8; bit++ {
		a[bit/8] |= 0x80 >> (bit % 8)
	}
	out, _ := netip.AddrFromSlice(a)
	return out
}

// splitHostPort splits an address as the trace writes it. A bare IPv6
// address (several colons, no brackets) has no port.
func splitHostPort(s string) (host, port string) {
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return s, ""
		}
		host, rest := s[1:end], s[end+1:]
		return host, strings.TrimPrefix(rest, ":")
	}
	i := strings.IndexByte(s, ':')
	if i < 0 {
		return s, ""
	}
	if strings.IndexByte(s[i+1:], ':') >= 0 {
		return s, ""
	}
	return s[:i], s[i+1:]
}

func portInRange(s string, p uint16) bool {
	if s == "" {
		return false
	}
	lo, hi, isRange := strings.Cut(s, "-")
	a, err := strconv.ParseUint(lo, 10, 16)
	if err != nil {
		return false
	}
	if !isRange {
		return uint16(a) == p
	}
	b, err := strconv.ParseUint(hi, 10, 16)
	return err == nil && uint16(a) <= p && p <= uint16(b)
}

// matchWord looks for the free word in the flow's text: pods, Service,
// rule, explanation, verdict and addresses.
func (t *term) matchWord(f *trace.Flow) bool {
	if t.contains(f.Verdict) || t.contains(f.Orig.Src) || t.contains(f.Orig.Dst) ||
		t.podHas(f.SrcPod) || t.podHas(f.DstPod) {
		return true
	}
	if f.Reply != nil && (t.contains(f.Reply.Src) || t.contains(f.Reply.Dst)) {
		return true
	}
	if s := f.Service; s != nil && (t.contains(s.Namespace) || t.contains(s.Name)) {
		return true
	}
	if r := f.Rule; r != nil && t.ruleHas(r) {
		return true
	}
	return t.contains(f.Explanation)
}

// ruleHas: a word names a rule by its chains, text, owner pod, or for a
// native nftables rule its table and the map element's comment (the
// Service kube-proxy names there).
func (t *term) ruleHas(r *trace.Rule) bool {
	return t.contains(r.Chain) || t.contains(r.EntryChain) || t.contains(r.Text) ||
		(r.Owner != nil && t.podHas(r.Owner.Pod)) ||
		(r.NFTables() && (t.contains(r.Table) || r.Element != nil && t.contains(r.Element.Comment)))
}

func (t *term) podHas(p *trace.PodRef) bool {
	return p != nil && (t.contains(p.Name) || t.contains(p.Namespace))
}

// containsFold reports whether h contains needle, ignoring ASCII case;
// needle is lower case. It jumps between the candidates for one byte of
// the needle (probeIndex's choice) with IndexByte, so a miss over long
// text costs little more than a memchr.
func containsFold(h, needle string) bool {
	return containsFoldAt(h, needle, probeIndex(needle))
}

func (t *term) contains(h string) bool { return containsFoldAt(h, t.text, t.probe) }

func containsFoldAt(h, needle string, probe int) bool {
	n := len(needle)
	if n == 0 {
		return true
	}
	if n > len(h) {
		return false
	}
	lower := needle[probe]
	upper := lower
	if 'a' <= lower && lower <= 'z' {
		upper = lower - 'a' + 'A'
	}
	// Candidate positions of the probe byte run from probe to
	// len(h)-n+probe; each is checked as a match starting probe earlier.
	for i := probe; i <= len(h)-n+probe; i++ {
		j := indexEither(h[i:len(h)-n+probe+1], lower, upper)
		if j < 0 {
			return false
		}
		i += j
		if equalFoldLower(h[i-probe:i-probe+n], needle) {
			return true
		}
	}
	return false
}

// letterRarity ranks lower-case letters from common to rare in English
// and in the names a trace holds.
const letterRarity = "etaoinsrhldcumfpgwybvkxjqz"

// probeIndex picks the needle byte to search for: one without case (a
// digit or punctuation, found in one pass), else the rarest letter.
func probeIndex(needle string) int {
	best, bestRank := 0, -1
	for i := 0; i < len(needle); i++ {
		c := needle[i]
		if c < 'a' || c > 'z' {
			if c >= 0x80 {
				continue
			}
			return i
		}
		if r := strings.IndexByte(letterRarity, c); r > bestRank {
			best, bestRank = i, r
		}
	}
	return best
}

func indexEither(s string, a, b byte) int {
	i := strings.IndexByte(s, a)
	if a == b {
		return i
	}
	limit := s
	if i >= 0 {
		limit = s[:i]
	}
	if j := strings.IndexByte(limit, b); j >= 0 {
		return j
	}
	return i
}

// equalFoldLower compares s to lower-case ASCII needle ignoring case.
// Non-ASCII bytes must match exactly, which is what a lowercased UTF-8
// needle needs for the names and addresses a trace holds.
func equalFoldLower(s, needle string) bool {
	for i := 0; i < len(needle); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != needle[i] {
			return false
		}
	}
	return true
}

// MatchKeyed is Match with the flow's address keys from the Store: port:
// and ip: terms compare integers instead of parsing the flow's address
// strings.
func (f Filter) MatchKeyed(fl *trace.Flow, k *trace.AddrKeys) bool {
	for i := range f.terms {
		t := &f.terms[i]
		ok, keyed := t.matchKeys(k)
		if !keyed {
			ok = t.match(fl, f.node)
		}
		if ok == t.neg {
			return false
		}
	}
	return true
}

// matchKeys answers a port: or ip: term from the flow's keys when they
// hold every address the flow has; keyed says whether it could.
func (t *term) matchKeys(k *trace.AddrKeys) (ok, keyed bool) {
	switch {
	case !k.Complete:
		return false, false
	case t.kind == kindPort:
		return t.portIn(k), true
	case t.kind == kindIP:
		return t.ipIn(k), true
	}
	return false, false
}

func (t *term) portIn(k *trace.AddrKeys) bool {
	for _, p := range k.Ports[:k.NPorts] {
		if p == t.port {
			return true
		}
	}
	return false
}

func (t *term) ipIn(k *trace.AddrKeys) bool {
	if t.v6 != k.IPv6 {
		return false
	}
	if !k.IPv6 {
		for _, a := range k.Addrs[:k.NAddrs] {
			if a&t.v4mask == t.v4net {
				return true
			}
		}
		return false
	}
	m, n := &t.v6mask, &t.v6net
	for i := 0; i < 4*int(k.NAddrs); i += 4 {
		a := k.Addrs[i : i+4 : i+4]
		if a[0]&m[0] == n[0] && a[1]&m[1] == n[1] && a[2]&m[2] == n[2] && a[3]&m[3] == n[3] {
			return true
		}
	}
	return false
}
