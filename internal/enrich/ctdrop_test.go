package enrich

import (
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// fixedCounters answers every time with one reading of conntrack's counters.
type fixedCounters struct {
	table trace.ConntrackTable
	asked []time.Time
}

func (c *fixedCounters) Around(t time.Time) (trace.ConntrackTable, bool) {
	c.asked = append(c.asked, t)
	return c.table, true
}

// A node whose filter table drops port 8080 and whose raw table drops
// port 9090: rules after and before conntrack.
const ctDropFilter = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p tcp --dport 8080 -j DROP
COMMIT
`

const ctDropRaw = `*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -p tcp --dport 9090 -j DROP
COMMIT
`

func joinCTDrop(t *testing.T, ct *fixedCounters, noCT bool, dst string) *trace.Flow {
	t.Helper()
	return joinCTDropIn(t, ct, noCT, dst, 7)
}

// joinCTDropIn joins the drop seen in the namespace whose inode is netns;
// the counters are namespace 7's.
func joinCTDropIn(t *testing.T, ct *fixedCounters, noCT bool, dst string, netns uint32) *trace.Flow {
	t.Helper()
	snap := &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "10.0.0.2/24", Up: true}},
		Rules:     map[string]string{"filter": ctDropFilter, "raw": ctDropRaw},
	}
	env, err := NewNodeEnv("node-1", snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []*trace.Flow
	j := NewStages(&join.Joiner{Names: netfilterDrop{}, Counters: ct, CountersNetns: 7},
		&Enricher{Env: func(time.Time) Env { return env }, Emit: func(f *trace.Flow) { out = append(out, f) }})
	now := time.Unix(1700000000, 0)
	ev := dropEvent("10.0.0.1:40000", dst)
	ev.Time, ev.NoCT, ev.Netns = now, noCT, netns
	j.Add(ev, now)
	j.Flush()
	if len(out) != 1 {
		t.Fatalf("%d flows, want one", len(out))
	}
	return out[0]
}

func TestJoinConntrackTableFullDrop(t *testing.T) {
	full := &fixedCounters{table: trace.ConntrackTable{Entries: 16, Max: 16, Drops: 2}}
	f := joinCTDrop(t, full, true, "10.0.0.2:8080")
	if got := f.Events[0].ConntrackTable; got == nil || *got != full.table {
		t.Fatalf("drop event's counters %+v, want %+v", got, full.table)
	}
	// The filter rule runs after conntrack: it never saw the packet.
	if f.Rule != nil || f.Verdict != trace.VerdictConntrackTableFull {
		t.Errorf("rule %+v, verdict %q; want no rule, %s: %s", f.Rule, f.Verdict, trace.VerdictConntrackTableFull, f.Explanation)
	}
	// The raw table's rule runs before conntrack: it dropped the packet.
	f = joinCTDrop(t, full, true, "10.0.0.2:9090")
	if f.Rule == nil || f.Rule.Table != "raw" || f.Verdict != trace.VerdictDropped {
		t.Errorf("rule %+v, verdict %q; want the raw rule, dropped", f.Rule, f.Verdict)
	}
}

func TestJoinDropWithConntrackEntry(t *testing.T) {
	full := &fixedCounters{table: trace.ConntrackTable{Entries: 16, Max: 16, Drops: 2}}
	f := joinCTDrop(t, full, false, "10.0.0.2:8080")
	if len(full.asked) != 0 || f.Events[0].ConntrackTable != nil {
		t.Error("counters were set beside a packet that had a conntrack entry")
	}
	if f.Rule == nil || f.Rule.Table != "filter" || f.Verdict != trace.VerdictDropped {
		t.Errorf("rule %+v, verdict %q; want the filter rule, dropped", f.Rule, f.Verdict)
	}
	// Counters that did not rise: the filter rule stays the explanation.
	quiet := &fixedCounters{table: trace.ConntrackTable{Entries: 16, Max: 16}}
	f = joinCTDrop(t, quiet, true, "10.0.0.2:8080")
	if f.Rule == nil || f.Rule.Table != "filter" || f.Verdict != trace.VerdictDropped {
		t.Errorf("quiet counters: rule %+v, verdict %q; want the filter rule, dropped", f.Rule, f.Verdict)
	}
}

// A drop in another namespace (--all-netns) is not set beside the
// observed namespace's table.
func TestJoinConntrackDropOtherNamespace(t *testing.T) {
	full := &fixedCounters{table: trace.ConntrackTable{Entries: 16, Max: 16, Drops: 2}}
	f := joinCTDropIn(t, full, true, "10.0.0.2:8080", 8)
	if len(full.asked) != 0 || f.Events[0].ConntrackTable != nil || f.Verdict == trace.VerdictConntrackTableFull {
		t.Errorf("another namespace's drop got this table: %+v, verdict %s", f.Events[0].ConntrackTable, f.Verdict)
	}
}
