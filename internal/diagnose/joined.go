package diagnose

import (
	"fmt"
	"slices"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Joined gives one connection seen on several nodes its verdict from all
// their decisions at once. parts are each node's flow, as its agent
// diagnosed it, in the order the connection went through the nodes.
// decisive is the part whose rule and conntrack entry are the evidence.
//
// A return path that goes wrong shows on two nodes: the node that DNATs
// without SNAT keeps an unreplied entry, and the client's node resets the
// answer that comes from the backend directly. Seen together, that is no
// longer an inference from one side. Otherwise the first node whose
// verdict is not ok decides (else the first that translated the
// connection), and every node says what it did.
func Joined(parts []*trace.Flow) (r Result, decisive int) {
	if r, i, ok := returnPathBothEnds(parts); ok {
		return r, i
	}
	decisive = slices.IndexFunc(parts, func(p *trace.Flow) bool { return p.Verdict != "" && p.Verdict != trace.VerdictOK })
	if decisive < 0 {
		decisive = max(0, slices.IndexFunc(parts, Translated))
	}
	d := parts[decisive]
	explain := []string{onNode(d)}
	for i, p := range parts {
		if i != decisive {
			explain = append(explain, onNode(p))
		}
	}
	return Result{orDefault(d.Verdict, trace.VerdictOK), sentences(explain...)}, decisive
}

// Translated says whether f's node made a NAT decision for it (DNAT,
// SNAT or IPVS).
func Translated(f *trace.Flow) bool {
	return slices.ContainsFunc(f.Events, func(e trace.Event) bool {
		return e.Kind == trace.KindDNAT || e.Kind == trace.KindSNAT || e.Kind == trace.KindIPVS
	})
}

func onNode(f *trace.Flow) string {
	return fmt.Sprintf("On node %s: %s", f.Node, f.Explanation)
}

// returnPathBothEnds: one part DNATs (or IPVS-forwards) the connection
// without SNAT and its conntrack entry never saw a reply; another part,
// the client's node, resets or drops a packet to the client from exactly
// where that DNAT sent the connection.
func returnPathBothEnds(parts []*trace.Flow) (Result, int, bool) {
	for i, dn := range parts {
		to, ok := dnatWithoutSNAT(dn)
		if !ok {
			continue
		}
		for _, cl := range parts {
			if cl == dn {
				continue
			}
			ev := strayAnswer(cl, to, dn.Orig.Src)
			if ev == nil {
				continue
			}
			what := "reset"
			if ev.Kind == trace.KindDrop {
				what = "dropped (" + orDefault(ev.Reason, "no reason given") + ")"
			}
			return Result{trace.VerdictReturnPathMismatch, sentences(
				fmt.Sprintf("return path, seen from both ends: node %s sent %s from %s to %s without SNAT, and its conntrack entry never saw a reply",
					dn.Node, dn.Orig.Dst, dn.Orig.Src, to),
				fmt.Sprintf("%s answered %s directly, and on node %s the client's stack %s that answer: it never connected to %s", to, ev.Packet.Dst, cl.Node, what, to),
				"Something DNAT'd the connection without SNAT (externalTrafficPolicy=Local since Kubernetes 1.24 forwards to remote endpoints without SNAT on a node with none of its own)",
				"Fix: route the traffic only to nodes with a local endpoint (the LB health check on healthCheckNodePort), or use externalTrafficPolicy=Cluster so the node SNATs",
			)}, i, true
		}
	}
	return Result{}, 0, false
}

// dnatWithoutSNAT is where f's node sent the connection, when it
// translated the destination, not the source, and saw no reply.
func dnatWithoutSNAT(f *trace.Flow) (string, bool) {
	var to string
	for _, e := range f.Events {
		switch e.Kind {
		case trace.KindSNAT:
			return "", false
		case trace.KindDNAT, trace.KindIPVS:
			to = e.To
		}
	}
	if to == "" || !f.Conntrack.Unreplied() {
		return "", false
	}
	if f.Reply != nil {
		to = f.Reply.Src
	}
	return to, true
}

// strayAnswer is f's stack reset or drop of a packet from `from` to
// client.
func strayAnswer(f *trace.Flow, from, client string) *trace.Event {
	for i := range f.Events {
		e := &f.Events[i]
		if stackResetOrDrop(e) && e.Packet.Src == from && e.Packet.Dst == client {
			return e
		}
	}
	return nil
}
