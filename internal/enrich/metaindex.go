package enrich

import (
	"net/netip"
	"sync"
	"time"

	"github.com/tracer-dev/tracer/internal/meta"
	"github.com/tracer-dev/tracer/internal/trace"
)

// IndexMetadata serves Metadata from the live metadata index. The index
// answers by address; the diagnosis later asks about the pods and Services
// those answers named, so they are remembered here, for a while: a
// cluster's pods come and go, and a tracer running for weeks must not
// remember every pod it ever named.
type IndexMetadata struct {
	idx      meta.Index
	mu       sync.Mutex
	podNode  memo[trace.PodRef, string]
	services memo[trace.ServiceRef, trace.Service]
}

// memoLimit is how many answers a memo's generation holds; a memo holds
// two generations at most.
const memoLimit = 1 << 14

// memo remembers recent answers: once the current generation is full it
// becomes the old one and the one before is forgotten. An answer is asked
// about soon after it was given, by the diagnosis of the same flow.
type memo[K comparable, V any] struct {
	cur, old map[K]V
}

func (m *memo[K, V]) put(k K, v V) {
	if m.cur == nil {
		m.cur = map[K]V{}
	}
	if _, ok := m.cur[k]; !ok && len(m.cur) >= memoLimit {
		m.old, m.cur = m.cur, map[K]V{}
	}
	m.cur[k] = v
}

func (m *memo[K, V]) get(k K) (V, bool) {
	if v, ok := m.cur[k]; ok {
		return v, true
	}
	v, ok := m.old[k]
	return v, ok
}

var _ Metadata = (*IndexMetadata)(nil)

// NewIndexMetadata wraps a metadata index.
func NewIndexMetadata(idx meta.Index) *IndexMetadata {
	return &IndexMetadata{idx: idx}
}

func (m *IndexMetadata) PodByIP(a netip.Addr, at time.Time) (trace.PodRef, bool) {
	p, ok := m.idx.PodByIP(a, at)
	if !ok {
		return trace.PodRef{}, false
	}
	ref := p.Ref()
	m.mu.Lock()
	m.podNode.put(ref, p.Node)
	m.mu.Unlock()
	return ref, true
}

func (m *IndexMetadata) PodNode(p trace.PodRef) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	node, _ := m.podNode.get(p)
	return node
}

func (m *IndexMetadata) ServiceByAddr(a netip.Addr, port uint16, proto string, nodeAddr bool, at time.Time) (trace.ServiceRef, bool) {
	s, sp, ok := m.idx.ServiceByAddr(a, port, proto, nodeAddr, at)
	var ref trace.ServiceRef
	if ok {
		ref = s.Ref(sp)
	} else if s, ok = m.idx.ServiceByIP(a, at); ok {
		// The address is the Service's even where the port is not one of
		// its own (a ping to a ClusterIP, an LB port that belongs elsewhere).
		ref = trace.ServiceRef{Namespace: s.Namespace, Name: s.Name}
	} else {
		return trace.ServiceRef{}, false
	}
	m.mu.Lock()
	m.services.put(trace.ServiceRef{Namespace: ref.Namespace, Name: ref.Name}, s.Trace())
	m.mu.Unlock()
	return ref, true
}

func (m *IndexMetadata) Service(ref trace.ServiceRef) (trace.Service, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.services.get(trace.ServiceRef{Namespace: ref.Namespace, Name: ref.Name})
}

func (m *IndexMetadata) HostNetworkPod(proto string, port uint16, node string) (trace.PodRef, bool) {
	p, ok := m.idx.HostNetworkPod(proto, port, node)
	if !ok {
		return trace.PodRef{}, false
	}
	return p.Ref(), true
}
