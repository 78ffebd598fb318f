package predict

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/tracer-dev/tracer/internal/nft"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// iptablesTable walks one iptables table's chain at hook.
func (w *walk) iptablesTable(hook, table string) {
	if table == "nat" && w.natDone && hook != "POSTROUTING" {
		return // a connection gets one destination NAT
	}
	rs := w.env.Ruleset(w.fam)
	res, err := rs.Evaluate(table, hook, w.rulesPacket(), w.env)
	if err != nil {
		w.doubt("%s %s: %v", table, hook, err)
		return
	}
	if res.Uncertain {
		w.doubt("%s %s: %s (took %s)", table, hook, strings.Join(res.Reasons, "; "), res.Outcome.String())
	}
	o := res.Outcome
	w.mark = o.Mark
	where := fmt.Sprintf("%s %s (%s)", table, hook, o.PathString())
	text := ""
	if o.Rule != nil {
		text = o.Rule.Text
	}
	switch o.Verdict {
	case rules.VerdictDNAT, rules.VerdictRedirect:
		w.translate(hook, where, text, w.iptablesTargets(&o, res.Alternatives))
	case rules.VerdictReject:
		w.reject(hook, where, text, iptablesReject(o.Rule, w.fam))
	case rules.VerdictDrop:
		w.drop(hook, where, text)
	case rules.VerdictSNAT, rules.VerdictMasquerade:
		w.sourceNAT(where, text)
	}
}

// sourceNAT: the connection's source is translated at POSTROUTING, so its
// answers come back to the node, which translates them back.
func (w *walk) sourceNAT(where, text string) {
	if w.snat != "" {
		return
	}
	w.snat = text
	w.note("%s: source NAT by `%s`: the answers come back through the node", where, text)
}

// iptablesTargets are the destinations a DNAT or REDIRECT outcome and its
// alternatives (kube-proxy's random endpoint choice) can translate to.
func (w *walk) iptablesTargets(o *rules.Outcome, alts []rules.Outcome) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range append([]rules.Outcome{*o}, alts...) {
		if (a.Verdict != rules.VerdictDNAT && a.Verdict != rules.VerdictRedirect) || a.Rule == nil {
			continue
		}
		addr, port := w.dst.Addr(), w.dst.Port()
		if n := a.Rule.Target.NAT; len(n) > 0 {
			if n[0].MinAddr.IsValid() {
				addr = n[0].MinAddr
			}
			if n[0].MinPort != 0 {
				port = n[0].MinPort
			}
		}
		out = append(out, netip.AddrPortFrom(addr, port))
	}
	return out
}

// answer is how a REJECT answers.
type answer struct {
	reset     bool
	typ, code uint8
	text      string
}

func iptablesReject(r *rules.Rule, fam rules.Family) answer {
	with := r.Target.RejectWith
	if with == "tcp-reset" {
		return answer{reset: true, text: with}
	}
	typ, code, _ := rules.RejectICMP(with, fam)
	return answer{typ: typ, code: code, text: with}
}

// nftChain walks one native base chain at hook.
func (w *walk) nftChain(hook string, c *nft.Chain) {
	if c.Type == "nat" && w.natDone && hook != "POSTROUTING" {
		return
	}
	rs, _ := w.env.NFTRuleset()
	res := rs.Evaluate(c, w.rulesPacket(), w.env)
	if len(res.Outcomes) == 0 {
		return
	}
	o := res.Outcomes[0]
	w.mark = o.Mark
	where := fmt.Sprintf("%s %s (%s)", c.Table.ID(), c.Name, strings.Join(o.Chains(), " → "))
	w.nftDoubts(where, res)
	text := ""
	if o.Rule != nil {
		text = o.Rule.Text
	}
	switch o.Verdict {
	case rules.VerdictDNAT, rules.VerdictRedirect:
		w.translate(hook, where, text, w.nftTargets(res))
	case rules.VerdictReject:
		w.reject(hook, where, text, nftReject(&o, w.nftFamily()))
	case rules.VerdictDrop:
		w.drop(hook, where, text)
	case rules.VerdictSNAT, rules.VerdictMasquerade:
		w.sourceNAT(where, text)
	}
}

// nftDoubts notes a walk whose ways end differently; ways that differ
// only in the numgen endpoint they DNAT to are one decision.
func (w *walk) nftDoubts(where string, res *nft.Result) {
	if res.Incomplete != "" {
		w.doubt("%s: %s", where, res.Incomplete)
	}
	first := res.Outcomes[0]
	for _, o := range res.Outcomes[1:] {
		if o.Verdict != first.Verdict {
			w.doubt("%s: could also end %s (%s)", where, o.String(), strings.Join(o.Doubts, "; "))
			return
		}
	}
}

func (w *walk) nftTargets(res *nft.Result) []netip.AddrPort {
	var out []netip.AddrPort
	for i := range res.Outcomes {
		o := &res.Outcomes[i]
		if o.Verdict == rules.VerdictDNAT || o.Verdict == rules.VerdictRedirect {
			out = append(out, o.NATTargets(w.dst)...)
		}
	}
	return out
}

func nftReject(o *nft.Outcome, fam string) answer {
	if o.RejectsWithReset() {
		return answer{reset: true, text: "tcp reset"}
	}
	typ, code, _ := o.RejectICMP(fam)
	return answer{typ: typ, code: code, text: fmt.Sprintf("icmp type %d code %d", typ, code)}
}

// translate is a DNAT: the connection goes to the first of targets from
// here on (the others are the random choices the kernel may make).
func (w *walk) translate(hook, where, text string, targets []netip.AddrPort) {
	if len(targets) == 0 {
		w.doubt("%s: `%s` translates to an address the walk cannot compute; it stops there", where, text)
		w.stopped = true
		return
	}
	to := targets[0]
	ev := w.event(trace.KindDNAT, "nf_nat_setup_info")
	ev.NFHook = hook
	ev.Orig = &trace.Tuple{Src: endpoint(w.src), Dst: endpoint(w.c.Dst)}
	ev.Reply = &trace.Tuple{Src: endpoint(to), Dst: endpoint(w.src)}
	ev.To = endpoint(to)
	w.events = append(w.events, ev)
	w.note("%s: DNAT to %s by `%s`%s", where, to, text, others(targets))
	w.dst, w.natDone, w.decided = to, true, text
}

func others(targets []netip.AddrPort) string {
	if len(targets) < 2 {
		return ""
	}
	s := make([]string, len(targets)-1)
	for i, t := range targets[1:] {
		s[i] = t.String()
	}
	return " (or, chosen at random, " + strings.Join(s, ", ") + ")"
}

func (w *walk) reject(hook, where, text string, a answer) {
	if a.reset {
		ev := w.event(trace.KindReset, "nf_send_reset")
		ev.By, ev.Packet, ev.NFHook = trace.ResetByNetfilter, w.packet(), hook
		w.events = append(w.events, ev)
	} else {
		w.events = append(w.events, w.icmpError(hook, a.typ, a.code))
	}
	w.note("%s: REJECT (%s) by `%s`", where, a.text, text)
	w.stopped, w.decided = true, text
}

// icmpError is an ICMP error sent about the packet: by a REJECT at hook,
// or by the stack or IPVS (hook "").
func (w *walk) icmpError(hook string, typ, code uint8) trace.Event {
	ev := w.event(trace.KindReject, "icmp_send")
	ev.Proto = "icmp"
	if w.fam == rules.IPv6 {
		ev.Proto, ev.Hook = "icmpv6", "icmp6_send"
	}
	ev.Packet, ev.NFHook = w.packet(), hook
	ev.ICMPType, ev.ICMPCode = &typ, &code
	return ev
}

func (w *walk) drop(hook, where, text string) {
	ev := w.event(trace.KindDrop, "kfree_skb")
	ev.Reason, ev.Packet, ev.NFHook = "NETFILTER_DROP", w.packet(), hook
	w.events = append(w.events, ev)
	by := "`" + text + "`"
	if text == "" {
		by = "the chain's policy"
	}
	w.note("%s: DROP by %s", where, by)
	w.stopped, w.decided = true, text
}
