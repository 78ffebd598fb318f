package enrich

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// An address reused by a new pod while the deleted one is still kept
// names the live pod, as the live index does, whatever the order listed.
func TestSnapshotMetadataPrefersLivePod(t *testing.T) {
	deleted := trace.Pod{Namespace: "a", Name: "old", IPs: []string{"10.0.0.1"}, Deleted: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	live := trace.Pod{Namespace: "a", Name: "new", IPs: []string{"10.0.0.1"}}
	for _, pods := range [][]trace.Pod{{deleted, live}, {live, deleted}} {
		ref, ok := NewSnapshotMetadata(pods, nil).PodByIP(netip.MustParseAddr("10.0.0.1"), time.Time{})
		if !ok || ref.Name != "new" {
			t.Errorf("listed %s then %s: 10.0.0.1 is %v (found %v), want a/new", pods[0].Name, pods[1].Name, ref, ok)
		}
	}
}
