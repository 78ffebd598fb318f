// Package filter is the filter language shared by the UI's filter bar and
// the --filter flag (SPEC.md): pod:NS/NAME or pod:NAME, ns:NS, port:N,
// ip:ADDR or ip:CIDR, verdict:ID, proto:P, node:NAME (the node that saw
// the flow, in a merged trace) and free words; an IPv6 address
// or prefix alone is an ip: term. Terms AND together; !term negates one.
// A filter is compiled once by Parse so that Match over a million stored
// flows allocates nothing.
package filter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Filter is a parsed filter expression. The zero Filter matches every flow.
type Filter struct {
	text  string
	terms []term
	// node is whose flows name no node: a single node's trace names it
	// in its header only.
	node string
}

// OnNode says that flows naming no node are node's, for node: terms.
func (f Filter) OnNode(node string) Filter {
	f.node = node
	return f
}

type kind uint8

const (
	kindWord kind = iota
	kindPod
	kindNS
	kindPort
	kindIP
	kindVerdict
	kindProto
	kindNode
)

// fieldKinds maps a term's "field:" to its kind.
var fieldKinds = map[string]kind{
	"pod": kindPod, "ns": kindNS, "port": kindPort, "ip": kindIP,
	"verdict": kindVerdict, "proto": kindProto, "node": kindNode,
}

// protoNumbers are the protocols proto: accepts, with their IP numbers for
// the kernel filter.
var protoNumbers = map[string]uint8{"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58, "sctp": 132}

type term struct {
	kind kind
	neg  bool
	// text is the lowercased free word, the namespace (ns:, pod:NS/NAME),
	// the verdict or the proto.
	text string
	name string // pod name
	port uint16
	pfx  netip.Prefix
	// v4net and v4mask are an IPv4 prefix as integers, matched against
	// addresses parsed without netip; v6net and v6mask an IPv6 one, as
	// the words of trace.AddrKeys.
	v4net, v4mask uint32
	v6net, v6mask [4]uint32
	v6            bool
	// portText is ":PORT", matched as a suffix of "IP:PORT".
	portText string
	// probe is the needle byte that free-word search looks for first:
	// a case-free byte or the rarest letter, so misses are skipped fast.
	probe int
}

// Error is a term that does not parse: which term, where, and why.
type Error struct {
	Term   string
	Column int // 1-based column of the term in the expression
	Msg    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (column %d)", e.Term, e.Msg, e.Column)
}

// Parse compiles a filter expression. An empty expression matches all.
func Parse(expr string) (Filter, error) {
	toks, err := tokenize(expr)
	if err != nil {
		return Filter{}, err
	}
	f := Filter{text: strings.TrimSpace(expr)}
	for _, tok := range toks {
		t, err := parseTerm(tok)
		if err != nil {
			return Filter{}, err
		}
		f.terms = append(f.terms, t)
	}
	return f, nil
}

// MustParse is Parse for expressions known to be valid; it panics on error.
func MustParse(expr string) Filter {
	f, err := Parse(expr)
	if err != nil {
		panic(err)
	}
	return f
}

// String returns the expression the filter was parsed from.
func (f Filter) String() string { return f.text }

// Empty reports whether the filter has no terms (it matches every flow).
func (f Filter) Empty() bool { return len(f.terms) == 0 }

type token struct {
	text   string // without quotes
	raw    string // as typed
	column int
	quoted bool
}

// tokenize splits on white space; "double quotes" keep a free word with
// spaces in one term.
func tokenize(expr string) ([]token, error) {
	// A control character or broken UTF-8 is no part of any address,
	// name or word a flow holds: a mistyped or pasted expression.
	for i, r := range expr {
		if r == utf8.RuneError || (unicode.IsControl(r) && r != '\t') {
			return nil, &Error{Term: strconv.QuoteToASCII(expr), Column: i + 1, Msg: fmt.Sprintf("control character or invalid UTF-8 %q", r)}
		}
	}
	var toks []token
	i := 0
	for i < len(expr) {
		if expr[i] == ' ' || expr[i] == '\t' {
			i++
			continue
		}
		start := i
		neg := ""
		if expr[i] == '!' {
			neg = "!"
			i++
		}
		if i < len(expr) && expr[i] == '"' {
			end := strings.IndexByte(expr[i+1:], '"')
			if end < 0 {
				return nil, &Error{Term: expr[start:], Column: start + 1, Msg: "unclosed quote"}
			}
			word := expr[i+1 : i+1+end]
			i += end + 2
			toks = append(toks, token{text: neg + word, raw: expr[start:i], column: start + 1, quoted: true})
			continue
		}
		for i < len(expr) && expr[i] != ' ' && expr[i] != '\t' {
			i++
		}
		toks = append(toks, token{text: expr[start:i], raw: expr[start:i], column: start + 1})
	}
	return toks, nil
}

func parseTerm(tok token) (term, error) {
	s := tok.text
	fail := func(format string, a ...any) (term, error) {
		return term{}, &Error{Term: tok.raw, Column: tok.column, Msg: fmt.Sprintf(format, a...)}
	}
	var t term
	if strings.HasPrefix(s, "!") {
		t.neg, s = true, s[1:]
	}
	if s == "" {
		return fail("nothing after !: write !term to exclude flows matching term")
	}
	if !tok.quoted {
		// An IPv6 address may start with a group of letters (beef::1),
		// which would read as a field name.
		if pfx, ok := parseIPv6(s); ok {
			t.kind = kindIP
			t.setPrefix(pfx)
			return t, nil
		}
	}
	field, value, hasField := strings.Cut(s, ":")
	if tok.quoted || !hasField || !isFieldName(field) {
		t.kind, t.text = kindWord, strings.ToLower(s)
		t.probe = probeIndex(t.text)
		return t, nil
	}
	k, known := fieldKinds[strings.ToLower(field)]
	if !known {
		return fail("unknown field %q: use pod, ns, port, ip, verdict or proto, or quote a free word", field)
	}
	if value == "" {
		return fail("empty value after %s:", field)
	}
	t.kind = k
	switch k {
	case kindPod:
		ns, name, hasNS := strings.Cut(value, "/")
		if hasNS && (ns == "" || name == "") {
			return fail("not a pod: write pod:NAMESPACE/NAME or pod:NAME")
		}
		if !hasNS {
			ns, name = "", value
		}
		t.text, t.name = ns, name
	case kindNS, kindNode:
		t.text = value
	case kindPort:
		n, err := strconv.ParseUint(value, 10, 16)
		if err != nil {
			return fail("not a port number (0-65535)")
		}
		t.port = uint16(n)
		t.portText = ":" + strconv.FormatUint(n, 10)
	case kindIP:
		pfx, err := parseIPOrCIDR(value)
		if err != nil {
			return fail("not an IP address or CIDR")
		}
		t.setPrefix(pfx)
	case kindVerdict:
		v := strings.ToLower(value)
		if !trace.KnownVerdict(v) {
			return fail("unknown verdict: use one of %s", strings.Join(trace.Verdicts, ", "))
		}
		t.text = v
	case kindProto:
		p := strings.ToLower(value)
		if _, ok := protoNumbers[p]; !ok {
			return fail("unknown protocol: use tcp, udp, icmp, icmpv6 or sctp")
		}
		t.text = p
	}
	return t, nil
}

// isFieldName reports whether s looks like a field name (letters only), so
// that "10.96.0.20:3306" or "CNI-DN-x:y" stay free words while a mistyped
// field such as "prot:tcp" is reported instead of silently matching
// nothing.
func isFieldName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !unicode.IsLetter(r) {
			return false
		}
	}
	return true
}

func (t *term) setPrefix(pfx netip.Prefix) {
	t.pfx = pfx
	if pfx.Addr().Is4() {
		a := pfx.Addr().As4()
		t.v4mask = ^uint32(0) << (32 - pfx.Bits())
		if pfx.Bits() == 0 {
			t.v4mask = 0
		}
		t.v4net = binary.BigEndian.Uint32(a[:]) & t.v4mask
		return
	}
	t.v6 = true
	a := pfx.Addr().As16()
	for i := range t.v6mask {
		bits := min(max(pfx.Bits()-32*i, 0), 32)
		if bits > 0 {
			t.v6mask[i] = ^uint32(0) << (32 - bits)
		}
		t.v6net[i] = binary.BigEndian.Uint32(a[4*i:]) & t.v6mask[i]
	}
}

// parseIPv6 reads a term that is an IPv6 address or prefix, bracketed or
// not.
func parseIPv6(s string) (netip.Prefix, bool) {
	if !strings.Contains(s, ":") {
		return netip.Prefix{}, false
	}
	p, err := parseIPOrCIDR(s)
	return p, err == nil
}

// parseIPOrCIDR reads an address or prefix; an IPv6 one may be bracketed
// as in "[fd00::1]:80" ("[fd00::1]", "[fd00::]/64" or "[fd00::/64]").
func parseIPOrCIDR(s string) (netip.Prefix, error) {
	if inner, ok := strings.CutPrefix(s, "["); ok {
		addr, rest, ok := strings.Cut(inner, "]")
		if !ok || !strings.Contains(addr, ":") || rest != "" && (rest[0] != '/' || strings.Contains(addr, "/")) {
			return netip.Prefix{}, errors.New("brackets hold an IPv6 address or prefix")
		}
		s = addr + rest
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// KernelTerms returns the filter as lists the capture stage can load into
// the kernel: a flow passes when its protocol is one of protos (if any),
// one of its ports is one of ports (if any), and one of its addresses is
// in one of prefixes (if any). ok is false when the filter is not exactly
// that, for example with a negation, a pod, namespace, verdict or free
// word, or two terms of the same field (which AND, while lists OR); the
// kernel filter is then left open and userspace filters alone. Userspace
// applies Match in every case.
func (f Filter) KernelTerms() (ports []uint16, prefixes []netip.Prefix, protos []uint8, ok bool) {
	for _, t := range f.terms {
		if t.neg {
			return nil, nil, nil, false
		}
		switch t.kind {
		case kindPort:
			if ports != nil {
				return nil, nil, nil, false
			}
			ports = []uint16{t.port}
		case kindIP:
			if prefixes != nil {
				return nil, nil, nil, false
			}
			prefixes = []netip.Prefix{t.pfx}
		case kindProto:
			if protos != nil {
				return nil, nil, nil, false
			}
			protos = []uint8{protoNumbers[t.text]}
		default:
			return nil, nil, nil, false
		}
	}
	return ports, prefixes, protos, true
}
