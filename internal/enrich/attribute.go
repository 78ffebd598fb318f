package enrich

import (
	"fmt"
	"strings"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/nft"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// decidingEvent picks the event whose rule the flow is about: a REJECT or
// netfilter reset or drop decided the flow's fate; otherwise the DNAT,
// otherwise the SNAT. Stack resets, IPVS and non-netfilter drops have no
// rule. It gives the event's index, -1 when none.
func decidingEvent(f *trace.Flow) (int, rules.ActionKind) {
	best, kind, rank := -1, rules.ActionKind(""), 0
	for i := range f.Events {
		e := &f.Events[i]
		var k rules.ActionKind
		r := 0
		switch {
		case e.Kind == trace.KindReject:
			k, r = rules.ActionReject, 5
		case e.Kind == trace.KindReset && e.By == trace.ResetByNetfilter:
			k, r = rules.ActionReset, 4
		case e.Kind == trace.KindDrop && e.Reason == "NETFILTER_DROP":
			k, r = rules.ActionDrop, 3
		case e.Kind == trace.KindDNAT:
			k, r = rules.ActionDNAT, 2
		case e.Kind == trace.KindSNAT:
			k, r = rules.ActionSNAT, 1
		}
		if r > rank {
			best, kind, rank = i, k, r
		}
	}
	return best, kind
}

// attribute finds the rule behind the flow's deciding event, or nil when
// there is none to find; known is false when the rules are unknown, so
// nothing can be said either way. iptables and native nftables are asked
// alike; when both have a rule that agrees with the kernel, the one whose
// table or base chain runs first at the hook made the decision.
func attribute(f *trace.Flow, a *flowAddrs, env Env) (_ *trace.Rule, known bool) {
	if a.decided < 0 {
		return nil, true
	}
	ev, kind := &f.Events[a.decided], a.kind
	pkt, ok := attributionPacket(f, a)
	if !ok {
		return nil, true
	}
	family := rules.IPv4
	if pkt.Src.Addr().Is6() {
		family = rules.IPv6
	}
	act := rules.KernelAction{Kind: kind, Hook: hookOf(ev, kind, pkt, env)}
	if kind == rules.ActionDNAT || kind == rules.ActionSNAT {
		act.To = a.to
	}
	if ev.ICMPType != nil && ev.ICMPCode != nil {
		act.ICMPType, act.ICMPCode = *ev.ICMPType, *ev.ICMPCode
	}
	beforeCT := droppedByConntrack(ev)
	eval := func(pkt rules.Packet) (*trace.Rule, bool) {
		ipt, iptKnown := iptablesCandidate(env.Ruleset(family), pkt, env, act)
		nf, nfKnown := nftCandidate(env, pkt, act)
		if !iptKnown && !nfKnown {
			return nil, false
		}
		if beforeCT {
			ipt, nf = ipt.before(conntrackPrio), nf.before(conntrackPrio)
		}
		return choose(ipt, nf), true
	}
	if beforeCT {
		// The cache's key does not hold the counters.
		return eval(pkt)
	}
	if c, ok := env.(interface{ attributions() *attributionCache }); ok {
		return c.attributions().attributeCached(pkt, act, eval)
	}
	return eval(pkt)
}

// conntrackPrio is conntrack's priority at PREROUTING and OUTPUT
// (NF_IP_PRI_CONNTRACK): it attaches a packet's entry there.
const conntrackPrio = -200

// droppedByConntrack: a netfilter drop of a packet without a conntrack
// entry while conntrack's table was full and its drop counter rose. No
// rule after conntrack saw that packet, so none of them can be its rule;
// a raw table rule, which runs before conntrack, still can.
func droppedByConntrack(ev *trace.Event) bool {
	return ev.Kind == trace.KindDrop && ev.NoConntrack && ev.ConntrackTable.Full() && ev.ConntrackTable.Drops > 0
}

// before keeps the candidate only if its table or chain runs before prio.
func (c candidate) before(prio int) candidate {
	if c.rule != nil && c.rule.Table != "" && c.prio >= prio {
		return candidate{}
	}
	return c
}

// candidate is one rule source's answer.
type candidate struct {
	rule *trace.Rule
	// agrees: the source has a rule that did what the kernel did.
	agrees bool
	prio   int
}

func iptablesCandidate(rs *rules.Ruleset, pkt rules.Packet, env Env, act rules.KernelAction) (candidate, bool) {
	if rs == nil {
		return candidate{}, false
	}
	at, err := rs.Attribute(pkt, env, act)
	if err != nil || at == nil || at.Result == nil || !canExplain(at.Result.Outcome.Verdict, act.Kind) {
		return candidate{}, true
	}
	return candidate{rule: ruleRecord(at, rs.Family), agrees: at.Agrees, prio: tablePrio(at.Result.Table, act.Hook)}, true
}

func nftCandidate(env Env, pkt rules.Packet, act rules.KernelAction) (candidate, bool) {
	rs, err := env.NFTRuleset()
	if err != nil {
		// Unreadable native rules cannot rule anything out.
		return candidate{rule: &trace.Rule{Backend: trace.BackendNFTables, Uncertain: "the nftables ruleset could not be read: " + err.Error()}}, true
	}
	if rs == nil {
		return candidate{}, false
	}
	at, err := rs.Attribute(pkt, env, act)
	if err != nil || at == nil {
		return candidate{}, true
	}
	return candidate{rule: nftRuleRecord(at), agrees: true, prio: at.Prio}, true
}

// choose picks between the iptables and the nftables answer.
func choose(ipt, nf candidate) *trace.Rule {
	switch {
	case ipt.agrees && nf.agrees && nf.rule.Table != "":
		first, other := ipt, nf
		if nf.prio < ipt.prio {
			first, other = nf, ipt
		}
		if nf.prio == ipt.prio {
			r := *first.rule
			r.Uncertain = joinReasons(r.Uncertain, fmt.Sprintf("%s (%s %s) at the same priority %d could have made it too", other.rule.Text, other.rule.Table, other.rule.Chain, other.prio))
			return &r
		}
		return first.rule
	case nf.agrees && nf.rule.Table != "":
		return nf.rule
	case ipt.rule != nil:
		if nf.rule != nil && nf.rule.Uncertain != "" {
			r := *ipt.rule
			r.Uncertain = joinReasons(r.Uncertain, nf.rule.Uncertain)
			return &r
		}
		return ipt.rule
	}
	return nil
}

func joinReasons(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// tablePrio is an iptables table's priority at a hook, in the order
// native nftables base chains share with it.
func tablePrio(table, hook string) int {
	switch table {
	case "raw":
		return -300
	case "mangle":
		return -150
	case "nat":
		if hook == "POSTROUTING" || hook == "INPUT" {
			return 100
		}
		return -100
	case "security":
		return 50
	}
	return 0
}

// canExplain: an ICMP error or a drop can come from outside netfilter (the
// stack, IPVS); when the rules' walk ends in a verdict that could not have
// made the decision, no rule is named rather than a wrong one.
func canExplain(v rules.Verdict, kind rules.ActionKind) bool {
	switch kind {
	case rules.ActionReject, rules.ActionReset:
		return v == rules.VerdictReject || v == rules.VerdictUnknown
	case rules.ActionDrop:
		return v == rules.VerdictDrop || v == rules.VerdictReject || v == rules.VerdictUnknown
	case rules.ActionDNAT:
		return v == rules.VerdictDNAT || v == rules.VerdictRedirect || v == rules.VerdictUnknown
	case rules.ActionSNAT:
		return v == rules.VerdictSNAT || v == rules.VerdictMasquerade || v == rules.VerdictUnknown
	}
	return false
}

// attributionPacket is the packet as the deciding hook saw it: the
// original tuple for NAT (the rules match it before translation), the
// packet itself for REJECT, reset and drop (after any DNAT).
func attributionPacket(f *trace.Flow, a *flowAddrs) (rules.Packet, bool) {
	src, dst := a.pktSrc, a.pktDst
	if a.kind == rules.ActionSNAT && f.Reply != nil {
		// POSTROUTING sees the destination after any DNAT.
		dst = a.Went
	}
	if !src.IsValid() || !dst.IsValid() {
		return rules.Packet{}, false
	}
	pkt := rules.Packet{Proto: rules.ProtoNumber(f.Proto), Src: src, Dst: dst, OrigDst: a.Dst.Addr()}
	if f.Conntrack == nil || !f.Conntrack.Replied {
		pkt.State = rules.CTNew // the first packet: what nat sees, and REJECT met
	}
	// An echo request is what opens an ICMP flow (a ping); ICMPv6 numbers
	// it 128, and a rule matching the type must see the family's number.
	switch pkt.Proto {
	case rules.ProtoICMP:
		pkt.ICMPType, pkt.ICMPKnown = 8, true
	case rules.ProtoICMPv6:
		pkt.ICMPType, pkt.ICMPKnown = 128, true
	}
	return pkt, true
}

// hookOf is the netfilter hook of the decision: reported by the netfilter
// tier's NAT events and by nf_send_reset, otherwise inferred from whether
// the packet's addresses are the node's own.
func hookOf(ev *trace.Event, kind rules.ActionKind, pkt rules.Packet, env Env) string {
	if ev.NFHook != "" && !answerSeenLeaving(ev, kind) {
		return ev.NFHook
	}
	srcLocal, _ := env.IsLocal(pkt.Src.Addr())
	dstLocal, _ := env.IsLocal(pkt.Dst.Addr())
	switch {
	case kind == rules.ActionDNAT, droppedByConntrack(ev):
		// Conntrack, like DNAT, runs at PREROUTING for packets that
		// arrive and at OUTPUT for the node's own.
		if srcLocal {
			return "OUTPUT"
		}
		return "PREROUTING"
	case kind == rules.ActionSNAT:
		return "POSTROUTING"
	}
	switch {
	case srcLocal:
		return "OUTPUT"
	case dstLocal:
		return "INPUT"
	}
	return "FORWARD"
}

// answerSeenLeaving: the netfilter tier sees a REJECT's ICMP error or
// reset where the answer leaves the node (OUTPUT), which says nothing of
// the hook where the rejected packet met the rule (FORWARD for a pod's
// connection to a ClusterIP, INPUT for one to a NodePort).
func answerSeenLeaving(ev *trace.Event, kind rules.ActionKind) bool {
	return ev.Via == event.ViaNetfilter.String() && (kind == rules.ActionReject || kind == rules.ActionReset)
}

// ruleRecord turns an attribution into the trace's rule object. A policy
// decision names the chain's policy; an uncertain one says why. An
// ip6tables rule gets family "ip6" (nftables' spelling), since its text
// alone reads like an IPv4 rule; IPv4 rules leave it empty, as traces
// always had them.
func ruleRecord(at *rules.Attribution, fam rules.Family) *trace.Rule {
	res := at.Result
	// The rule, its owner and a path of up to four chains are one
	// allocation: a walk makes one for each packet the cache missed.
	b := &struct {
		rule  trace.Rule
		owner trace.Owner
		path  [4]string
	}{}
	r := &b.rule
	*r = trace.Rule{Table: res.Table, Chain: res.Chain, Path: b.path[:0]}
	for _, step := range res.Outcome.Path {
		r.Path = append(r.Path, step.Chain)
	}
	if fam == rules.IPv6 {
		r.Family = "ip6"
	}
	if res.Outcome.Rule != nil {
		r.Chain = res.Outcome.Rule.Chain
		r.Text = res.Outcome.Rule.Text
	} else {
		r.Text = ":" + res.Chain + " " + string(res.Outcome.Verdict) + " (chain policy)"
	}
	if len(r.Path) > 1 {
		r.EntryChain = r.Path[1]
	} else {
		r.EntryChain = r.Chain
	}
	if at.Owner != nil {
		b.owner = trace.Owner{ContainerID: at.Owner.ContainerID}
		r.Owner = &b.owner
	}
	if at.Uncertain {
		r.Uncertain = strings.Join(at.Reasons, "; ")
		if r.Uncertain == "" {
			r.Uncertain = "the rules do not pin down one rule"
		}
	}
	return r
}

// nftRuleRecord turns a native nftables attribution into the trace's rule
// object. table is the nftables table, entry_chain the base chain, text the
// rule as nft listed it.
func nftRuleRecord(at *nft.Attribution) *trace.Rule {
	o := &at.Outcome
	base := at.Result.Chain
	r := &trace.Rule{Backend: trace.BackendNFTables, Family: base.Table.Family, Table: base.Table.Name,
		Chain: base.Name, EntryChain: base.Name, Path: o.Chains()}
	if o.Rule != nil {
		r.Chain, r.Handle, r.Text = o.Rule.Chain.Name, o.Rule.Handle, o.Rule.Display()
		if base.Table.Name == "cni_hostport" && o.Rule.Comment != "" {
			r.Owner = &trace.Owner{ContainerID: o.Rule.Comment}
		}
	} else {
		r.Text = fmt.Sprintf("chain %s policy %s", base.Name, base.Policy)
	}
	if el, set := o.Element(); el != nil {
		r.Element = &trace.RuleElement{Key: el.KeyText(), Comment: el.Comment}
		if set != nil {
			r.Element.Map = set.Name
		}
	}
	if at.Uncertain {
		r.Uncertain = strings.Join(at.Reasons, "; ")
		if r.Uncertain == "" {
			r.Uncertain = "the rules do not pin down one rule"
		}
	}
	return r
}
