package node

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// TestChange: a change records the parts that differ, each whole, at the
// new state's read time, and applied to the old snapshot gives the new
// one; an unchanged state records nothing.
func TestChange(t *testing.T) {
	old := sampleState(t)
	if c := Change(old, old.clone()); c != nil {
		t.Fatalf("no part changed, yet %+v", c)
	}
	// A fact (no ip_vs loaded: no virtual servers) leaves nothing unknown:
	// no warning, so no change.
	fact := old.clone()
	(&Watcher{}).setNoteAs(fact, "ipvs", "IPVS: the kernel has no ip_vs module loaded", true)
	if c := Change(old, fact); c != nil || len(fact.Warnings()) != len(old.Warnings()) || len(fact.Notes()) != len(old.Notes())+1 {
		t.Fatalf("a fact alone: change %+v, warnings %q, notes %q", c, fact.Warnings(), fact.Notes())
	}
	cur := old.clone()
	cur.read = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	cur.rulesText = map[string]string{}
	for k, v := range old.rulesText {
		cur.rulesText[k] = v
	}
	cur.rulesText["nat"] += "# rewritten\n"
	delete(cur.rulesText, "ip6/nat")
	cur.listeners = old.listeners[:2]
	cur.notes["ipvs"] = "read IPVS: permission denied"

	c := Change(old, cur)
	want := []string{trace.PartRules + "ip6/nat", trace.PartRules + "nat", trace.PartListeners, trace.PartWarnings}
	if c == nil || !slices.Equal(c.Changed, want) || !c.Time.Equal(cur.read) {
		t.Fatalf("change %+v, want parts %v at %s", c, want, cur.read)
	}
	if !slices.Equal(c.Warnings, cur.Warnings()) || !slices.Contains(c.Warnings, "read IPVS: permission denied") {
		t.Errorf("warnings %q, want the watcher's %q", c.Warnings, cur.Warnings())
	}
	if _, ok := c.Snapshot.Rules["ip6/nat"]; ok || c.Snapshot.Ipsets != "" || c.Snapshot.IPVS != nil {
		t.Errorf("the change carries more than its parts: %+v", c.Snapshot)
	}
	got, wantSnap := c.Apply(old.Snapshot()), cur.Snapshot()
	if !equalJSON(t, got, wantSnap) {
		t.Errorf("old snapshot with the change applied:\n%+v\nwant\n%+v", got, wantSnap)
	}

	moved := cur.clone()
	moved.addrs = append(slices.Clone(cur.addrs), Address{Interface: "eth1", Prefix: netip.MustParsePrefix("10.0.0.1/24"), Up: true})
	if c := Change(cur, moved); c == nil || !slices.Equal(c.Changed, []string{trace.PartAddresses}) {
		t.Errorf("an address added: %+v", c)
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}
