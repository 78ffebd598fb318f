package predict

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/nft"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// walk is one connection's first packet on its way through the node.
type walk struct {
	env enrich.Env
	c   Conn
	fam rules.Family
	// src and dst are the packet as the current hook sees it: dst changes
	// with a DNAT or an IPVS real server.
	src, dst netip.AddrPort
	srcLocal bool
	natDone  bool
	// mark is the packet mark the rules set so far (kube-proxy marks
	// for masquerade in PREROUTING and masquerades in POSTROUTING).
	mark    uint32
	reads   rules.Reads
	stopped bool
	// sent: IPVS sent the packet on to a real server from INPUT or
	// OUTPUT; it leaves through POSTROUTING.
	sent bool
	// snat is the rule that translated the source at POSTROUTING, if one
	// did; replyBypasses says the answer will not come back through the
	// node.
	snat          string
	replyBypasses bool
	at            time.Time

	events    []trace.Event
	steps     []string
	uncertain []string
	// decided is the text of the rule that ended the walk, if one did.
	decided string
}

func newWalk(env enrich.Env, c Conn) *walk {
	w := &walk{env: env, c: c, fam: rules.IPv4, at: now().UTC(), events: []trace.Event{}}
	if c.Dst.Addr().Unmap().Is6() {
		w.fam = rules.IPv6
	}
	// The client's port is not known: it is left 0, and a rule that reads
	// it makes the walk uncertain (sourcePortRead).
	w.src, w.dst = netip.AddrPortFrom(c.Src, 0), c.Dst
	w.srcLocal, _ = env.IsLocal(c.Src)
	return w
}

// run takes the packet through the hooks it meets: PREROUTING or OUTPUT,
// then INPUT and the local stack for the node's own addresses, FORWARD
// for the others.
func (w *walk) run() {
	first := "PREROUTING"
	if w.srcLocal {
		first = "OUTPUT"
	}
	defer w.sourcePortRead()
	w.hook(first)
	if w.stopped {
		return
	}
	local, err := w.env.IsLocal(w.dst.Addr())
	if err != nil {
		w.doubt("whether %s is one of the node's addresses: %v", w.dst.Addr(), err)
	}
	switch {
	case w.sent:
	case local:
		w.hook("INPUT")
		if !w.stopped && !w.sent {
			w.deliverLocally()
			return
		}
	case w.srcLocal:
		w.note("leaves the node for %s", endpoint(w.dst))
	default:
		w.hook("FORWARD")
		if !w.stopped {
			w.note("forwarded to %s", endpoint(w.dst))
		}
	}
	if !w.stopped {
		w.hook("POSTROUTING")
		w.replyPath()
	}
}

// stage is one thing that sees the packet at a hook, in priority order:
// an iptables table, a native nftables base chain, or IPVS.
type stage struct {
	prio  int
	table string     // iptables
	chain *nft.Chain // nftables
	ipvs  bool
}

// iptablesPrio are the iptables tables' priorities (NF_IP_PRI_*).
var iptablesPrio = map[string]int{"raw": -300, "mangle": -150, "nat": -100, "filter": 0, "security": 50}

// hookTables are the iptables tables with a chain at each hook. nat's
// INPUT and POSTROUTING chains only translate sources, which the
// prediction leaves out.
var hookTables = map[string][]string{
	"PREROUTING":  {"raw", "mangle", "nat"},
	"OUTPUT":      {"raw", "mangle", "nat", "filter", "security"},
	"INPUT":       {"mangle", "filter", "security"},
	"FORWARD":     {"mangle", "filter", "security"},
	"POSTROUTING": {"mangle", "nat"},
}

// ipvsPrio is where IPVS takes a connection to a virtual server: at
// LOCAL_OUT just after nat (ip_vs_local_request, NF_IP_PRI_NAT_DST+2) and
// at LOCAL_IN just before the source NAT (ip_vs_remote_request,
// NF_IP_PRI_NAT_SRC-2), after the filter table.
var ipvsPrio = map[string]int{"OUTPUT": -98, "INPUT": 98}

func (w *walk) stages(hook string) []stage {
	var out []stage
	if rs := w.env.Ruleset(w.fam); rs != nil {
		for _, t := range hookTables[hook] {
			if tb := rs.Tables[t]; tb != nil && tb.Chains[hook] != nil {
				out = append(out, stage{prio: iptablesPrio[t], table: t})
			}
		}
	}
	if rs, err := w.env.NFTRuleset(); err != nil {
		w.doubt("the nftables ruleset could not be read: %v", err)
	} else if rs != nil {
		for _, c := range rs.HookChains(w.nftFamily(), strings.ToLower(hook)) {
			out = append(out, stage{prio: c.Prio, chain: c})
		}
	}
	if p, ok := ipvsPrio[hook]; ok {
		out = append(out, stage{prio: p, ipvs: true})
	}
	slices.SortStableFunc(out, func(a, b stage) int { return a.prio - b.prio })
	return out
}

func (w *walk) nftFamily() string {
	if w.fam == rules.IPv6 {
		return "ip6"
	}
	return "ip"
}

func (w *walk) hook(hook string) {
	stages := w.stages(hook)
	sentBefore := w.sent
	for _, s := range stages {
		pkt, decided := w.rulesPacket(), len(w.events)
		switch {
		case s.ipvs:
			w.ipvs()
		case s.chain != nil:
			w.nftChain(hook, s.chain)
		default:
			w.iptablesTable(hook, s.table)
		}
		if len(w.events) > decided && !s.ipvs {
			w.samePriority(hook, s, stages, pkt)
		}
		if w.stopped || w.sent && !sentBefore {
			return // decided, or IPVS took the packet out of this hook
		}
	}
}

// samePriority notes the base chains of other tables at the deciding
// stage's priority that would decide too: netfilter runs chains of equal
// priority in the reverse order of their registration, which a ruleset
// listing does not show (the walk takes the newer table by its handle).
func (w *walk) samePriority(hook string, s stage, all []stage, pkt rules.Packet) {
	for _, o := range all {
		if o.prio != s.prio || o.ipvs || o.name() == s.name() {
			continue
		}
		if what, ok := w.wouldDecide(hook, o, pkt); ok {
			w.doubt("%s and %s run at the same priority %d, in the reverse order of their registration, which the ruleset does not show (`nft list hooks` does): the walk took %s (the newer table by its handle); if %s runs first, it %s",
				s.name(), o.name(), s.prio, s.name(), o.name(), what)
		}
	}
}

func (s stage) name() string {
	if s.chain != nil {
		return s.chain.Table.ID() + " " + s.chain.Name
	}
	return "iptables " + s.table
}

// wouldDecide says what stage o would do with pkt, if it decides.
func (w *walk) wouldDecide(hook string, o stage, pkt rules.Packet) (string, bool) {
	var v rules.Verdict
	var text string
	if o.chain != nil {
		rs, _ := w.env.NFTRuleset()
		res := rs.Evaluate(o.chain, pkt, w.env)
		if len(res.Outcomes) == 0 {
			return "", false
		}
		v = res.Outcomes[0].Verdict
		if r := res.Outcomes[0].Rule; r != nil {
			text = r.Text
		}
	} else {
		res, err := w.env.Ruleset(w.fam).Evaluate(o.table, hook, pkt, w.env)
		if err != nil {
			return "", false
		}
		v = res.Verdict
		if res.Rule != nil {
			text = res.Rule.Text
		}
	}
	switch v {
	case rules.VerdictDNAT, rules.VerdictRedirect, rules.VerdictReject, rules.VerdictDrop:
		return fmt.Sprintf("would %s by `%s`", v, text), true
	}
	return "", false
}

// rulesPacket is the packet the rule evaluators match: the first of a new
// connection, with the translation done so far.
func (w *walk) rulesPacket() rules.Packet {
	p := rules.Packet{Proto: rules.ProtoNumber(w.c.Proto), Src: w.src, Dst: w.dst, State: rules.CTNew,
		OrigDst: w.c.Dst.Addr(), KnowNAT: true, Reads: &w.reads, Mark: w.mark}
	if w.natDone {
		p.NATed = rules.CTDNAT
	}
	switch p.Proto {
	case rules.ProtoICMP:
		p.ICMPType, p.ICMPKnown = 8, true
	case rules.ProtoICMPv6:
		p.ICMPType, p.ICMPKnown = 128, true
	}
	return p
}

// sourcePortRead: a rule on the way looked at the client's source port,
// which a connection not yet made does not have.
func (w *walk) sourcePortRead() {
	if w.reads.SrcPort {
		w.doubt("a rule on the way matches the client's source port, which is not known before the connection is made")
	}
}
