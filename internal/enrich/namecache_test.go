package enrich

import (
	"fmt"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// TestNamesShared: flows of one pod point at one copy of its name, and
// flows whose rule and owner's pod are the same share one copy of the
// rule, while a flow's names stay its own when later flows are named
// differently. That the shared names read as each flow's own is checked
// by TestAttributionCacheMatchesWalk, which names the mix both ways.
func TestNamesShared(t *testing.T) {
	snap := portmapNode(t, "v1.10.0")
	snap.Pods = append(snap.Pods, trace.Pod{Namespace: "web", Name: "client", IPs: []string{"10.88.0.9"}, Node: "node-1"})
	env, err := NewNodeEnv("node-1", snap, NewSnapshotMetadata(snap.Pods, snap.Services))
	if err != nil {
		t.Fatal(err)
	}
	a := enrichOne(t, env, "10.88.0.9:40000", "192.168.0.2:8080", "10.88.0.2:80")
	b := enrichOne(t, env, "10.88.0.9:40001", "192.168.0.2:8080", "10.88.0.2:80")
	other := enrichOne(t, env, "203.0.113.5:40002", "192.168.0.2:8080", "10.88.0.2:80")
	for _, f := range []*trace.Flow{a, b} {
		if f.SrcPod.Key() != "web/client" || f.DstPod.Key() != "web/hp-0" || f.Rule == nil || f.Rule.Owner == nil ||
			f.Rule.Owner.Pod.Key() != "web/hp-0" {
			t.Fatalf("flow from %s: src %s, dst %s, rule %+v", f.Orig.Src, f.SrcPod.Key(), f.DstPod.Key(), f.Rule)
		}
	}
	if a.SrcPod != b.SrcPod || a.DstPod != b.DstPod || a.Rule != b.Rule || a.Rule.Owner.Pod != a.DstPod {
		t.Errorf("two flows of one client and one rule: pods %p %p, %p %p, rules %p %p, owner's pod %p",
			a.SrcPod, b.SrcPod, a.DstPod, b.DstPod, a.Rule, b.Rule, a.Rule.Owner.Pod)
	}
	if other.SrcPod != nil || a.SrcPod.Key() != "web/client" {
		t.Errorf("after a flow from outside: its source pod %s, the first flow's %s", other.SrcPod.Key(), a.SrcPod.Key())
	}
}

// TestNameCacheBounded: a full map starts over, and the names handed out
// before still read what they did.
func TestNameCacheBounded(t *testing.T) {
	c := newNameCache()
	first := make([]*trace.PodRef, 0, nameCacheSize)
	for i := range nameCacheSize + nameCacheSize/2 {
		p := c.pod(trace.PodRef{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)})
		if i < nameCacheSize {
			first = append(first, p)
		}
		if len(c.pods) > nameCacheSize {
			t.Fatalf("%d names kept, the bound is %d", len(c.pods), nameCacheSize)
		}
	}
	for i, p := range first {
		if want := fmt.Sprintf("pod-%d", i); p.Name != want {
			t.Fatalf("name %d reads %s after the map started over", i, p.Name)
		}
	}
	if p := c.pod(trace.PodRef{Namespace: "ns", Name: "pod-0"}); p.Name != "pod-0" {
		t.Errorf("pod-0 named again: %s", p.Name)
	}
}
