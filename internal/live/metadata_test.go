package live

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// The trace records what changed in the pods and Services since what it
// holds, one delta at a time, and nothing when nothing changed.
func TestRecordMetadataDeltas(t *testing.T) {
	var mu sync.Mutex
	pods := []trace.Pod{{Namespace: "a", Name: "db", IPs: []string{"10.0.0.1"}}, {Namespace: "a", Name: "web", IPs: []string{"10.0.0.2"}}}
	svcs := []trace.Service{{Namespace: "a", Name: "db", ClusterIPs: []string{"10.96.0.1"}}}
	s := &states{metadata: func() ([]trace.Pod, []trace.Service) {
		mu.Lock()
		defer mu.Unlock()
		return append([]trace.Pod(nil), pods...), append([]trace.Service(nil), svcs...)
	}}
	header := &trace.Snapshot{}
	header.Pods, header.Services = s.metadata()
	s.recordFrom(nil, header)
	var got []*trace.StateChange
	s.recordTo(func(c *trace.StateChange) { got = append(got, c) })
	defer s.recordTo(nil)

	s.recordMetadata()
	if len(got) != 0 {
		t.Fatalf("nothing changed, yet %d changes were recorded", len(got))
	}
	deleted := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mu.Lock()
	pods[0].Deleted = deleted                                                             // db deleted, kept for late joins
	pods = append(pods, trace.Pod{Namespace: "a", Name: "db", IPs: []string{"10.0.0.9"}}) // and recreated
	svcs = nil
	mu.Unlock()
	s.recordMetadata()
	s.recordMetadata()
	if len(got) != 1 {
		t.Fatalf("one change, recorded %d times", len(got))
	}
	m := got[0].Metadata
	// The live db is replaced by the recreated one; the deleted one is new.
	if len(m.Pods) != 2 || len(m.PodsGone) != 0 || len(m.Services) != 0 || len(m.ServicesGone) != 1 || got[0].Changed[0] != trace.PartMetadata {
		t.Fatalf("delta %+v", m)
	}
	// Replayed, the header and the delta give the index's pods now.
	after := trace.NewTimeline(header)
	after.Add(got[0])
	_, snap := after.At(got[0].Time)
	wantPods, wantSvcs := s.metadata()
	if len(snap.Pods) != len(wantPods) || len(snap.Services) != len(wantSvcs) {
		t.Fatalf("replayed: %d pods, %d services; the index has %d, %d", len(snap.Pods), len(snap.Services), len(wantPods), len(wantSvcs))
	}
	for _, p := range wantPods {
		found := false
		for _, q := range snap.Pods {
			found = found || q.Ref() == p.Ref() && q.IPs[0] == p.IPs[0]
		}
		if !found {
			t.Errorf("replayed state lacks %+v", p)
		}
	}

	// The deleted db's retention ends: it leaves, by its deletion time.
	mu.Lock()
	pods = pods[1:]
	mu.Unlock()
	s.recordMetadata()
	if len(got) != 2 || len(got[1].Metadata.PodsGone) != 1 || got[1].Metadata.PodsGone[0] != (trace.ObjectRef{Namespace: "a", Name: "db", Deleted: deleted}) || len(got[1].Metadata.Pods) != 0 {
		t.Fatalf("retention over: changes %d, last %+v", len(got), got[len(got)-1].Metadata)
	}
}

// Once the writers are gone nothing more is handed to them.
func TestRecordMetadataStops(t *testing.T) {
	gen := 0
	s := &states{metadata: func() ([]trace.Pod, []trace.Service) {
		gen++
		return []trace.Pod{{Namespace: "a", Name: "p", IPs: []string{fmt.Sprintf("10.0.0.%d", gen)}}}, nil
	}}
	s.recordFrom(nil, &trace.Snapshot{})
	calls := 0
	s.recordTo(func(*trace.StateChange) { calls++ })
	s.recordMetadata()
	s.recordTo(nil)
	s.recordMetadata()
	if calls != 1 {
		t.Errorf("%d changes handed on, want 1 (none after the writers went)", calls)
	}
}
