package agent

import (
	"slices"

	"github.com/tracer-dev/tracer/internal/diagnose"
	"github.com/tracer-dev/tracer/internal/trace"
)

// joinFlows makes one flow of one connection's flows from several nodes:
// the connection as the first node saw it, every node's decisions (each
// event naming its node) in time order, and a verdict from all of them.
func joinFlows(parts []*trace.Flow) *trace.Flow {
	parts = pathOrder(parts)
	first := parts[0]
	f := &trace.Flow{Type: trace.TypeFlow, Time: first.Time, Proto: first.Proto, Orig: first.Orig}
	for _, p := range parts {
		if !slices.Contains(f.Nodes, p.Node) {
			f.Nodes = append(f.Nodes, p.Node)
		}
		if p.Time.Before(f.Time) {
			f.Time = p.Time
		}
		for _, e := range p.Events {
			e.Node = p.Node
			f.Events = append(f.Events, e)
		}
		if p.Reply != nil {
			f.Reply = p.Reply
		}
		if f.SrcPod == nil {
			f.SrcPod = p.SrcPod
		}
		if p.DstPod != nil {
			f.DstPod = p.DstPod
		}
		if f.Service == nil {
			f.Service = p.Service
		}
	}
	slices.SortStableFunc(f.Events, func(a, b trace.Event) int { return a.Time.Compare(b.Time) })
	r, d := diagnose.Joined(parts)
	f.Rule, f.Conntrack = parts[d].Rule, parts[d].Conntrack
	f.Verdict, f.Explanation = r.Verdict, r.Explanation
	return f
}

// pathOrder sorts parts the way the connection went: a part goes before
// the part its connection left for. Parts no tuple orders keep their time
// order.
func pathOrder(parts []*trace.Flow) []*trace.Flow {
	rest := slices.Clone(parts)
	slices.SortStableFunc(rest, func(a, b *trace.Flow) int { return a.Time.Compare(b.Time) })
	var out []*trace.Flow
	for len(rest) > 0 {
		next := 0
		for i, p := range rest {
			if !slices.ContainsFunc(rest, func(q *trace.Flow) bool { return q != p && precedes(q, p) }) {
				next = i
				break
			}
		}
		out = append(out, rest[next])
		rest = slices.Delete(rest, next, next+1)
	}
	return out
}

// precedes: the connection went through a's node before b's, or b's node
// got a's answer.
func precedes(a, b *trace.Flow) bool {
	k, ok := answeredAs(a)
	return leftAs(a) == arrivedAs(b) || ok && k == arrivedAs(b)
}
