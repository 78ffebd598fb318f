package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
)

// ActionKind is what the kernel was seen doing to a packet. The kinds an
// event can report carry the event's kind name, so reasons read the same
// as the trace.
type ActionKind string

const (
	// ActionDNAT: nf_nat_setup_info(..., NF_NAT_MANIP_DST) at PREROUTING or OUTPUT.
	ActionDNAT ActionKind = trace.KindDNAT
	// ActionSNAT: nf_nat_setup_info(..., NF_NAT_MANIP_SRC) at POSTROUTING or INPUT.
	ActionSNAT ActionKind = trace.KindSNAT
	// ActionReject: an ICMP error sent for the packet (nf_send_unreach).
	ActionReject ActionKind = trace.KindReject
	// ActionReset: a TCP reset sent by netfilter (nf_send_reset).
	ActionReset ActionKind = trace.KindReset
	// ActionDrop: kfree_skb with reason NETFILTER_DROP.
	ActionDrop ActionKind = trace.KindDrop
	// ActionAccept: the packet passed the hook untranslated.
	ActionAccept ActionKind = "accept"
)

// KernelAction is one decision the kernel reported for a packet.
type KernelAction struct {
	Kind ActionKind
	// Hook is the netfilter hook: PREROUTING, INPUT, FORWARD, OUTPUT or
	// POSTROUTING.
	Hook string
	// To is the translated address for DNAT/SNAT; port 0 means the port
	// was not reported.
	To netip.AddrPort
	// ICMPType and ICMPCode are the ICMP error sent for ActionReject.
	ICMPType, ICMPCode uint8
}

// Attribution is the rule that made a kernel decision, checked against it.
type Attribution struct {
	Action KernelAction
	// Result is the deciding table's walk. Its Outcome is the rule that
	// agrees with the kernel when exactly one possible outcome does.
	Result *Result
	// Passed are the walks of the tables the packet went through before
	// the deciding one at the same hook (raw, mangle, ...), whose MARKs and
	// translations it saw.
	Passed []*Result
	// Owner is the portmap owner when the rule is a hostPort rule.
	Owner *PortmapOwner
	// Agrees is set when some rule of the deciding table does what the
	// kernel did (one or, when Uncertain, several).
	Agrees bool
	// Uncertain is set when the rules do not pin down one rule that agrees
	// with the kernel; Reasons say why.
	Uncertain bool
	Reasons   []string
	// Notes are things worth showing that do not make the answer
	// uncertain, such as an undecidable rule the kernel's action settled.
	Notes []string
}

// hookTables is the order in which tables see a packet at each hook
// (raw -300, mangle -150, nat dst -100, filter 0, security 50, nat src 100).
var hookTables = map[string][]string{
	"PREROUTING":  {"raw", "mangle", "nat"},
	"INPUT":       {"mangle", "filter", "security", "nat"},
	"FORWARD":     {"mangle", "filter", "security"},
	"OUTPUT":      {"raw", "mangle", "nat", "filter", "security"},
	"POSTROUTING": {"mangle", "nat"},
}

var rejectICMP = map[string][2]uint8{
	"icmp-net-unreachable": {3, 0}, "icmp-host-unreachable": {3, 1},
	"icmp-proto-unreachable": {3, 2}, "icmp-port-unreachable": {3, 3},
	"icmp-net-prohibited": {3, 9}, "icmp-host-prohibited": {3, 10},
	"icmp-admin-prohibited": {3, 13},
	"icmp6-no-route":        {1, 0}, "no-route": {1, 0}, "icmp6-adm-prohibited": {1, 1},
	"adm-prohibited": {1, 1}, "icmp6-addr-unreachable": {1, 3}, "addr-unreach": {1, 3},
	"icmp6-port-unreachable": {1, 4}, "port-unreach": {1, 4},
	"icmp6-policy-fail": {1, 5}, "icmp6-reject-route": {1, 6},
}

// RejectICMP returns the ICMP type and code a REJECT rule sends, and false
// for tcp-reset or an unknown type. The default is port-unreachable.
func RejectICMP(rejectWith string, family Family) (typ, code uint8, ok bool) {
	if rejectWith == "" {
		if family == IPv6 {
			return 1, 4, true
		}
		return 3, 3, true
	}
	tc, ok := rejectICMP[rejectWith]
	return tc[0], tc[1], ok
}

// Attribute finds the rule that made the kernel's decision for pkt and
// checks that it agrees: a DNAT whose range holds the address chosen, a
// REJECT of the type sent, a DROP for a drop. pkt is the packet as it
// entered the hook: after an earlier hook's DNAT, with the mark earlier
// hooks left (Result.Mark of the PREROUTING walk for POSTROUTING). The
// tables at the hook are walked in priority order, carrying MARK changes
// and, where a range pins it down, a translation from nat to filter.
func (rs *Ruleset) Attribute(pkt Packet, node NodeState, act KernelAction) (*Attribution, error) {
	tables, ok := hookTables[act.Hook]
	if !ok {
		return nil, fmt.Errorf("attribute %s: unknown hook %q", act.Kind, act.Hook)
	}
	// The attribution and room for the results of the tables the packet
	// passes (a hook has at most four) are one allocation.
	b := &struct {
		at     Attribution
		passed [4]*Result
	}{at: Attribution{Action: act}}
	at := &b.at
	at.Passed = b.passed[:0]
	want := "" // the table that must decide, for NAT actions
	switch act.Kind {
	case ActionDNAT:
		if act.Hook != "PREROUTING" && act.Hook != "OUTPUT" {
			return nil, fmt.Errorf("attribute dnat: hook %s does no destination NAT", act.Hook)
		}
		want = "nat"
	case ActionSNAT:
		if act.Hook != "POSTROUTING" && act.Hook != "INPUT" {
			return nil, fmt.Errorf("attribute snat: hook %s does no source NAT", act.Hook)
		}
		want = "nat"
	case ActionReject, ActionReset, ActionDrop, ActionAccept:
	default:
		return nil, fmt.Errorf("attribute: unknown action %q", act.Kind)
	}
	if (act.Kind == ActionDNAT || act.Kind == ActionSNAT) && !act.To.Addr().IsValid() {
		return nil, errors.New("attribute nat: the translated address is missing")
	}
	var last *Result
	for _, tn := range tables {
		if rs.Chain(tn, act.Hook) == nil {
			continue
		}
		res, err := rs.Evaluate(tn, act.Hook, pkt, node)
		if err != nil {
			return nil, fmt.Errorf("attribute %s at %s: %w", act.Kind, act.Hook, err)
		}
		last = res
		if tn == want {
			break
		}
		if res.Verdict == VerdictNotTraversed {
			at.Passed = append(at.Passed, res)
			continue
		}
		if stops(res) {
			break
		}
		// The packet goes on to the next table: it must get there on
		// every possible outcome of this one for the walk to be exact.
		at.Passed = append(at.Passed, res)
		if res.Uncertain {
			for _, o := range res.Alternatives {
				if stopsOutcome(&o) {
					at.Uncertain = true
					at.Reasons = append(at.Reasons, fmt.Sprintf("%s %s might have ended at %s", tn, act.Hook, o.String()))
				}
			}
			if !sameMark(res) {
				at.Uncertain = true
				at.Reasons = append(at.Reasons, fmt.Sprintf("%s %s: the packet mark after it is not certain", tn, act.Hook))
			}
		}
		pkt.Mark = res.Mark
		if err := translate(&pkt, res); err != nil {
			at.Uncertain = true
			at.Reasons = append(at.Reasons, fmt.Sprintf("%s %s: %v", tn, act.Hook, err))
		}
	}
	if last == nil {
		return nil, fmt.Errorf("attribute %s: no table has a %s chain", act.Kind, act.Hook)
	}
	if want != "" && last.Table != want {
		at.Result = last
		at.Uncertain = true
		at.Reasons = append(at.Reasons, fmt.Sprintf("kernel did %s at %s but the rules end the packet in %s first: %s", act.Kind, act.Hook, last.Table, last.Outcome.String()))
		return at, nil
	}
	at.Result = last
	at.pick(rs, node, pkt, rs.Family)
	return at, nil
}

// pick chooses among the deciding table's possible outcomes the ones that
// agree with the kernel. An undecidable rule whose other branch the kernel
// contradicts is settled: the kernel's action rules that branch out.
func (at *Attribution) pick(rs *Ruleset, node NodeState, pkt Packet, fam Family) {
	res := at.Result
	cands := append([]Outcome{res.Outcome}, res.Alternatives...)
	var agree []Outcome
	var why []string
	for i := range cands {
		o := &cands[i]
		if o.Verdict == VerdictUnknown {
			// A target we do not model could have done anything.
			agree = append(agree, *o)
			continue
		}
		if err := agrees(o, at.Action, pkt, node, fam); err != nil {
			why = append(why, err.Error())
			continue
		}
		agree = append(agree, *o)
	}
	at.Agrees = len(agree) > 0
	switch {
	case len(agree) == 0:
		at.Uncertain = true
		at.Reasons = append(at.Reasons, fmt.Sprintf("no rule at %s %s agrees with the kernel's %s: %s",
			res.Table, res.Chain, at.Action.describe(), strings.Join(why, "; ")))
	case len(agree) == 1:
		if !agree[0].same(&res.Outcome) {
			at.Notes = append(at.Notes, "undecidable rules settled by the kernel's action: "+strings.Join(res.Reasons, "; "))
		} else if len(cands) > 1 {
			at.Notes = append(at.Notes, "other outcomes were possible but contradict the kernel: "+strings.Join(why, "; "))
		}
		res.choose(cands, agree[0])
		if agree[0].Verdict == VerdictUnknown {
			at.Uncertain = true
			at.Reasons = append(at.Reasons, res.Reasons...)
		}
		if res.Incomplete {
			at.Uncertain = true
			at.Reasons = append(at.Reasons, res.Reasons...)
		}
	default:
		at.Uncertain = true
		at.Reasons = append(at.Reasons, fmt.Sprintf("%d rules could have made the kernel's %s:", len(agree), at.Action.describe()))
		at.Reasons = append(at.Reasons, res.Reasons...)
		res.choose(cands, agree[0])
	}
	if o, ok := rs.PortmapOwnerOfPath(&res.Outcome); ok {
		at.Owner = o
	}
}

// choose makes o the Result's outcome and the other candidates its
// alternatives.
func (res *Result) choose(cands []Outcome, o Outcome) {
	res.Outcome = o
	res.Alternatives = res.Alternatives[:0:0]
	for i := range cands {
		if !cands[i].same(&o) {
			res.Alternatives = append(res.Alternatives, cands[i])
		}
	}
}

func (a KernelAction) describe() string {
	switch a.Kind {
	case ActionDNAT, ActionSNAT:
		return fmt.Sprintf("%s to %s", a.Kind, a.To)
	case ActionReject:
		return fmt.Sprintf("ICMP %d/%d", a.ICMPType, a.ICMPCode)
	}
	return string(a.Kind)
}

// agrees checks one outcome against the kernel's action.
func agrees(o *Outcome, a KernelAction, pkt Packet, node NodeState, fam Family) error {
	rule := ""
	if o.Rule != nil {
		rule = " (" + o.Rule.Text + ")"
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s%s: %s", o.Verdict, rule, fmt.Sprintf(format, args...))
	}
	switch a.Kind {
	case ActionDNAT:
		switch o.Verdict {
		case VerdictDNAT:
			return natAgrees(o.Rule.Target.NAT, a.To, pkt.Dst, false)
		case VerdictRedirect:
			return redirectAgrees(o, a, pkt, node)
		}
		return bad("does no destination NAT")
	case ActionSNAT:
		switch o.Verdict {
		case VerdictSNAT:
			return natAgrees(o.Rule.Target.NAT, a.To, netip.AddrPortFrom(pkt.srcAddr(), pkt.Src.Port()), true)
		case VerdictMasquerade:
			if l, err := isLocal(node, a.To.Addr()); err != nil || !l {
				return bad("masquerades to a node address, %s is not known to be one", a.To.Addr())
			}
			if r := o.Rule.Target.NAT; len(r) > 0 && a.To.Port() != 0 && !r[0].containsPort(a.To.Port()) {
				return bad("port %d is outside --to-ports %s", a.To.Port(), r[0])
			}
			return nil
		}
		return bad("does no source NAT")
	case ActionReject:
		if o.Verdict != VerdictReject {
			return bad("sends no ICMP error")
		}
		t, c, ok := RejectICMP(o.Rule.Target.RejectWith, fam)
		if !ok {
			return bad("sends %s, not an ICMP error", o.Rule.Target.RejectWith)
		}
		if t != a.ICMPType || c != a.ICMPCode {
			return bad("sends ICMP %d/%d, the kernel sent %d/%d", t, c, a.ICMPType, a.ICMPCode)
		}
		return nil
	case ActionReset:
		if o.Verdict != VerdictReject || o.Rule.Target.RejectWith != "tcp-reset" {
			return bad("sends no TCP reset")
		}
		return nil
	case ActionDrop:
		// REJECT drops the packet after sending its error.
		if o.Verdict != VerdictDrop && o.Verdict != VerdictReject {
			return bad("does not drop")
		}
		return nil
	case ActionAccept:
		switch o.Verdict {
		case VerdictAccept, VerdictNotTraversed:
			return nil
		case VerdictDNAT, VerdictSNAT, VerdictMasquerade, VerdictRedirect:
			return bad("translates, the kernel passed the packet untranslated")
		}
		return bad("does not accept")
	}
	return bad("unknown action %s", a.Kind)
}

func isLocal(node NodeState, a netip.Addr) (bool, error) {
	if node == nil {
		return false, errors.New("no node state")
	}
	return node.IsLocal(a)
}

// natAgrees checks a DNAT/SNAT range against the address the kernel chose.
// Without a port range the kernel keeps a DNAT port; an SNAT may still
// remap the source port to keep the tuple unique.
func natAgrees(ranges []NATRange, to, orig netip.AddrPort, src bool) error {
	if len(ranges) == 0 {
		return errors.New("NAT rule without a range")
	}
	var errs []string
	for _, r := range ranges {
		addrOK := r.hasAddr() && r.containsAddr(to.Addr()) || !r.hasAddr() && to.Addr().Unmap() == orig.Addr().Unmap()
		if !addrOK {
			errs = append(errs, fmt.Sprintf("%s is outside %s", to.Addr(), r))
			continue
		}
		if to.Port() == 0 {
			return nil
		}
		switch {
		case r.hasPort() && !r.containsPort(to.Port()):
			errs = append(errs, fmt.Sprintf("port %d is outside %s", to.Port(), r))
		case !r.hasPort() && !src && to.Port() != orig.Port():
			errs = append(errs, fmt.Sprintf("port %d differs from the original %d and %s names no port", to.Port(), orig.Port(), r))
		default:
			return nil
		}
	}
	return errors.New(strings.Join(errs, "; "))
}

// redirectAgrees: REDIRECT sends to the primary address of the incoming
// interface (127.0.0.1 for locally generated packets) at --to-ports.
func redirectAgrees(o *Outcome, a KernelAction, pkt Packet, node NodeState) error {
	to := a.To.Addr().Unmap()
	if !to.IsLoopback() {
		if l, err := isLocal(node, to); err != nil || !l {
			return fmt.Errorf("REDIRECT (%s): %s is not known to be a node address", o.Rule.Text, to)
		}
	}
	if a.To.Port() == 0 {
		return nil
	}
	r := o.Rule.Target.NAT
	if len(r) > 0 && !r[0].containsPort(a.To.Port()) {
		return fmt.Errorf("REDIRECT (%s): port %d is outside --to-ports %s", o.Rule.Text, a.To.Port(), r[0])
	}
	if len(r) == 0 && a.To.Port() != pkt.Dst.Port() {
		return fmt.Errorf("REDIRECT (%s): port %d differs from the original %d", o.Rule.Text, a.To.Port(), pkt.Dst.Port())
	}
	return nil
}

// stops reports whether a table's walk ends the packet's way through the
// hook (anything but an accept).
func stops(res *Result) bool { return stopsOutcome(&res.Outcome) }

func stopsOutcome(o *Outcome) bool {
	switch o.Verdict {
	case VerdictDrop, VerdictReject, VerdictQueue, VerdictUnknown:
		return true
	}
	return false
}

func sameMark(res *Result) bool {
	for _, o := range res.Alternatives {
		if o.Mark != res.Mark {
			return false
		}
	}
	return true
}

// translate applies a nat verdict to the packet that later tables at the
// same hook see (nat OUTPUT runs before filter OUTPUT). Only a range that
// names one address and at most one port pins the result down.
func translate(p *Packet, res *Result) error {
	var ap *netip.AddrPort
	switch res.Verdict {
	case VerdictDNAT:
		ap = &p.Dst
	case VerdictSNAT:
		ap = &p.Src
	case VerdictAccept, VerdictNotTraversed:
		return nil
	default:
		return fmt.Errorf("%s: later tables see a translated packet this package cannot compute", res.Verdict)
	}
	nat := res.Rule.Target.NAT
	if len(nat) != 1 || nat[0].MinAddr != nat[0].MaxAddr || nat[0].MinPort != nat[0].MaxPort {
		return fmt.Errorf("%s range of %s does not pin down the packet later tables see", res.Verdict, res.Rule.ID())
	}
	addr, port := ap.Addr(), ap.Port()
	if nat[0].hasAddr() {
		addr = nat[0].MinAddr
	}
	if nat[0].hasPort() {
		port = nat[0].MinPort
	}
	*ap = netip.AddrPortFrom(addr, port)
	return nil
}

// Reason joins Reasons for display ("" when the attribution is certain).
func (at *Attribution) Reason() string {
	if !at.Uncertain {
		return ""
	}
	return strings.Join(at.Reasons, "; ")
}
