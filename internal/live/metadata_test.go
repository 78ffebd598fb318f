package live

import (
	"sync"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// The trace records each change the index tells of, stamped with the time
// the index took it, less what it already holds; and, when recording
// starts, what changed since the header's snapshot.
func TestRecordMetadataChanges(t *testing.T) {
	var mu sync.Mutex
	pods := []trace.Pod{{Namespace: "a", Name: "db", IPs: []string{"10.0.0.1"}}, {Namespace: "a", Name: "web", IPs: []string{"10.0.0.2"}}}
	svcs := []trace.Service{{Namespace: "a", Name: "db", ClusterIPs: []string{"10.96.0.1"}}}
	list := func() ([]trace.Pod, []trace.Service) {
		mu.Lock()
		defer mu.Unlock()
		return append([]trace.Pod(nil), pods...), append([]trace.Service(nil), svcs...)
	}
	// No wake channel: the test drains the queue itself, no goroutine
	// races it.
	s := &states{metadata: list}
	header := &trace.Snapshot{}
	header.Pods, header.Services = list()
	s.recordFrom(nil, header)

	// Between the header and the recording: web's IP changes.
	mu.Lock()
	pods[1].IPs = []string{"10.0.0.3"}
	mu.Unlock()
	var got []*trace.StateChange
	s.recordTo(func(c *trace.StateChange) { got = append(got, c) })
	defer s.recordTo(nil)
	if len(got) != 1 || len(got[0].Metadata.Pods) != 1 || got[0].Metadata.Pods[0].IPs[0] != "10.0.0.3" {
		t.Fatalf("the change since the header: %d lines, first %+v", len(got), got)
	}

	// db is deleted, kept for late joins, and recreated on its IP; the
	// index tells of each change. A resync of web changes nothing.
	t0 := time.Now().UTC().Add(time.Hour) // after the line above, stamped now
	tomb := trace.Pod{Namespace: "a", Name: "db", IPs: []string{"10.0.0.1"}, Deleted: t0}
	again := trace.Pod{Namespace: "a", Name: "db", IPs: []string{"10.0.0.1"}}
	s.metadataChanged(t0, &trace.MetadataChange{PodsGone: []trace.ObjectRef{{Namespace: "a", Name: "db"}}, Pods: []trace.Pod{tomb}})
	s.metadataChanged(t0.Add(time.Second), &trace.MetadataChange{Pods: []trace.Pod{again}})
	s.metadataChanged(t0.Add(2*time.Second), &trace.MetadataChange{Pods: []trace.Pod{{Namespace: "a", Name: "web", IPs: []string{"10.0.0.3"}}}})
	s.metadataChanged(t0.Add(3*time.Second), &trace.MetadataChange{ServicesGone: []trace.ObjectRef{{Namespace: "a", Name: "db"}}})
	s.recordMetadata()
	if len(got) != 4 {
		t.Fatalf("%d state lines, want 4: the header's delta, the deletion, the recreation, the Service gone (the resync none)", len(got))
	}
	for i, want := range []time.Time{t0, t0.Add(time.Second), t0.Add(3 * time.Second)} {
		if !got[i+1].Time.Equal(want) {
			t.Errorf("line %d at %s, want the index's time %s", i+2, got[i+1].Time, want)
		}
	}
	tl := trace.NewTimeline(header)
	for _, c := range got {
		tl.Add(c)
	}
	_, snap := tl.At(t0.Add(time.Hour))
	if len(snap.Pods) != 3 || len(snap.Services) != 0 {
		t.Errorf("replayed: pods %+v, services %+v; want db recreated, db deleted, web, and no Service", snap.Pods, snap.Services)
	}
	_, before := tl.At(t0.Add(500 * time.Millisecond))
	if len(before.Pods) != 2 || !before.Pods[0].Deleted.Equal(t0) {
		t.Errorf("between the deletion and the recreation: %+v", before.Pods)
	}
}

// The writers get what was queued before they go, and nothing after.
func TestRecordMetadataStops(t *testing.T) {
	s := &states{metadata: func() ([]trace.Pod, []trace.Service) { return nil, nil }}
	s.recordFrom(nil, &trace.Snapshot{})
	calls := 0
	s.recordTo(func(*trace.StateChange) { calls++ })
	s.metadataChanged(time.Now().Add(time.Second), &trace.MetadataChange{Pods: []trace.Pod{{Namespace: "a", Name: "p"}}})
	s.recordTo(nil) // still owed the queued change: written before the sink goes
	s.metadataChanged(time.Now(), &trace.MetadataChange{Pods: []trace.Pod{{Namespace: "a", Name: "q"}}})
	s.recordMetadata()
	if calls != 1 || len(s.pending) != 0 {
		t.Errorf("%d changes handed on, %d queued; want 1 and none after the writers went", calls, len(s.pending))
	}
}
