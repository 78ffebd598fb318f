package lab

import (
	"fmt"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Result is one attempt checked: first that the incident really happened
// (Expectation.Reproduced), then the tracer's flow against the Proof.
type Result struct {
	Expectation
	// Flows is how many flows the tracer reported for the attempt's tuple.
	Flows       int    `json:"flows"`
	Got         string `json:"got,omitempty"` // the verdict of the matching flow
	Explanation string `json:"explanation,omitempty"`
	// Wrong lists what the tracer's flow says differently from the node.
	Wrong []string `json:"wrong,omitempty"`
	// Unobservable says why this kernel cannot show the decision at all.
	Unobservable string `json:"unobservable,omitempty"`
	OK           bool   `json:"ok"`
}

// FalseAlarm is a flow with a problem verdict that no attempt accounts for.
type FalseAlarm struct {
	Proto       string      `json:"proto"`
	Orig        trace.Tuple `json:"orig"`
	Verdict     string      `json:"verdict"`
	Explanation string      `json:"explanation,omitempty"`
}

// Report is a scenario's attempts checked against the tracer's flows.
type Report struct {
	Results     []Result     `json:"checks"`
	FalseAlarms []FalseAlarm `json:"false_alarms,omitempty"`
	OK          bool         `json:"ok"`
}

// Check compares what the tracer reported with what the lab proved.
// dropReasons says the kernel names a drop's reason (kfree_skb has none
// before 5.17, so a netfilter DROP cannot be told from any other free).
func Check(exps []Expectation, flows []*trace.Flow, dropReasons bool) Report {
	rep := Report{OK: true}
	accounted := make([]bool, len(flows))
	for _, e := range exps {
		r := Result{Expectation: e}
		var match *trace.Flow
		for i, f := range flows {
			if f.Proto == e.Proto && f.Orig.Src == e.Src && f.Orig.Dst == e.Dst {
				accounted[i] = true
				r.Flows++
				match = f
			}
		}
		checkOne(&r, match, dropReasons)
		rep.OK = rep.OK && r.OK
		rep.Results = append(rep.Results, r)
	}
	for i, f := range flows {
		if !accounted[i] && f.Verdict != trace.VerdictOK {
			rep.FalseAlarms = append(rep.FalseAlarms, FalseAlarm{Proto: f.Proto, Orig: f.Orig, Verdict: f.Verdict, Explanation: f.Explanation})
			rep.OK = false
		}
	}
	return rep
}

func checkOne(r *Result, f *trace.Flow, dropReasons bool) {
	if !r.Reproduced() {
		if r.Saw != r.Outcome {
			r.Wrong = append(r.Wrong, fmt.Sprintf("not reproduced: the client saw %q, the scenario needs %q", r.Saw, r.Outcome))
		}
		for _, u := range r.Unproven {
			r.Wrong = append(r.Wrong, "not reproduced: the node does not show that "+u)
		}
		return
	}
	switch {
	case r.Flows > 1:
		r.Wrong = append(r.Wrong, fmt.Sprintf("one connection reported as %d flows", r.Flows))
		return
	case f == nil && r.NoFlow():
		r.OK, r.Explanation = true, "no kernel decision to report, and the node's counters show none"
		return
	case f == nil && r.Mechanism.silentDrop() && !dropReasons:
		r.OK = true
		r.Unobservable = "kfree_skb carries no drop reason on this kernel (before 5.17): a netfilter DROP looks like any other free"
		return
	case f == nil:
		r.Wrong = append(r.Wrong, "no flow for the connection")
		return
	}
	r.Got, r.Explanation = f.Verdict, f.Explanation
	if r.NoFlow() {
		// Healthy untranslated traffic may be reported, but only as ok.
		if f.Verdict != trace.VerdictOK {
			r.Wrong = append(r.Wrong, fmt.Sprintf("verdict: tracer %q, node made no decision", f.Verdict))
		}
		r.OK = len(r.Wrong) == 0
		return
	}
	r.Wrong = compareFlow(r.Expectation, f)
	r.OK = len(r.Wrong) == 0
}

// compareFlow lists every fact of the flow that differs from the node's.
func compareFlow(e Expectation, f *trace.Flow) []string {
	var wrong []string
	differ := func(what, tracer, node string) {
		if tracer != node {
			wrong = append(wrong, fmt.Sprintf("%s: tracer %q, node %q", what, tracer, node))
		}
	}
	mention := func(what, s string) {
		if s != "" && !strings.Contains(f.Explanation, s) {
			wrong = append(wrong, fmt.Sprintf("explanation does not name %s %q", what, s))
		}
	}
	p := e.Proof
	differ("verdict", f.Verdict, e.Verdict)
	if p.Rule != nil {
		var r trace.Rule
		if f.Rule != nil {
			r = *f.Rule
		}
		differ("rule table", r.Table, p.Rule.Table)
		differ("rule chain", r.Chain, p.Rule.Chain)
		if p.Rule.Backend == backendNFT {
			wrong = append(wrong, compareNFTRule(r, *p.Rule)...)
		} else {
			differ("rule family", r.Family, p.Rule.Family)
			differ("rule", r.Text, p.Rule.Text)
		}
		mention("the rule's chain", p.Rule.Chain)
	}
	if p.Owner != "" {
		owner := ""
		if f.Rule != nil && f.Rule.Owner != nil {
			owner = f.Rule.Owner.Pod.Key()
		}
		differ("rule owner", owner, p.Owner)
		mention("the rule's owner", p.Owner)
	}
	differ("destination pod", f.DstPod.Key(), p.DstPod)
	mention("the destination pod", p.DstPod)
	differ("service", f.Service.Key(), p.Service)
	mention("the service", p.Service)
	if ct := p.Conntrack; ct != nil {
		reply := ""
		if f.Reply != nil {
			reply = f.Reply.Src + " -> " + f.Reply.Dst
		}
		differ("conntrack reply tuple", reply, ct.ReplySrc+" -> "+ct.ReplyDst)
		replied := f.Conntrack != nil && f.Conntrack.Replied
		differ("conntrack replied", fmt.Sprint(replied), fmt.Sprint(!ct.Unreplied))
	}
	if f.Conntrack != nil && f.Conntrack.Unconfirmed && p.Conntrack != nil {
		wrong = append(wrong, fmt.Sprintf("conntrack: tracer says the entry was never confirmed, the node lists it (%s)", describeCT(p.Conntrack)))
	}
	if p.IPVS != nil {
		wrong = append(wrong, compareIPVS(p.IPVS, f)...)
	}
	need := func(ok bool, what string) {
		if !ok {
			wrong = append(wrong, "no event of "+what)
		}
	}
	switch e.Mechanism {
	case StackReset:
		need(hasEvent(f, trace.KindReset, trace.ResetByStack), "the node's stack reset (the node's Tcp OutRsts went up)")
	case ReturnPath:
		need(hasEvent(f, trace.KindReset, trace.ResetByStack), "the client's reset (its Tcp OutRsts went up)")
	case FilterReject, ClusterIPReject, NoEndpointReject:
		need(hasEvent(f, trace.KindReject, ""), "the ICMP error the node sent (its Icmp OutDestUnreachs went up)")
	}
	return wrong
}

// compareNFTRule compares a native rule beyond table and chain: backend,
// family, handle (both read from the same namespace's `nft -a list
// ruleset`), text and the map element that led to it.
func compareNFTRule(r trace.Rule, want RuleHit) []string {
	var wrong []string
	differ := func(what, tracer, node string) {
		if tracer != node {
			wrong = append(wrong, fmt.Sprintf("%s: tracer %q, nft %q", what, tracer, node))
		}
	}
	differ("rule backend", r.Backend, want.Backend)
	differ("rule family", r.Family, want.Family)
	differ("rule handle", fmt.Sprint(r.Handle), fmt.Sprint(want.Handle))
	differ("rule", withoutCounts(r.Text), withoutCounts(want.Text))
	var got, node ElementHit
	if r.Element != nil {
		got = ElementHit{Map: r.Element.Map, Key: r.Element.Key, Comment: r.Element.Comment}
	}
	if want.Element != nil {
		node = *want.Element
	}
	differ("rule element map", got.Map, node.Map)
	differ("rule element key", got.Key, node.Key)
	differ("rule element comment", got.Comment, node.Comment)
	if r.Uncertain != "" {
		// The node's effects single the rule out: a doubt is a rule the
		// tracer could not read.
		wrong = append(wrong, "rule uncertain where the node shows one rule: "+r.Uncertain)
	}
	return wrong
}

// withoutCounts drops a counter's numbers: the tracer lists the ruleset
// when it changes, the lab after each attempt, so a counting rule's text
// differs by the packets counted in between.
func withoutCounts(text string) string { return nftCounter.ReplaceAllString(text, "counter") }

func compareIPVS(want *IPVSHit, f *trace.Flow) []string {
	kind := trace.KindIPVS
	if want.Real == "" {
		kind = trace.KindIPVSNoDest
	}
	for _, ev := range f.Events {
		if ev.Kind != kind {
			continue
		}
		var wrong []string
		if ev.Virtual != want.Virtual {
			wrong = append(wrong, fmt.Sprintf("virtual server: tracer %q, ipvsadm %q", ev.Virtual, want.Virtual))
		}
		if want.Real != "" && ev.To != want.Real {
			wrong = append(wrong, fmt.Sprintf("real server: tracer %q, ipvsadm %q", ev.To, want.Real))
		}
		return wrong
	}
	return []string{fmt.Sprintf("no %s event for virtual server %s (ipvsadm counted it)", kind, want.Virtual)}
}

func hasEvent(f *trace.Flow, kind, by string) bool {
	for _, ev := range f.Events {
		if ev.Kind == kind && (by == "" || ev.By == by) {
			return true
		}
	}
	return false
}
