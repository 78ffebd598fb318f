package diagnose

import (
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// ctDropFlow is a SYN netfilter dropped without a conntrack entry, with
// conntrack's counters around the drop.
func ctDropFlow(table *trace.ConntrackTable) *trace.Flow {
	f := flow("tcp", "10.0.0.1:40000", "10.0.0.2:8080", "", trace.KindDrop)
	f.Events[0].NoConntrack = true
	f.Events[0].ConntrackTable = table
	return f
}

func TestConntrackTableFull(t *testing.T) {
	f := ctDropFlow(&trace.ConntrackTable{Entries: 16, Max: 16, Drops: 3})
	check(t, f, trace.VerdictConntrackTableFull, "table on node node-2 was full (16 of 16 entries)",
		"10.0.0.2:8080", "drop counter rose by 3", "nf_conntrack_max")
}

func TestConntrackDropNotFullIsClash(t *testing.T) {
	f := ctDropFlow(&trace.ConntrackTable{Entries: 40, Max: 65536, Drops: 1, InsertFailed: 1})
	check(t, f, trace.VerdictDropped, "dropped by conntrack", "insert_failed rose by 1", "40 of 65536")
}

// Near misses: each lacks one piece of the evidence.
func TestConntrackDropNeedsAllEvidence(t *testing.T) {
	// The packet had an entry: a rule after conntrack dropped it.
	f := ctDropFlow(&trace.ConntrackTable{Entries: 16, Max: 16, Drops: 3})
	f.Events[0].NoConntrack = false
	check(t, f, trace.VerdictDropped, "NETFILTER_DROP")
	// The counter did not rise: conntrack dropped nothing then (an
	// INVALID packet a filter rule dropped has no entry either).
	f = ctDropFlow(&trace.ConntrackTable{Entries: 16, Max: 16})
	check(t, f, trace.VerdictDropped, "NETFILTER_DROP")
	// No counters (an old trace, or none readable).
	check(t, ctDropFlow(nil), trace.VerdictDropped, "NETFILTER_DROP")
	// A raw table rule, which runs before conntrack, dropped it.
	f = ctDropFlow(&trace.ConntrackTable{Entries: 16, Max: 16, Drops: 3})
	f.Rule = &trace.Rule{Table: "raw", Chain: "PREROUTING", Text: "-A PREROUTING -p tcp --dport 8080 -j DROP"}
	check(t, f, trace.VerdictDropped, "-A PREROUTING -p tcp --dport 8080 -j DROP")
}
