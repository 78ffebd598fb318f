package enrich

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// A trace's pods and Services over time: a lookup answers with what was
// in force at its time, as the live index did.
func TestTimelineMetadata(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	at := func(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }
	ip := netip.MustParseAddr("10.244.1.5")
	vip := netip.MustParseAddr("10.96.50.1")
	dbA := trace.Pod{Namespace: "db", Name: "db-a", IPs: []string{"10.244.1.5"}, Node: "n1"}
	gone := dbA
	gone.Deleted = at(10)
	dbB := trace.Pod{Namespace: "db", Name: "db-b", IPs: []string{"10.244.1.5"}, Node: "n2"}
	svc := trace.Service{Namespace: "db", Name: "db", ClusterIPs: []string{"10.96.50.1"}, Ports: []trace.ServicePort{{Name: "mysql", Proto: "tcp", Port: 3306}}}
	header := &trace.Snapshot{Pods: []trace.Pod{dbA}, Services: []trace.Service{svc}}
	change := func(sec float64, d *trace.MetadataChange) *trace.StateChange {
		return &trace.StateChange{Time: at(sec), Changed: []string{trace.PartMetadata}, Metadata: d}
	}
	m := NewTimelineMetadata(header, []*trace.StateChange{
		change(10, &trace.MetadataChange{PodsGone: []trace.ObjectRef{{Namespace: "db", Name: "db-a"}}, Pods: []trace.Pod{gone}}),
		change(10.2, &trace.MetadataChange{Pods: []trace.Pod{dbB}}),
		change(20, &trace.MetadataChange{ServicesGone: []trace.ObjectRef{{Namespace: "db", Name: "db"}}}),
		change(25, &trace.MetadataChange{PodsGone: []trace.ObjectRef{gone.Ref()}}), // retention over
	})
	for _, tc := range []struct {
		sec  float64
		want string
	}{{-100, "db-a"}, {9.9, "db-a"}, {10.1, "db-a"}, {10.3, "db-b"}, {30, "db-b"}} {
		if p, ok := m.PodByIP(ip, at(tc.sec)); !ok || p.Name != tc.want {
			t.Errorf("PodByIP at +%vs = %v (found %v), want %s", tc.sec, p, ok, tc.want)
		}
	}
	// Between two pods: within podHandOver of db-a's deletion the
	// address is still db-a's (db-b, taken later, cannot be placed
	// before); longer after, a connection made before the next pod was
	// taken (it had its IP before the API server said so) names it, not
	// a later one.
	dbC := trace.Pod{Namespace: "db", Name: "db-c", IPs: []string{"10.244.1.5"}}
	dbD := trace.Pod{Namespace: "db", Name: "db-d", IPs: []string{"10.244.1.5"}}
	later := NewTimelineMetadata(header, []*trace.StateChange{
		change(10, &trace.MetadataChange{PodsGone: []trace.ObjectRef{{Namespace: "db", Name: "db-a"}}, Pods: []trace.Pod{gone}}),
		change(12, &trace.MetadataChange{Pods: []trace.Pod{dbB}}),
		change(15, &trace.MetadataChange{PodsGone: []trace.ObjectRef{{Namespace: "db", Name: "db-b"}}}),
		change(17, &trace.MetadataChange{Pods: []trace.Pod{dbC}}),
		change(20, &trace.MetadataChange{PodsGone: []trace.ObjectRef{{Namespace: "db", Name: "db-c"}}}),
		change(22, &trace.MetadataChange{Pods: []trace.Pod{dbD}}),
	})
	for _, tc := range []struct {
		sec  float64
		want string
	}{{10.05, "db-a"}, {11.5, "db-b"}, {15.5, "db-b"}, {16.5, "db-c"}} {
		if p, ok := later.PodByIP(ip, at(tc.sec)); !ok || p.Name != tc.want {
			t.Errorf("between two pods at +%vs: %v, %v; want %s", tc.sec, p, ok, tc.want)
		}
	}
	for _, tc := range []struct {
		sec  float64
		want bool
	}{{5, true}, {19.9, true}, {20, false}, {30, false}} {
		s, ok := m.ServiceByAddr(vip, 3306, "tcp", false, at(tc.sec))
		if ok != tc.want || ok && (s.Name != "db" || s.Port != "mysql") {
			t.Errorf("ServiceByAddr at +%vs = %+v, %v; want found %v", tc.sec, s, ok, tc.want)
		}
	}
	if m.PodNode(trace.PodRef{Namespace: "db", Name: "db-b"}) != "n2" {
		t.Error("PodNode of db-b")
	}
	// A header that keeps a recreated pod's deleted self beside it (as
	// the live index's snapshot lists them: live first) names each on its
	// own address and time.
	old := trace.Pod{Namespace: "db", Name: "db-0", IPs: []string{"10.244.1.9"}, Deleted: at(5)}
	again := trace.Pod{Namespace: "db", Name: "db-0", IPs: []string{"10.244.1.10"}}
	hm := NewTimelineMetadata(&trace.Snapshot{Pods: []trace.Pod{again, old}}, nil)
	if p, ok := hm.PodByIP(netip.MustParseAddr("10.244.1.9"), at(1)); !ok || p.Name != "db-0" {
		t.Errorf("the recreated pod's old address before its deletion: %v, %v", p, ok)
	}
	if p, ok := hm.PodByIP(netip.MustParseAddr("10.244.1.10"), at(9)); !ok || p.Name != "db-0" {
		t.Errorf("the recreated pod's new address: %v, %v", p, ok)
	}

	// The same trace replayed against its header alone names the old pod.
	if p, _ := NewSnapshotMetadata(header.Pods, header.Services).PodByIP(ip, at(30)); p.Name != "db-a" {
		t.Errorf("the header alone: %v", p)
	}
}
