package filter

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Match reports whether flow f passes every term.
func (f Filter) Match(fl *trace.Flow) bool {
	for i := range f.terms {
		t := &f.terms[i]
		if t.match(fl) == t.neg {
			return false
		}
	}
	return true
}

func (t *term) match(f *trace.Flow) bool {
	switch t.kind {
	case kindVerdict:
		return f.Verdict == t.text
	case kindProto:
		return f.Proto == t.text
	case kindNS:
		return matchNS(f, t.text)
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
// "IP[-IP][:PORT[-PORT]]" against a port or ip term.
func (t *term) addr(s string) bool {
	if s == "" {
		return false
	}
	host, ports := splitHostPort(s)
	if t.kind == kindPort {
		return portInRange(ports, t.port)
	}
	if t.ipText != "" && strings.HasPrefix(s, t.ipText) {
		return true
	}
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
	w := t.text
	if containsFold(f.Verdict, w) || containsFold(f.Orig.Src, w) || containsFold(f.Orig.Dst, w) ||
		podHas(f.SrcPod, w) || podHas(f.DstPod, w) {
		return true
	}
	if f.Reply != nil && (containsFold(f.Reply.Src, w) || containsFold(f.Reply.Dst, w)) {
		return true
	}
	if s := f.Service; s != nil && (containsFold(s.Namespace, w) || containsFold(s.Name, w)) {
		return true
	}
	if r := f.Rule; r != nil {
		if containsFold(r.Chain, w) || containsFold(r.EntryChain, w) || containsFold(r.Text, w) ||
			(r.Owner != nil && podHas(r.Owner.Pod, w)) {
			return true
		}
	}
	return containsFold(f.Explanation, w)
}

func podHas(p *trace.PodRef, w string) bool {
	return p != nil && (containsFold(p.Name, w) || containsFold(p.Namespace, w))
}

// containsFold reports whether h contains needle, ignoring ASCII case;
// needle is lower case. It jumps between candidate first bytes with
// IndexByte, so a miss over long text costs little more than a memchr.
func containsFold(h, needle string) bool {
	n := len(needle)
	if n == 0 {
		return true
	}
	if n > len(h) {
		return false
	}
	lower := needle[0]
	upper := lower
	if 'a' <= lower && lower <= 'z' {
		upper = lower - 'a' + 'A'
	}
	for i := 0; i+n <= len(h); i++ {
		j := indexEither(h[i:len(h)-n+1], lower, upper)
		if j < 0 {
			return false
		}
		i += j
		if equalFoldLower(h[i:i+n], needle) {
			return true
		}
	}
	return false
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
