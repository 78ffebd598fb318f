package lab

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// nftListing is a node's `nft -a list ruleset` as the lab reads it. Like
// the iptables counters, it is parsed here and not with internal/nft, so
// the truth the tracer is checked against does not pass through the
// tracer's own reader.
type nftListing struct {
	tables []*nftTable
}

type nftTable struct {
	family, name string
	chains       []*nftChain
	sets         map[string]*nftSet
}

type nftChain struct {
	table *nftTable
	name  string
	base  bool // has a hook
	rules []*nftRule
}

// nftRule is one rule line: its text as nft prints it (without the
// handle) and, when it has a counter statement, the packets counted.
type nftRule struct {
	chain   *nftChain
	handle  uint64
	text    string
	packets uint64
	counter bool
}

type nftSet struct {
	name  string
	elems []nftElem
}

// nftElem is a set or map element: its key as nft prints it, its comment
// and, in a map, its value ("goto reject-chain", "drop").
type nftElem struct {
	key, comment, value string
}

var (
	nftHandle  = regexp.MustCompile(` # handle ([0-9]+)$`)
	nftCounter = regexp.MustCompile(`counter packets ([0-9]+) bytes [0-9]+`)
	nftElemRe  = regexp.MustCompile(`^(.*?)(?: comment "((?:[^"\\]|\\.)*)")?(?: : (.*))?$`)
)

// parseNFTListing reads `nft -a list ruleset`.
func parseNFTListing(out string) (*nftListing, error) {
	l := &nftListing{}
	var t *nftTable
	var c *nftChain
	var s *nftSet
	var elems *strings.Builder
	for i, raw := range strings.Split(out, "\n") {
		line := strings.TrimSpace(raw)
		switch {
		case elems != nil:
			elems.WriteString(" " + line)
			if depth(elems.String()) == 0 {
				s.elems = splitElems(elems.String())
				elems = nil
			}
		case strings.HasPrefix(line, "table "):
			f := strings.Fields(line)
			if len(f) < 3 {
				return nil, fmt.Errorf("nft listing line %d: %q", i+1, raw)
			}
			t = &nftTable{family: f[1], name: f[2], sets: map[string]*nftSet{}}
			l.tables = append(l.tables, t)
		case t == nil || line == "":
		case strings.HasPrefix(line, "chain "):
			c = &nftChain{table: t, name: strings.Fields(line)[1]}
			t.chains = append(t.chains, c)
		case strings.HasPrefix(line, "set ") || strings.HasPrefix(line, "map "):
			s = &nftSet{name: strings.Fields(line)[1]}
			t.sets[s.name] = s
		case s != nil && strings.HasPrefix(line, "elements = "):
			elems = &strings.Builder{}
			elems.WriteString(strings.TrimPrefix(line, "elements = "))
			if depth(elems.String()) == 0 {
				s.elems = splitElems(elems.String())
				elems = nil
			}
		case line == "}":
			switch {
			case s != nil:
				s = nil
			case c != nil:
				c = nil
			default:
				t = nil
			}
		case c != nil && strings.HasPrefix(line, "type ") && strings.Contains(line, " hook "):
			c.base = true
		case c != nil:
			if r := parseNFTRule(c, line); r != nil {
				c.rules = append(c.rules, r)
			}
		}
	}
	return l, nil
}

func parseNFTRule(c *nftChain, line string) *nftRule {
	m := nftHandle.FindStringSubmatchIndex(line)
	if m == nil {
		return nil // a policy or comment line
	}
	h, _ := strconv.ParseUint(line[m[2]:m[3]], 10, 64)
	r := &nftRule{chain: c, handle: h, text: line[:m[0]]}
	if cm := nftCounter.FindStringSubmatch(r.text); cm != nil {
		r.counter = true
		r.packets, _ = strconv.ParseUint(cm[1], 10, 64)
	}
	return r
}

// depth is how many braces of s are open, outside quotes.
func depth(s string) int {
	d, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"' && (i == 0 || s[i-1] != '\\'):
			quoted = !quoted
		case quoted:
		case s[i] == '{':
			d++
		case s[i] == '}':
			d--
		}
	}
	return d
}

// splitElems reads "{ a, b comment "x" : goto c }".
func splitElems(s string) []nftElem {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	var out []nftElem
	start, d, quoted := 0, 0, false
	flush := func(end int) {
		if part := strings.TrimSpace(s[start:end]); part != "" {
			m := nftElemRe.FindStringSubmatch(part)
			out = append(out, nftElem{key: strings.TrimSpace(m[1]), comment: m[2], value: strings.TrimSpace(m[3])})
		}
	}
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"' && (i == 0 || s[i-1] != '\\'):
			quoted = !quoted
		case quoted:
		case s[i] == '{':
			d++
		case s[i] == '}':
			d--
		case s[i] == ',' && d == 0:
			flush(i)
			start = i + 1
		}
	}
	flush(len(s))
	return out
}

func (l *nftListing) table(family, name string) *nftTable {
	if l == nil {
		return nil
	}
	for _, t := range l.tables {
		if t.family == family && t.name == name {
			return t
		}
	}
	return nil
}

func (t *nftTable) chain(name string) *nftChain {
	if t == nil {
		return nil
	}
	for _, c := range t.chains {
		if c.name == name {
			return c
		}
	}
	return nil
}

// elem finds the element with key in set or map name.
func (t *nftTable) elem(name, key string) *nftElem {
	if t == nil || t.sets[name] == nil {
		return nil
	}
	for i, e := range t.sets[name].elems {
		if e.key == key {
			return &t.sets[name].elems[i]
		}
	}
	return nil
}

// rules lists every rule of the listing that pred accepts.
func (l *nftListing) rules(pred func(*nftRule) bool) []*nftRule {
	var out []*nftRule
	if l == nil {
		return nil
	}
	for _, t := range l.tables {
		for _, c := range t.chains {
			for _, r := range c.rules {
				if pred(r) {
					out = append(out, r)
				}
			}
		}
	}
	return out
}

// position is the index of the first rule of c whose text is text, or -1.
func (c *nftChain) position(text string) int {
	if c == nil {
		return -1
	}
	for i, r := range c.rules {
		if r.text == text {
			return i
		}
	}
	return -1
}

// comment is a rule's trailing comment "..." (portmap's container id).
func (r *nftRule) comment() string {
	i := strings.LastIndex(r.text, ` comment "`)
	if i < 0 {
		return ""
	}
	return strings.TrimSuffix(r.text[i+len(` comment "`):], `"`)
}

// key names a rule for the counter deltas.
func (r *nftRule) key() string {
	t := r.chain.table
	return fmt.Sprintf("%s %s %s %d", t.family, t.name, r.chain.name, r.handle)
}

// hit is the rule as the proof names it.
func (r *nftRule) hit(packets uint64) *RuleHit {
	t := r.chain.table
	return &RuleHit{Backend: backendNFT, Family: t.family, Table: t.name, Chain: r.chain.name, Handle: r.handle,
		Text: r.text, Packets: packets, BaseChain: r.chain.base}
}
