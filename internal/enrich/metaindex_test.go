package enrich

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/meta"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/tests/vm/guest"
)

// churnIndex answers every address with a pod of its own, as a cluster
// whose pods come and go names ever new ones.
type churnIndex struct{ meta.Index }

func (churnIndex) PodByIP(a netip.Addr, _ time.Time) (meta.PodInfo, bool) {
	return meta.PodInfo{Namespace: "jobs", Name: "job-" + a.String(), Node: "node-of-" + a.String()}, true
}

func churnAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

// The memo of pods named stays bounded however many pods a long trace
// names, and still answers for the recent ones.
func TestIndexMetadataForgetsOldPods(t *testing.T) {
	guest.SkipKernelIndependent(t)
	m := NewIndexMetadata(churnIndex{})
	const named = 10 * memoLimit
	for i := range named {
		if _, ok := m.PodByIP(churnAddr(i), time.Time{}); !ok {
			t.Fatal("no pod")
		}
	}
	if n := len(m.podNode.cur) + len(m.podNode.old); n > 2*memoLimit {
		t.Errorf("after %d pods named the memo holds %d, over %d", named, n, 2*memoLimit)
	}
	recent := named - memoLimit/2
	ref := trace.PodRef{Namespace: "jobs", Name: fmt.Sprint("job-", churnAddr(recent))}
	if got, want := m.PodNode(ref), "node-of-"+churnAddr(recent).String(); got != want {
		t.Errorf("node of a recent pod %q, want %q", got, want)
	}
}
