package enrich

import (
	"sync"

	"github.com/tracer-dev/tracer/internal/trace"
)

// nameCache hands out one shared copy of each pod and Service name, and of
// each rule with its owner's pod set, so that a flow's names point at
// values many flows share instead of costing each flow an allocation (and
// the UI's store their bytes a flow). Nothing it hands out is ever
// written: a flow's names are replaced, never changed.
type nameCache struct {
	mu    sync.Mutex
	pods  map[trace.PodRef]*trace.PodRef
	svcs  map[trace.ServiceRef]*trace.ServiceRef
	owned map[ownedRuleKey]*trace.Rule
}

// nameCacheSize bounds each map; a full map starts over, which costs the
// flows after it a copy each again, never a wrong name.
const nameCacheSize = 16384

// ownedRuleKey is a rule as attributed (shared by the flows the
// attribution cache answered) and the pod that owns the flow's DNAT
// target, both shared copies.
type ownedRuleKey struct {
	rule *trace.Rule
	pod  *trace.PodRef
}

func newNameCache() *nameCache {
	return &nameCache{pods: map[trace.PodRef]*trace.PodRef{}, svcs: map[trace.ServiceRef]*trace.ServiceRef{},
		owned: map[ownedRuleKey]*trace.Rule{}}
}

// flowNames are what names found for a flow; a false ok is not found.
type flowNames struct {
	src, dst, owner       trace.PodRef
	svc                   trace.ServiceRef
	srcOK, dstOK, ownerOK bool
	svcOK                 bool
}

// set points f's names at the shared copies of n.
func (c *nameCache) set(f *trace.Flow, n *flowNames) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n.srcOK {
		f.SrcPod = c.pod(n.src)
	}
	if n.dstOK {
		f.DstPod = c.pod(n.dst)
	}
	if n.svcOK {
		f.Service = shared(c.svcs, n.svc)
	}
	if n.ownerOK {
		f.Rule = c.ownedRule(f.Rule, c.pod(n.owner))
	}
}

func (c *nameCache) pod(p trace.PodRef) *trace.PodRef { return shared(c.pods, p) }

// ownedRule is r with its owner's pod set to pod.
func (c *nameCache) ownedRule(r *trace.Rule, pod *trace.PodRef) *trace.Rule {
	k := ownedRuleKey{rule: r, pod: pod}
	if owned, ok := c.owned[k]; ok {
		return owned
	}
	if len(c.owned) >= nameCacheSize {
		clear(c.owned)
	}
	owned := withOwnerPod(r, pod)
	c.owned[k] = owned
	return owned
}

// shared is m's copy of v, made when it has none.
func shared[T comparable](m map[T]*T, v T) *T {
	if p, ok := m[v]; ok {
		return p
	}
	if len(m) >= nameCacheSize {
		clear(m)
	}
	// A copy made here, not &v: taking v's address would put every
	// caller's v on the heap, the hits' too.
	p := new(T)
	*p = v
	m[v] = p
	return p
}

// setOwn points f's names at a copy of n of its own, for an env without a
// nameCache.
func setOwn(f *trace.Flow, own flowNames) {
	n := &own
	if n.srcOK {
		f.SrcPod = &n.src
	}
	if n.dstOK {
		f.DstPod = &n.dst
	}
	if n.svcOK {
		f.Service = &n.svc
	}
	if n.ownerOK {
		f.Rule = withOwnerPod(f.Rule, &n.owner)
	}
}

// withOwnerPod is a copy of r whose owner's pod is pod. It is a copy since
// r may be shared by the flows the attribution cache answered.
func withOwnerPod(r *trace.Rule, pod *trace.PodRef) *trace.Rule {
	b := &struct {
		rule  trace.Rule
		owner trace.Owner
	}{rule: *r, owner: *r.Owner}
	b.owner.Pod = pod
	b.rule.Owner = &b.owner
	return &b.rule
}
