package nft

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// Ruleset is the native nftables tables of one network namespace.
type Ruleset struct {
	Tables []*Table
	// Warnings are parts of the ruleset that were read but not understood
	// (an object or expression this package does not model); attributions
	// that meet them are uncertain, and the header says so once.
	Warnings []string
	// hooks are the base chains by family and hook, in priority order.
	hooks map[hookKey][]*Chain
	// rules is the number of rules, for a summary line.
	rules int
}

type hookKey struct{ family, hook string }

// Table is one nftables table.
type Table struct {
	Family string // ip, ip6, inet, arp, bridge, netdev
	Name   string
	// Handle numbers the namespace's tables in the order they were
	// created (0 when the listing had none).
	Handle uint64
	Chains map[string]*Chain
	Sets   map[string]*Set
	// Order is the chains in listing order.
	Order []*Chain
}

// ID is "family name", as nft names a table.
func (t *Table) ID() string { return t.Family + " " + t.Name }

// Chain is a base chain (Hook set) or a regular chain.
type Chain struct {
	Table  *Table
	Name   string
	Handle uint64
	Type   string // filter, nat, route; "" for a regular chain
	Hook   string // prerouting, input, forward, output, postrouting; "" for a regular chain
	Prio   int
	Policy string // accept or drop for base chains
	Rules  []*Rule
}

// Base reports whether the chain is attached to a hook.
func (c *Chain) Base() bool { return c.Hook != "" }

// Rule is one rule of a chain.
type Rule struct {
	Chain   *Chain
	Handle  uint64
	Comment string
	// Text is the rule as `nft -a list ruleset` printed it, without its
	// "# handle N" suffix; "" when the listing did not have it.
	Text  string
	stmts []stmt
}

// ID names the rule for messages: "ip kube-proxy services handle 25".
func (r *Rule) ID() string {
	return fmt.Sprintf("%s %s handle %d", r.Chain.Table.ID(), r.Chain.Name, r.Handle)
}

// Display is the rule's text, or a placeholder naming it when the listing
// had no text for it.
func (r *Rule) Display() string {
	if r.Text != "" {
		return r.Text
	}
	return "(rule " + r.ID() + ", not in the listing)"
}

// Set is a named set or map.
type Set struct {
	Table    *Table
	Name     string
	KeyTypes []string // one per concatenated field
	// DataType is a map's value type: "verdict" for a verdict map, "" for
	// a plain set.
	DataType string
	Elems    []*Elem
	// Dynamic sets are filled by the packet path (add @set); their content
	// at any moment is not what the listing showed.
	Dynamic bool
	// exact indexes the elements by key when every element is a single
	// value per field (kube-proxy's maps of thousands of Services are).
	exact map[string]*Elem
}

// buildIndex fills exact when no element is a range or prefix.
func (s *Set) buildIndex() {
	if len(s.Elems) < 8 {
		return
	}
	idx := make(map[string]*Elem, len(s.Elems))
	buf := make([]byte, 0, 64)
	for _, e := range s.Elems {
		for _, k := range e.Key {
			if k.lo != k.hi {
				return
			}
		}
		buf = buf[:0]
		for _, k := range e.Key {
			buf = appendVal(buf, k.lo)
		}
		if _, dup := idx[string(buf)]; !dup {
			idx[string(buf)] = e
		}
	}
	s.exact = idx
}

func appendVal(b []byte, v val) []byte {
	if v.isAddr() {
		a := v.addr.As16()
		b = append(b, 'a')
		return append(b, a[:]...)
	}
	b = append(b, 'n')
	for i := 0; i < 8; i++ {
		b = append(b, byte(v.n>>(8*i)))
	}
	return b
}

// Elem is one element of a set or map.
type Elem struct {
	Key     []keyPart
	Comment string
	// Verdict is a verdict map element's verdict.
	Verdict *verdict
	// Data is a data map element's value.
	Data []keyPart
}

// KeyText renders the key as nft prints it: fields joined by " . ".
func (e *Elem) KeyText() string {
	parts := make([]string, len(e.Key))
	for i, k := range e.Key {
		parts[i] = k.text
	}
	return strings.Join(parts, " . ")
}

// verdict is a verdict statement or a verdict map element's verdict.
type verdict struct {
	kind   verdictKind
	target string // chain of a jump or goto
}

type verdictKind uint8

const (
	vAccept verdictKind = iota + 1
	vDrop
	vContinue
	vReturn
	vJump
	vGoto
	vQueue
)

func (v *verdict) String() string {
	switch v.kind {
	case vAccept:
		return "accept"
	case vDrop:
		return "drop"
	case vContinue:
		return "continue"
	case vReturn:
		return "return"
	case vJump:
		return "jump " + v.target
	case vGoto:
		return "goto " + v.target
	case vQueue:
		return "queue"
	}
	return "?"
}

// HookChains are the base chains of a family's hook in the order the
// kernel runs them (ascending priority; equal priorities keep listing
// order, which is not necessarily the kernel's). An inet chain serves both
// ip and ip6.
func (rs *Ruleset) HookChains(family, hook string) []*Chain { return rs.hooks[hookKey{family, hook}] }

// Table finds a table by family and name.
func (rs *Ruleset) Table(family, name string) *Table {
	for _, t := range rs.Tables {
		if t.Family == family && t.Name == name {
			return t
		}
	}
	return nil
}

// Rules is the number of rules read.
func (rs *Ruleset) Rules() int { return rs.rules }

func (rs *Ruleset) index() {
	rs.hooks = map[hookKey][]*Chain{}
	for _, t := range rs.Tables {
		for _, s := range t.Sets {
			s.buildIndex()
		}
		for _, c := range t.Order {
			rs.rules += len(c.Rules)
			if !c.Base() {
				continue
			}
			fams := []string{t.Family}
			if t.Family == "inet" {
				fams = []string{"ip", "ip6"}
			}
			for _, f := range fams {
				k := hookKey{f, c.Hook}
				rs.hooks[k] = append(rs.hooks[k], c)
			}
		}
	}
	for _, cs := range rs.hooks {
		sort.SliceStable(cs, func(i, j int) bool { return runsBefore(cs[i], cs[j]) })
	}
}

// DNATAddrs are the addresses a rule's dnat statement translates to (the
// lowest of a range, or each numgen choice); none when the rule has no
// dnat or takes its address from a map.
func (r *Rule) DNATAddrs() []netip.Addr {
	var out []netip.Addr
	for _, s := range r.stmts {
		if s.kind != sNAT || s.nat.kind != "dnat" {
			continue
		}
		for _, t := range (&Outcome{NAT: s.nat}).NATTargets(netip.AddrPort{}) {
			if t.Addr().IsValid() {
				out = append(out, t.Addr())
			}
		}
	}
	return out
}

// runsBefore orders base chains of one hook as netfilter runs them: by
// priority, and at the same priority the one registered last first
// (nf_hook_entries_grow inserts a hook ahead of those of equal priority).
// A base chain registers when it is created; the tables' handles number
// their creation and the chains' handles theirs within a table, which
// stands in for the registration order of chains created with their
// table (kube-proxy's, portmap's).
func runsBefore(a, b *Chain) bool {
	switch {
	case a.Prio != b.Prio:
		return a.Prio < b.Prio
	case a.Table != b.Table:
		return a.Table.Handle > b.Table.Handle
	}
	return a.Handle > b.Handle
}

// Addrs are the addresses of a set of single addresses (the lowest of a
// range or prefix element).
func (s *Set) Addrs() []netip.Addr {
	var out []netip.Addr
	for _, e := range s.Elems {
		if len(e.Key) == 1 && e.Key[0].lo.addr.IsValid() {
			out = append(out, e.Key[0].lo.addr)
		}
	}
	return out
}
