package enrich

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/meta"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TimelineMetadata is the Metadata of a whole recorded trace: the
// header's pods and Services, then each recorded change from its time on.
// A lookup at a time answers with what the tracer's index held then, as
// the live index answered: one structure for the trace, however often the
// cluster changed, instead of one snapshot per change.
type TimelineMetadata struct {
	pods     []podSpan
	podsByIP map[netip.Addr][]int
	podByRef map[trace.PodRef]int // the latest span of each pod
	svcs     []svcSpan
	svcIndex serviceIndex
	svcByRef map[trace.ObjectRef]int // the latest span of each Service
}

var _ Metadata = (*TimelineMetadata)(nil)

// span is when an object held its addresses: from (zero: before the
// trace) until (zero: to its end).
type span struct{ from, until time.Time }

func (s span) holds(at time.Time) bool {
	return (s.from.IsZero() || !s.from.After(at)) && (s.until.IsZero() || s.until.After(at))
}

type podSpan struct {
	span
	pod trace.Pod
}

type svcSpan struct {
	span
	svc trace.Service
}

// NewTimelineMetadata indexes the header's pods and Services and the
// metadata deltas of changes, which come in the order recorded.
func NewTimelineMetadata(header *trace.Snapshot, changes []*trace.StateChange) *TimelineMetadata {
	m := &TimelineMetadata{podsByIP: map[netip.Addr][]int{}, podByRef: map[trace.PodRef]int{},
		svcIndex: newServiceIndex(), svcByRef: map[trace.ObjectRef]int{}}
	openPod := map[trace.ObjectRef]int{}
	openSvc := map[trace.ObjectRef]int{}
	if header != nil {
		for _, p := range header.Pods {
			m.addPod(openPod, p, time.Time{})
		}
		for _, s := range header.Services {
			m.addService(openSvc, s, time.Time{})
		}
	}
	for _, c := range changes {
		d := c.Metadata
		if d == nil {
			continue
		}
		for _, p := range d.Pods {
			m.addPod(openPod, p, c.Time)
		}
		for _, r := range d.PodsGone {
			if i, ok := openPod[r]; ok && r.Deleted.IsZero() {
				m.pods[i].until = c.Time
				delete(openPod, r)
			}
		}
		for _, s := range d.Services {
			m.addService(openSvc, s, c.Time)
		}
		for _, r := range d.ServicesGone {
			if i, ok := openSvc[r]; ok {
				m.svcs[i].until = c.Time
				delete(openSvc, r)
			}
		}
	}
	return m
}

// addPod records p from at: a deleted pod ends its live span at its
// deletion; a live one replaces its open span unless nothing changed.
func (m *TimelineMetadata) addPod(open map[trace.ObjectRef]int, p trace.Pod, at time.Time) {
	live := trace.ObjectRef{Namespace: p.Namespace, Name: p.Name}
	if !p.Deleted.IsZero() && at.IsZero() {
		// A deleted pod the header still kept, beside a live one of its
		// name if it was recreated: a span of its own.
		m.indexPod(podSpan{span{until: p.Deleted}, p})
		return
	}
	i, isOpen := open[live]
	if !p.Deleted.IsZero() {
		if isOpen {
			m.pods[i].until = p.Deleted
			delete(open, live)
		}
		return
	}
	if isOpen {
		if reflect.DeepEqual(m.pods[i].pod, p) {
			return
		}
		m.pods[i].until = at
	}
	open[live] = m.indexPod(podSpan{span{from: at}, p})
}

func (m *TimelineMetadata) indexPod(s podSpan) int {
	i := len(m.pods)
	m.pods = append(m.pods, s)
	m.podByRef[trace.PodRef{Namespace: s.pod.Namespace, Name: s.pod.Name}] = i
	if !s.pod.HostNetwork {
		for _, ip := range s.pod.IPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				m.podsByIP[a] = append(m.podsByIP[a], i)
			}
		}
	}
	return i
}

func (m *TimelineMetadata) addService(open map[trace.ObjectRef]int, s trace.Service, at time.Time) {
	ref := s.Ref()
	if i, ok := open[ref]; ok {
		if reflect.DeepEqual(m.svcs[i].svc, s) {
			return
		}
		m.svcs[i].until = at
	}
	i := len(m.svcs)
	m.svcs = append(m.svcs, svcSpan{span{from: at}, s})
	open[ref], m.svcByRef[ref] = i, i
	m.svcIndex.add(i, &s)
}

// PodByIP is the pod that held a at at, with the live index's
// allowances (meta.CreatedSkew: a pod has its IP before the API server
// says so; meta.HandOver): of two, the one since deleted
// held it then (an address is handed on only once its pod is gone), else
// the one taken latest; between two pods (the last gone just before at,
// the next taken after it), the last one, as the live index answers.
func (m *TimelineMetadata) PodByIP(a netip.Addr, at time.Time) (trace.PodRef, bool) {
	best, last := -1, -1
	for _, i := range m.podsByIP[a.Unmap()] {
		s := m.pods[i].span
		if !s.until.IsZero() && !s.until.After(at) {
			if at.Sub(s.until) < meta.HandOver && (last < 0 || s.until.After(m.pods[last].until)) {
				last = i
			}
			continue
		}
		if !s.from.IsZero() && s.from.After(at.Add(meta.CreatedSkew)) {
			continue
		}
		if best < 0 || betterSpan(s, m.pods[best].span, at) {
			best = i
		}
	}
	if best < 0 {
		return trace.PodRef{}, false
	}
	if last >= 0 && m.pods[best].from.After(at) {
		best = last
	}
	p := m.pods[best].pod
	return trace.PodRef{Namespace: p.Namespace, Name: p.Name}, true
}

// betterSpan: of two spans that may hold an address at at, one that does
// beats one taken only after it; of two that do, one that ended later
// beats one still open, and otherwise the later taken; of two taken only
// after at (the index learns of a pod after it has its address), the
// first taken.
func betterSpan(s, than span, at time.Time) bool {
	if s.holds(at) != than.holds(at) {
		return s.holds(at)
	}
	if !s.holds(at) {
		return s.from.Before(than.from)
	}
	if (s.until.IsZero()) != (than.until.IsZero()) {
		return !s.until.IsZero()
	}
	return s.from.After(than.from)
}

func (m *TimelineMetadata) PodNode(ref trace.PodRef) string {
	if i, ok := m.podByRef[ref]; ok {
		return m.pods[i].pod.Node
	}
	return ""
}

// ServiceByAddr is the Service a client reached at a:port at at, matched
// as SnapshotMetadata matches.
func (m *TimelineMetadata) ServiceByAddr(a netip.Addr, port uint16, proto string, nodeAddr bool, at time.Time) (trace.ServiceRef, bool) {
	return m.svcIndex.find(a.Unmap(), port, proto, nodeAddr, func(i int) *trace.Service {
		if !m.svcs[i].holds(at) {
			return nil
		}
		return &m.svcs[i].svc
	})
}

// Service is the Service as last recorded.
func (m *TimelineMetadata) Service(ref trace.ServiceRef) (trace.Service, bool) {
	if i, ok := m.svcByRef[trace.ObjectRef{Namespace: ref.Namespace, Name: ref.Name}]; ok {
		return m.svcs[i].svc, true
	}
	return trace.Service{}, false
}

// HostNetworkPod is a hostNetwork pod on node declaring the port, as last
// recorded.
func (m *TimelineMetadata) HostNetworkPod(proto string, port uint16, node string) (trace.PodRef, bool) {
	want := strings.ToLower(proto) + "/" + itoa(port)
	for i := len(m.pods) - 1; i >= 0; i-- {
		p := m.pods[i].pod
		if p.HostNetwork && p.Node == node && m.pods[i].until.IsZero() && slices.Contains(p.HostPorts, want) {
			return trace.PodRef{Namespace: p.Namespace, Name: p.Name}, true
		}
	}
	return trace.PodRef{}, false
}
