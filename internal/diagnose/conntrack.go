package diagnose

import (
	"fmt"

	"github.com/tracer-dev/tracer/internal/trace"
)

// conntrackDrop: netfilter dropped a packet that carried no conntrack
// entry while conntrack's own drop counter rose, and no raw table rule
// (the only rules that run before conntrack) dropped it: conntrack did,
// its table full or an insert clash lost.
func (d *diagnosis) conntrackDrop() (Result, bool) {
	ev := d.conntrackDropEvent()
	if ev == nil || d.f.Rule != nil {
		return Result{}, false
	}
	t := ev.ConntrackTable
	if t.Full() {
		return Result{trace.VerdictConntrackTableFull, sentences(
			fmt.Sprintf("dropped by conntrack: its table on %s was full (%d of %d entries), so the new connection %s from %s got no entry and its packet was dropped (conntrack's drop counter rose by %d then; the kernel logs \"nf_conntrack: table full, dropping packet\")",
				nodeOrThis(d.env.NodeName()), t.Entries, t.Max, d.target(), d.f.Orig.Src, t.Drops),
			"Early drop evicts only connections that are not yet assured, so a table of established connections refuses every new one until entries expire",
			"Fix: raise net.netfilter.nf_conntrack_max (kube-proxy sets it from --conntrack-max-per-core, or conntrack.maxPerCore, times the CPUs) or find what fills the table (conntrack -L, counted by source)",
		)}, true
	}
	clash := ""
	if t.InsertFailed > 0 {
		clash = fmt.Sprintf("; insert_failed rose by %d too: two packets of one new connection raced to insert the same entry and the loser was dropped (typical of UDP DNS from pods sending A and AAAA queries at once)", t.InsertFailed)
	}
	return Result{trace.VerdictDropped, sentences(
		fmt.Sprintf("dropped by conntrack: a packet of %s from %s carried no conntrack entry and no rule before conntrack dropped it, while conntrack's drop counter rose by %d (table %d of %d entries)%s",
			d.target(), d.f.Orig.Src, t.Drops, t.Entries, t.Max, clash),
	)}, true
}

// conntrackDropEvent is the flow's netfilter drop of a packet without a
// conntrack entry while conntrack's drop counter rose.
func (d *diagnosis) conntrackDropEvent() *trace.Event {
	for i := range d.f.Events {
		e := &d.f.Events[i]
		if e.Kind == trace.KindDrop && e.NoConntrack && e.ConntrackTable != nil && e.ConntrackTable.Drops > 0 {
			return e
		}
	}
	return nil
}

func nodeOrThis(name string) string {
	if name == "" {
		return "this node"
	}
	return "node " + name
}
