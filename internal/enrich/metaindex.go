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
// those answers named, so they are remembered here.
type IndexMetadata struct {
	idx      meta.Index
	mu       sync.Mutex
	podNode  map[trace.PodRef]string
	services map[trace.ServiceRef]trace.Service
}

var _ Metadata = (*IndexMetadata)(nil)

// NewIndexMetadata wraps a metadata index.
func NewIndexMetadata(idx meta.Index) *IndexMetadata {
	return &IndexMetadata{idx: idx, podNode: map[trace.PodRef]string{}, services: map[trace.ServiceRef]trace.Service{}}
}

func (m *IndexMetadata) PodByIP(a netip.Addr, at time.Time) (trace.PodRef, bool) {
	p, ok := m.idx.PodByIP(a, at)
	if !ok {
		return trace.PodRef{}, false
	}
	ref := p.Ref()
	m.mu.Lock()
	m.podNode[ref] = p.Node
	m.mu.Unlock()
	return ref, true
}

func (m *IndexMetadata) PodNode(p trace.PodRef) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.podNode[p]
}

func (m *IndexMetadata) ServiceByAddr(a netip.Addr, port uint16, proto string, nodeAddr bool) (trace.ServiceRef, bool) {
	s, sp, ok := m.idx.ServiceByAddr(a, port, proto, nodeAddr)
	var ref trace.ServiceRef
	if ok {
		ref = s.Ref(sp)
	} else if s, ok = m.idx.ServiceByIP(a); ok {
		// The address is the Service's even where the port is not one of
		// its own (a ping to a ClusterIP, an LB port that belongs elsewhere).
		ref = trace.ServiceRef{Namespace: s.Namespace, Name: s.Name}
	} else {
		return trace.ServiceRef{}, false
	}
	m.mu.Lock()
	m.services[trace.ServiceRef{Namespace: ref.Namespace, Name: ref.Name}] = s.Trace()
	m.mu.Unlock()
	return ref, true
}

func (m *IndexMetadata) Service(ref trace.ServiceRef) (trace.Service, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.services[trace.ServiceRef{Namespace: ref.Namespace, Name: ref.Name}]
	return s, ok
}

func (m *IndexMetadata) HostNetworkPod(proto string, port uint16, node string) (trace.PodRef, bool) {
	p, ok := m.idx.HostNetworkPod(proto, port, node)
	if !ok {
		return trace.PodRef{}, false
	}
	return p.Ref(), true
}
