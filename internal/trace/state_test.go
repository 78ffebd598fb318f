package trace

import (
	"bytes"
	"errors"
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
	} {
		_, err := ReadAll(strings.NewReader(header+bad+"\n"), "t")
		var pe *ParseError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), ":2:") && !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s: %v, want a ParseError at line 2", bad, err)
		}
	}
}
