package trace

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestStateChangeApply(t *testing.T) {
	base := &Snapshot{
		Rules:     map[string]string{"nat": "A", "filter": "F", "ip6/nat": "6"},
		Ipsets:    "sets",
		Listeners: []Listener{{Proto: "tcp", Address: "0.0.0.0:22"}},
		Pods:      []Pod{{Namespace: "ns", Name: "p"}},
	}
	c := &StateChange{Time: time.Unix(10, 0), Changed: []string{"rules:nat", "rules:ip6/nat", "ipsets", "listeners"},
		Snapshot: Snapshot{Rules: map[string]string{"nat": "B"}}}
	got := c.Apply(base)
	switch {
	case got.Rules["nat"] != "B" || got.Rules["filter"] != "F":
		t.Errorf("rules %v: nat replaced, filter kept", got.Rules)
	case len(got.Rules) != 2:
		t.Errorf("rules %v: a named table the change leaves out is gone", got.Rules)
	case got.Ipsets != "" || got.Listeners != nil:
		t.Errorf("ipsets %q, listeners %v: named and empty in the change, so now empty", got.Ipsets, got.Listeners)
	case len(got.Pods) != 1:
		t.Errorf("pods %v: metadata is the header's", got.Pods)
	}
	if base.Rules["nat"] != "A" || len(base.Rules) != 3 || base.Ipsets != "sets" {
		t.Errorf("Apply changed its base: %+v", base)
	}
}

// A metadata delta replaces pods and Services by namespace and name, adds
// new ones, removes gone ones, keeps the header's order, and leaves the
// base as it was.
func TestStateChangeMetadataDelta(t *testing.T) {
	base := &Snapshot{
		Pods:     []Pod{{Namespace: "a", Name: "db", IPs: []string{"10.0.0.1"}}, {Namespace: "b", Name: "web", IPs: []string{"10.0.0.2"}}},
		Services: []Service{{Namespace: "a", Name: "db", ClusterIPs: []string{"10.96.0.1"}}},
		Ipsets:   "sets",
	}
	c := &StateChange{Time: time.Unix(10, 0), Changed: []string{PartMetadata}, Metadata: &MetadataChange{
		Pods:         []Pod{{Namespace: "b", Name: "web", IPs: []string{"10.0.0.9"}}, {Namespace: "a", Name: "cache", IPs: []string{"10.0.0.3"}}},
		PodsGone:     []ObjectRef{{Namespace: "a", Name: "db"}},
		Services:     []Service{{Namespace: "a", Name: "cache", ClusterIPs: []string{"10.96.0.2"}}},
		ServicesGone: []ObjectRef{{Namespace: "a", Name: "db"}},
	}}
	got := c.Apply(base)
	var pods, svcs []string
	for _, p := range got.Pods {
		pods = append(pods, p.Namespace+"/"+p.Name+"="+strings.Join(p.IPs, ","))
	}
	for _, s := range got.Services {
		svcs = append(svcs, s.Namespace+"/"+s.Name)
	}
	if strings.Join(pods, " ") != "a/cache=10.0.0.3 b/web=10.0.0.9" || strings.Join(svcs, " ") != "a/cache" || got.Ipsets != "sets" {
		t.Errorf("after the delta: pods %v, services %v, ipsets %q", pods, svcs, got.Ipsets)
	}
	if len(base.Pods) != 2 || base.Pods[1].IPs[0] != "10.0.0.2" || len(base.Services) != 1 {
		t.Errorf("Apply changed its base: %+v", base)
	}
}

func TestTimelineAt(t *testing.T) {
	t0 := time.Unix(100, 0)
	tl := NewTimeline(&Snapshot{Ipsets: "0"})
	tl.Add(&StateChange{Time: t0.Add(time.Second), Changed: []string{PartIpsets}, Snapshot: Snapshot{Ipsets: "1"}})
	tl.Add(&StateChange{Time: t0.Add(3 * time.Second), Changed: []string{PartIpsets}, Snapshot: Snapshot{Ipsets: "2"}})
	// Stamped before the change it follows: it counts from that one's time.
	tl.Add(&StateChange{Time: t0.Add(2 * time.Second), Changed: []string{PartIpsets}, Snapshot: Snapshot{Ipsets: "3"}})
	for _, tc := range []struct {
		at   time.Duration
		want string
	}{{-time.Hour, "0"}, {0, "0"}, {time.Second, "1"}, {2 * time.Second, "1"}, {3 * time.Second, "3"}, {time.Hour, "3"}} {
		if _, s := tl.At(t0.Add(tc.at)); s.Ipsets != tc.want {
			t.Errorf("at +%s: state %q, want %q", tc.at, s.Ipsets, tc.want)
		}
	}
}

// State lines round-trip through the writer and reader, are counted in
// the summary, and a malformed one is a ParseError naming the line.
func TestStateLines(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{Started: time.Unix(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	c := &StateChange{Time: time.Unix(5, 0).UTC(), Changed: []string{"rules:nat"}, Snapshot: Snapshot{Rules: map[string]string{"nat": "*nat\nCOMMIT\n"}}}
	if err := w.WriteState(c); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := ReadAll(bytes.NewReader(buf.Bytes()), "t")
	if err != nil {
		t.Fatal(err)
	}
	if len(f.States) != 1 || f.States[0].Snapshot.Rules["nat"] != "*nat\nCOMMIT\n" || !f.States[0].Time.Equal(c.Time) || f.Summary.StateChanges != 1 {
		t.Errorf("read back %+v, summary %+v", f.States, f.Summary)
	}
	header := strings.SplitAfter(buf.String(), "\n")[0]
	for _, bad := range []string{
		`{"type":"state","changed":["ipsets"],"snapshot":{}}`,
		`{"type":"state","time":"2026-01-01T00:00:00Z","changed":[],"snapshot":{}}`,
		`{"type":"state","time":"2026-01-01T00:00:00Z","changed":["routes"],"snapshot":{}}`,
		`{"type":"state","time":"2026-01-01T00:00:00Z","changed":["rules:"],"snapshot":{}}`,
		`{"type":"state","time":"2026-01-01T00:00:00Z","changed":"ipsets","snapshot":{}}`,
		`{"type":"state","time":"2026-01-01T00:00:00Z","changed":["metadata"],"snapshot":{}}`,
		`{"type":"state","time":"2026-01-01T00:00:00Z","changed":["ipsets"],"snapshot":{},"metadata":{"pods_gone":[{"namespace":"a","name":"b"}]}}`,
	} {
		_, err := ReadAll(strings.NewReader(header+bad+"\n"), "t")
		var pe *ParseError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), ":2:") && !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s: %v, want a ParseError at line 2", bad, err)
		}
	}
}

// A pod deleted and recreated under its name (a StatefulSet's) is two
// entries: the deleted one is kept, then leaves, by its deletion time.
func TestStateChangePodRecreated(t *testing.T) {
	gone := time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC)
	live := Pod{Namespace: "db", Name: "mysql-0", IPs: []string{"10.0.0.1"}}
	tomb := live
	tomb.Deleted = gone
	again := Pod{Namespace: "db", Name: "mysql-0", IPs: []string{"10.0.0.7"}}
	tl := NewTimeline(&Snapshot{Pods: []Pod{live}})
	tl.Add(&StateChange{Time: gone, Changed: []string{PartMetadata}, Metadata: &MetadataChange{Pods: []Pod{tomb, again}}})
	tl.Add(&StateChange{Time: gone.Add(time.Minute), Changed: []string{PartMetadata}, Metadata: &MetadataChange{PodsGone: []ObjectRef{tomb.Ref()}}})
	describe := func(i int) string {
		var out []string
		for _, p := range tl.Snapshot(i).Pods {
			out = append(out, fmt.Sprintf("%s deleted=%v", p.IPs[0], !p.Deleted.IsZero()))
		}
		return strings.Join(out, ", ")
	}
	for i, want := range []string{"10.0.0.1 deleted=false", "10.0.0.7 deleted=false, 10.0.0.1 deleted=true", "10.0.0.7 deleted=false"} {
		if got := describe(i); got != want {
			t.Errorf("state %d: %s, want %s", i, got, want)
		}
	}
}

// An export's state log gives the state in force at its first flow and
// the changes after it, and folds what no kept flow needs.
func TestStateLog(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	change := func(sec int) *StateChange {
		return &StateChange{Time: t0.Add(time.Duration(sec) * time.Second), Changed: []string{PartIpsets}, Snapshot: Snapshot{Ipsets: fmt.Sprint(sec)}}
	}
	l := NewStateLog(&Snapshot{Ipsets: "header"})
	l.Add(change(10), time.Time{})
	l.Add(change(20), time.Time{})
	l.Add(change(30), time.Time{})
	for _, tc := range []struct {
		at      int
		base    string
		changes int
	}{{0, "header", 3}, {10, "10", 2}, {25, "20", 1}, {99, "30", 0}} {
		base, rest := l.From(t0.Add(time.Duration(tc.at) * time.Second))
		if base.Ipsets != tc.base || len(rest) != tc.changes {
			t.Errorf("from +%ds: state %q and %d changes, want %q and %d", tc.at, base.Ipsets, len(rest), tc.base, tc.changes)
		}
	}
	// The store now starts at +25 s: the change at +10 is superseded by
	// +20's, in force then, so it is folded; +20 must stay.
	l.Add(change(40), t0.Add(25*time.Second))
	if base, rest := l.From(time.Time{}); base.Ipsets != "10" || len(rest) != 3 {
		t.Errorf("after folding: state %q and %d changes, want \"10\" and 3", base.Ipsets, len(rest))
	}
	if base, _ := l.From(t0.Add(25 * time.Second)); base.Ipsets != "20" {
		t.Errorf("the state in force at +25s is %q after folding, want 20", base.Ipsets)
	}
}

// A line's node change alone: replay keeps the node's states apart from
// the pods and Services.
func TestNodeParts(t *testing.T) {
	meta := &StateChange{Time: time.Unix(1, 0), Changed: []string{PartMetadata, PartWarnings}, Metadata: &MetadataChange{}, Warnings: []string{"w"}}
	if meta.NodeParts() != nil {
		t.Error("a metadata and warnings line changed the node")
	}
	mixed := &StateChange{Time: time.Unix(1, 0), Changed: []string{"rules:nat", PartMetadata}, Metadata: &MetadataChange{}, Snapshot: Snapshot{Rules: map[string]string{"nat": "x"}}}
	n := mixed.NodeParts()
	if n == nil || len(n.Changed) != 1 || n.Changed[0] != "rules:nat" || n.Metadata != nil || n.Snapshot.Rules["nat"] != "x" || len(mixed.Changed) != 2 {
		t.Errorf("node parts %+v of %+v", n, mixed)
	}
}
