package rules

import (
	"fmt"
	"net/netip"
	"strings"
)

// Family is the address family of a Ruleset: iptables-save prints IPv4
// rules, ip6tables-save IPv6 ones.
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// Ruleset is one iptables-save dump: its tables by name.
type Ruleset struct {
	Family Family
	Tables map[string]*Table
}

// Table is one "*name ... COMMIT" block.
type Table struct {
	Name   string
	Chains map[string]*Chain
	// Order is the chains in the order iptables-save declared them, so a
	// dump can be shown the way the user knows it.
	Order []string
}

// Chain is a built-in chain (with a policy) or a user chain (Policy "").
type Chain struct {
	Table  string
	Name   string
	Policy string // ACCEPT or DROP for built-in chains, "" for user chains
	Rules  []*Rule
}

// Builtin reports whether the chain is a base chain with a policy.
func (c *Chain) Builtin() bool { return c.Policy != "" }

// Rule is one "-A CHAIN ..." line.
type Rule struct {
	Table string
	Chain string
	// Index is the 1-based position in the chain, as
	// `iptables -L --line-numbers` shows it.
	Index int
	// Text is the line as iptables-save printed it (without a "[pkts:bytes]"
	// counter prefix), kept verbatim for display.
	Text    string
	Matches []Match
	Target  Target
	// Comment is the first -m comment of the rule, unquoted.
	Comment string
}

func (r *Rule) String() string { return r.Text }

// ID names the rule for messages: "nat CNI-DN-xxx #3".
func (r *Rule) ID() string { return fmt.Sprintf("%s %s #%d", r.Table, r.Chain, r.Index) }

// MatchKind says what a Match tests.
type MatchKind uint8

const (
	MatchUnknown   MatchKind = iota // anything this package does not model: always uncertain
	MatchSource                     // -s
	MatchDest                       // -d
	MatchProto                      // -p
	MatchInIface                    // -i
	MatchOutIface                   // -o
	MatchFragment                   // -f
	MatchSrcPort                    // --sport (tcp/udp/sctp), --sports (multiport)
	MatchDstPort                    // --dport, --dports
	MatchAnyPort                    // multiport --ports
	MatchSrcType                    // addrtype --src-type
	MatchDstType                    // addrtype --dst-type
	MatchSet                        // set --match-set
	MatchMark                       // mark --mark
	MatchCTState                    // conntrack --ctstate, state --state
	MatchCTStatus                   // conntrack --ctstatus
	MatchCTOrigDst                  // conntrack --ctorigdst
	MatchICMPType                   // icmp --icmp-type, icmp6 --icmpv6-type
	MatchComment                    // comment --comment: always true
)

// Match is one test of a rule: a built-in option (-s, -p, ...) or one
// option of an -m module. A module with several options (-m conntrack
// --ctstate NEW --ctorigdst X) yields one Match per option, all ANDed.
type Match struct {
	Kind   MatchKind
	Module string // "" for built-in options, else the -m module name
	Negate bool
	Option string // "-s", "--dport", "--match-set", ...
	Value  string // the option's argument(s) as printed, unquoted

	// Parsed arguments; which ones are set depends on Kind.
	Prefix  netip.Prefix
	Proto   uint8 // MatchProto; 0 means "all"
	Iface   string
	IfWild  bool // the interface name ended in "+"
	Ports   []PortRange
	Types   []string // addrtype names
	SetName string
	SetDirs []Dir
	Mark    uint32
	Mask    uint32
	States  CTState // a bit set
	ICMP    ICMPSpec
	// Reason says why a MatchUnknown, or an option of a known module this
	// package does not model, cannot be decided.
	Reason string
}

// String renders the match roughly as iptables-save does.
func (m *Match) String() string {
	var b strings.Builder
	if m.Module != "" {
		b.WriteString("-m " + m.Module + " ")
	}
	if m.Negate {
		b.WriteString("! ")
	}
	b.WriteString(m.Option)
	if m.Value != "" {
		b.WriteString(" " + m.Value)
	}
	return strings.TrimSpace(b.String())
}

// PortRange is an inclusive port range; a single port has Lo == Hi.
type PortRange struct{ Lo, Hi uint16 }

func (p PortRange) contains(port uint16) bool { return port >= p.Lo && port <= p.Hi }

// Dir is one flag of --match-set: which side of the packet a set dimension
// is taken from.
type Dir uint8

const (
	DirSrc Dir = iota
	DirDst
)

func (d Dir) String() string {
	if d == DirSrc {
		return "src"
	}
	return "dst"
}

// ICMPSpec is an --icmp-type argument. Code -1 means any code; Any means
// the "any" type.
type ICMPSpec struct {
	Any  bool
	Type uint8
	Code int16
}

// TargetKind classifies a rule's target by what it does to traversal.
type TargetKind uint8

const (
	TargetNone       TargetKind = iota // no -j: a counter-only rule, continues
	TargetJump                         // -j USER-CHAIN
	TargetGoto                         // -g USER-CHAIN
	TargetReturn                       // RETURN
	TargetAccept                       // ACCEPT
	TargetDrop                         // DROP
	TargetReject                       // REJECT
	TargetDNAT                         // DNAT
	TargetSNAT                         // SNAT
	TargetMasquerade                   // MASQUERADE
	TargetRedirect                     // REDIRECT
	TargetMark                         // MARK: changes the packet mark, continues
	TargetContinue                     // LOG, CONNMARK, CT, ...: known not to terminate
	TargetQueue                        // NFQUEUE/QUEUE: terminates, verdict from user space
	TargetUnknown                      // a target this package does not know
)

// Target is what a matching rule does.
type Target struct {
	Kind TargetKind
	Name string   // "DNAT", "CNI-DN-...", "" for TargetNone
	Args []string // options after the target name, unquoted

	// Chain is the user chain of a jump or goto.
	Chain string
	// RejectWith is REJECT's --reject-with, defaulted to the family's
	// port-unreachable when the rule does not say.
	RejectWith string
	// NAT ranges of DNAT --to-destination / SNAT --to-source (one per
	// option; old kernels allowed several), MASQUERADE/REDIRECT --to-ports.
	NAT []NATRange
	// MARK as --set-xmark semantics: mark = (mark &^ MarkMask) ^ MarkValue.
	MarkValue, MarkMask uint32
	// RandomFully etc. are noted for display only.
	Flags []string
}

// NATRange is one address/port range of a NAT target. Zero addresses mean
// "address unchanged" (REDIRECT, MASQUERADE, DNAT to ":port"); zero ports
// mean "port not specified".
type NATRange struct {
	MinAddr, MaxAddr netip.Addr
	MinPort, MaxPort uint16
}

func (n NATRange) hasAddr() bool { return n.MinAddr.IsValid() }
func (n NATRange) hasPort() bool { return n.MinPort != 0 || n.MaxPort != 0 }

func (n NATRange) containsAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.Compare(n.MinAddr) >= 0 && a.Compare(n.MaxAddr) <= 0
}

func (n NATRange) containsPort(p uint16) bool { return p >= n.MinPort && p <= n.MaxPort }

func (n NATRange) String() string {
	var b strings.Builder
	if n.hasAddr() {
		a := n.MinAddr.String()
		if n.MaxAddr != n.MinAddr {
			a += "-" + n.MaxAddr.String()
		}
		if n.MinAddr.Is6() {
			// Bracketed whole, as ip6tables writes it: `[a-b]:port`.
			a = "[" + a + "]"
		}
		b.WriteString(a)
	}
	if n.hasPort() {
		fmt.Fprintf(&b, ":%d", n.MinPort)
		if n.MaxPort != n.MinPort {
			fmt.Fprintf(&b, "-%d", n.MaxPort)
		}
	}
	return b.String()
}
