package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/tracer-dev/tracer/internal/rules"
)

// Attribution is the native nftables rule that made a kernel decision,
// checked against it.
type Attribution struct {
	Action rules.KernelAction
	// Result is the deciding base chain's walk; Outcome is the way through
	// it that agrees with the kernel (the first, when several do).
	Result  *Result
	Outcome Outcome
	// Prio is the deciding base chain's priority, to order this answer
	// against the iptables tables' at the same hook.
	Prio int
	// Shadowed are base chains of the hook that would have decided
	// otherwise had they run first (a NodePort DNAT at the same priority
	// as the hostPort DNAT the kernel did).
	Shadowed  []Outcome
	Uncertain bool
	Reasons   []string
	Notes     []string
}

// Attribute finds the native rule behind the kernel's action on pkt (the
// packet as the hook saw it, as for rules.Ruleset.Attribute). It returns
// nil when no base chain of the hook could have made the decision: then
// the rule, if any, is not a native nftables one.
func (rs *Ruleset) Attribute(pkt rules.Packet, node rules.NodeState, act rules.KernelAction) (*Attribution, error) {
	if rs == nil {
		return nil, nil
	}
	hook := strings.ToLower(act.Hook)
	switch hook {
	case "prerouting", "input", "forward", "output", "postrouting":
	default:
		return nil, fmt.Errorf("attribute %s: unknown hook %q", act.Kind, act.Hook)
	}
	natAct := act.Kind == rules.ActionDNAT || act.Kind == rules.ActionSNAT
	if natAct && !act.To.Addr().IsValid() {
		return nil, errors.New("attribute nat: the translated address is missing")
	}
	fam := "ip"
	if pkt.Dst.Addr().Unmap().Is6() {
		fam = "ip6"
	}
	var at *Attribution
	var earlier []string
	for _, c := range rs.HookChains(fam, hook) {
		if c.Type == "nat" && pkt.State != 0 && pkt.State != rules.CTNew {
			continue // nat chains see only a connection's first packet
		}
		if natAct && c.Type != "nat" {
			continue
		}
		res := rs.Evaluate(c, pkt, node)
		agree, why := agreeing(res, act, pkt, node, fam)
		if at != nil {
			if c.Prio != at.Prio {
				break
			}
			if len(agree) > 0 {
				at.Uncertain = true
				at.Reasons = append(at.Reasons, fmt.Sprintf("%s %s, at the same priority %d, could have done it too: %s", c.Table.ID(), c.Name, c.Prio, agree[0].String()))
			} else {
				at.shadow(res)
			}
			continue
		}
		if len(agree) == 0 {
			earlier = append(earlier, stopsWhy(res)...)
			if len(why) > 0 && natAct {
				at0 := &Attribution{}
				at0.shadow(res)
				if len(at0.Shadowed) > 0 {
					earlier = append(earlier, fmt.Sprintf("%s %s would have done %s but the kernel did %s", c.Table.ID(), c.Name, at0.Shadowed[0].String(), describe(act)))
				}
			}
			continue
		}
		at = &Attribution{Action: act, Result: res, Outcome: agree[0], Prio: c.Prio}
		at.settle(res, agree)
	}
	if at == nil {
		return nil, nil
	}
	if len(earlier) > 0 {
		at.Notes = append(at.Notes, "earlier chains: "+strings.Join(earlier, "; "))
	}
	return at, nil
}

// settle judges the agreeing ways through the deciding chain: one settles
// every doubt on the way (the kernel's action ruled the others out), more
// than one leaves the answer uncertain.
func (at *Attribution) settle(res *Result, agree []Outcome) {
	o := agree[0]
	switch {
	case len(agree) > 1:
		at.Uncertain = true
		var alts []string
		for _, a := range agree {
			alts = append(alts, a.String())
		}
		at.Reasons = append(at.Reasons, fmt.Sprintf("%d rules could have made the kernel's %s: %s", len(agree), describe(at.Action), strings.Join(alts, " | ")))
		at.Reasons = append(at.Reasons, doubts(agree)...)
	case o.Verdict == rules.VerdictUnknown:
		at.Uncertain = true
		at.Reasons = append(at.Reasons, o.Doubts...)
	case len(o.Doubts) > 0:
		at.Notes = append(at.Notes, "undecidable matches settled by the kernel's action: "+strings.Join(o.Doubts, "; "))
	}
	if res.Incomplete != "" {
		at.Uncertain = true
		at.Reasons = append(at.Reasons, res.Incomplete)
	}
	if o.NAT.undecided != "" {
		at.Uncertain = true
		at.Reasons = append(at.Reasons, o.NAT.undecided+" is not computed")
	}
}

func (at *Attribution) shadow(res *Result) {
	for _, o := range res.Outcomes {
		if o.Verdict != rules.VerdictAccept && len(o.Doubts) == 0 {
			at.Shadowed = append(at.Shadowed, o)
			return
		}
	}
}

func doubts(os []Outcome) []string {
	seen := map[string]bool{}
	var out []string
	for _, o := range os {
		for _, d := range o.Doubts {
			if !seen[d] {
				seen[d] = true
				out = append(out, d)
			}
		}
	}
	return out
}

// stopsWhy lists the certain ways a chain that did not decide would have
// stopped the packet: the kernel's action contradicts them, so the rules
// read are not the rules that ran.
func stopsWhy(res *Result) []string {
	var out []string
	for _, o := range res.Outcomes {
		if len(o.Doubts) > 0 {
			continue
		}
		switch o.Verdict {
		case rules.VerdictDrop, rules.VerdictReject:
			out = append(out, fmt.Sprintf("%s %s would have ended with %s", res.Chain.Table.ID(), res.Chain.Name, o.String()))
		}
	}
	return out
}

func agreeing(res *Result, act rules.KernelAction, pkt rules.Packet, node rules.NodeState, fam string) (agree []Outcome, why []string) {
	for _, o := range res.Outcomes {
		if o.Verdict == rules.VerdictUnknown && act.Kind != rules.ActionAccept {
			agree = append(agree, o)
			continue
		}
		if err := agrees(&o, act, pkt, node, fam); err != nil {
			why = append(why, err.Error())
			continue
		}
		agree = append(agree, o)
	}
	return agree, why
}

func describe(a rules.KernelAction) string {
	switch a.Kind {
	case rules.ActionDNAT, rules.ActionSNAT:
		return fmt.Sprintf("%s to %s", a.Kind, a.To)
	case rules.ActionReject:
		return fmt.Sprintf("ICMP %d/%d", a.ICMPType, a.ICMPCode)
	}
	return string(a.Kind)
}

// agrees checks one way through a chain against the kernel's action.
func agrees(o *Outcome, a rules.KernelAction, pkt rules.Packet, node rules.NodeState, fam string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s", o.String(), fmt.Sprintf(format, args...))
	}
	switch a.Kind {
	case rules.ActionDNAT:
		switch o.Verdict {
		case rules.VerdictDNAT:
			return o.NAT.agrees(a.To, pkt.Dst, false)
		case rules.VerdictRedirect:
			if to := a.To.Addr().Unmap(); !to.IsLoopback() {
				if l, err := isLocal(node, to); err != nil || !l {
					return bad("%s is not known to be a node address", to)
				}
			}
			return o.NAT.portAgrees(a.To.Port(), pkt.Dst.Port(), false)
		}
		return bad("does no destination NAT")
	case rules.ActionSNAT:
		switch o.Verdict {
		case rules.VerdictSNAT:
			return o.NAT.agrees(a.To, netip.AddrPortFrom(pkt.SrcAddrRead(), pkt.Src.Port()), true)
		case rules.VerdictMasquerade:
			if l, err := isLocal(node, a.To.Addr().Unmap()); err != nil || !l {
				return bad("masquerades to a node address, %s is not known to be one", a.To.Addr())
			}
			return o.NAT.portAgrees(a.To.Port(), pkt.Src.Port(), true)
		}
		return bad("does no source NAT")
	case rules.ActionReject:
		if o.Verdict != rules.VerdictReject {
			return bad("sends no ICMP error")
		}
		t, c, ok := o.Reject.icmp(fam)
		if !ok {
			return bad("sends a TCP reset, not an ICMP error")
		}
		if t != a.ICMPType || c != a.ICMPCode {
			return bad("sends ICMP %d/%d, the kernel sent %d/%d", t, c, a.ICMPType, a.ICMPCode)
		}
		return nil
	case rules.ActionReset:
		if o.Verdict != rules.VerdictReject || !o.Reject.reset {
			return bad("sends no TCP reset")
		}
		return nil
	case rules.ActionDrop:
		if o.Verdict != rules.VerdictDrop && o.Verdict != rules.VerdictReject {
			return bad("does not drop")
		}
		return nil
	case rules.ActionAccept:
		if o.Verdict != rules.VerdictAccept {
			return bad("does not accept")
		}
		return nil
	}
	return bad("unknown action %s", a.Kind)
}

// icmp is the ICMP type and code a reject sends in family fam.
func (r rejectSpec) icmp(fam string) (uint8, uint8, bool) {
	if r.reset {
		return 0, 0, false
	}
	if r.icmpx != "" {
		tc, ok := icmpxCodes[r.icmpx]
		if !ok {
			return 0, 0, false
		}
		if fam == "ip6" {
			return tc[1][0], tc[1][1], true
		}
		return tc[0][0], tc[0][1], true
	}
	return r.typ, r.code, true
}

func isLocal(node rules.NodeState, a netip.Addr) (bool, error) {
	if node == nil {
		return false, errors.New("no node state")
	}
	return node.IsLocal(a)
}

// agrees checks a dnat or snat against the address the kernel chose.
func (n natSpec) agrees(to, orig netip.AddrPort, src bool) error {
	if n.undecided != "" {
		return nil // settled by the caller as uncertain
	}
	if len(n.choices) > 0 {
		return n.choiceAgrees(to, orig, src)
	}
	if n.addr == nil {
		if to.Addr().Unmap() != orig.Addr().Unmap() {
			return fmt.Errorf("%s names no address, the kernel chose %s", n.kind, to.Addr())
		}
	} else if !n.addr.contains(val{addr: to.Addr().Unmap()}) {
		return fmt.Errorf("%s to %s: %s is outside it", n.kind, n.addr.text, to.Addr())
	}
	return n.portAgrees(to.Port(), orig.Port(), src)
}

// choiceAgrees: the kernel's target must be one of the numgen map's.
func (n natSpec) choiceAgrees(to, orig netip.AddrPort, src bool) error {
	var texts []string
	for _, c := range n.choices {
		m := natSpec{kind: n.kind, addr: &c.addr, port: c.port}
		if m.agrees(to, orig, src) == nil {
			return nil
		}
		texts = append(texts, c.text())
	}
	return fmt.Errorf("%s to one of %s: the kernel chose %s", n.kind, strings.Join(texts, ", "), to)
}

func (c natChoice) text() string { return natTarget(&c.addr, c.port) }

// natTarget writes a NAT's address and port as nft does: an IPv6 address
// with a port is bracketed (`[fd00::1]:80`, `[fd00::1]-[fd00::3]:80`) so
// the port is not read as part of it.
func natTarget(addr, port *keyPart) string {
	var b strings.Builder
	if addr != nil {
		switch {
		case port == nil || !addr.lo.addr.Is6():
			b.WriteString(addr.text)
		case addr.lo.addr != addr.hi.addr && !strings.Contains(addr.text, "/"):
			b.WriteString("[" + addr.lo.addr.String() + "]-[" + addr.hi.addr.String() + "]")
		default:
			b.WriteString("[" + addr.text + "]")
		}
	}
	if port != nil {
		b.WriteString(":" + port.text)
	}
	return b.String()
}

// portAgrees: without a port a DNAT keeps the original one; an SNAT or
// masquerade may still remap the source port to keep the tuple unique.
func (n natSpec) portAgrees(to, orig uint16, src bool) error {
	if to == 0 {
		return nil
	}
	switch {
	case n.port != nil && !n.port.contains(val{n: uint64(to)}):
		return fmt.Errorf("%s port %s: %d is outside it", n.kind, n.port.text, to)
	case n.port == nil && !src && to != orig:
		return fmt.Errorf("%s names no port and the kernel changed %d to %d", n.kind, orig, to)
	}
	return nil
}

// Target renders a NAT's destination as nft prints it ("10.0.0.2:80").
func (o *Outcome) Target() string { return natTarget(o.NAT.addr, o.NAT.port) }

// NATTargets are the destinations a NAT outcome can translate orig to:
// the lowest address and port of its range (the kernel's first choice
// when the range is free), or one per numgen choice. A NAT naming no
// port keeps orig's; one naming no address (redirect) keeps orig's
// address, which the caller replaces with the interface's when it knows
// it. Nil when the target comes from a map or expression this package
// does not compute.
func (o *Outcome) NATTargets(orig netip.AddrPort) []netip.AddrPort {
	n := o.NAT
	if n.undecided != "" {
		return nil
	}
	if len(n.choices) > 0 {
		out := make([]netip.AddrPort, 0, len(n.choices))
		for _, c := range n.choices {
			out = append(out, natSpec{addr: &c.addr, port: c.port}.first(orig))
		}
		return out
	}
	return []netip.AddrPort{n.first(orig)}
}

func (n natSpec) first(orig netip.AddrPort) netip.AddrPort {
	addr, port := orig.Addr(), orig.Port()
	if n.addr != nil && n.addr.lo.addr.IsValid() {
		addr = n.addr.lo.addr
	}
	if n.port != nil {
		port = uint16(n.port.lo.n)
	}
	return netip.AddrPortFrom(addr, port)
}

// RejectICMP is the ICMP type and code a reject outcome sends for a
// packet of family fam ("ip" or "ip6"); ok is false for a TCP reset.
func (o *Outcome) RejectICMP(fam string) (typ, code uint8, ok bool) { return o.Reject.icmp(fam) }

// RejectsWithReset reports whether a reject outcome answers with a TCP
// reset.
func (o *Outcome) RejectsWithReset() bool { return o.Reject.reset }
