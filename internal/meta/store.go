package meta

import (
	"cmp"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// DefaultRetention is how long a deleted pod still answers PodByIP: events
// are joined with metadata after the fact, and a connection's pod may be gone
// by the time its reset or drop is explained.
const DefaultRetention = 10 * time.Minute

// CreatedSkew is how much later than an event a pod may have been created
// and still own the event's address: creation times come from the API
// server's clock, event times from this node's.
const CreatedSkew = 30 * time.Second

// store is the index every source fills. Stored *PodInfo and *ServiceInfo
// are never modified after insertion (an update replaces the pointer), so
// queries can return copies without copying their slices.
type store struct {
	mu        sync.RWMutex
	retention time.Duration
	now       func() time.Time

	pods      map[string]*PodInfo         // live pods by namespace/name
	byIP      map[netip.Addr][]*PodInfo   // live pods and tombstones
	tombs     []*PodInfo                  // deleted pods, oldest deletion first
	hostPorts map[hostPortKey][]*PodInfo  // live pods only
	services  map[ServiceRef]*ServiceInfo // by namespace/name
	svcByIP   map[netip.Addr][]*ServiceInfo
	// svcTombs are deleted Services, oldest deletion first, kept for
	// lookups of connections made before their deletion.
	svcTombs  []deletedService
	nodePorts map[protoPort][]svcPort
	slices    map[string]*sliceInfo                // by namespace/name of the slice
	bySvc     map[ServiceRef]map[string]*sliceInfo // slices of a Service
	onChange  func(time.Time, *trace.MetadataChange)
}

// deletedService is a Service and when the index saw it deleted.
type deletedService struct {
	svc     *ServiceInfo
	deleted time.Time
}

// OnChange implements Index.
func (s *store) OnChange(fn func(time.Time, *trace.MetadataChange)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onChange = fn
}

// changedLocked tells OnChange's function what changed in what Snapshot
// lists.
func (s *store) changedLocked(d *trace.MetadataChange) {
	if s.onChange != nil {
		s.onChange(s.now(), d)
	}
}

type hostPortKey struct {
	node  string
	proto string
	port  uint16
}

type protoPort struct {
	proto string
	port  uint16
}

type svcPort struct {
	svc  *ServiceInfo
	port int // index into svc.Ports
}

// sliceInfo is what an EndpointSlice contributes: the ready endpoints of one
// Service.
type sliceInfo struct {
	key       string
	svc       ServiceRef
	endpoints []Endpoint
}

func newStore(retention time.Duration, now func() time.Time) *store {
	if retention <= 0 {
		retention = DefaultRetention
	}
	if now == nil {
		now = time.Now
	}
	return &store{
		retention: retention,
		now:       now,
		pods:      map[string]*PodInfo{},
		byIP:      map[netip.Addr][]*PodInfo{},
		hostPorts: map[hostPortKey][]*PodInfo{},
		services:  map[ServiceRef]*ServiceInfo{},
		svcByIP:   map[netip.Addr][]*ServiceInfo{},
		nodePorts: map[protoPort][]svcPort{},
		slices:    map[string]*sliceInfo{},
		bySvc:     map[ServiceRef]map[string]*sliceInfo{},
	}
}

// upsertPod adds a pod or replaces the stored state of the pod with its name.
func (s *store) upsertPod(p *PodInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := p.Key()
	p.Seen = s.now()
	if old := s.pods[key]; old != nil {
		s.unindexLivePod(old)
		if slices.Equal(old.IPs, p.IPs) {
			p.Seen = old.Seen
		}
	}
	s.pods[key] = p
	s.changedLocked(&trace.MetadataChange{Pods: []trace.Pod{tracePod(p)}})
	if !p.HostNetwork {
		for _, a := range p.IPs {
			s.byIP[a] = append(s.byIP[a], p)
		}
	}
	for _, hp := range p.HostPorts {
		k := hostPortKey{node: p.Node, proto: hp.Proto, port: hp.HostPort}
		if !slices.Contains(s.hostPorts[k], p) {
			s.hostPorts[k] = append(s.hostPorts[k], p)
		}
	}
	s.pruneLocked()
}

// deletePod turns the live pod into a tombstone that PodByIP keeps finding
// for events older than its deletion.
func (s *store) deletePod(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := namespace + "/" + name
	old := s.pods[key]
	if old == nil {
		return
	}
	s.unindexLivePod(old)
	delete(s.pods, key)
	d := &trace.MetadataChange{PodsGone: []trace.ObjectRef{{Namespace: namespace, Name: name}}}
	tomb := *old
	tomb.Deleted = s.now()
	if !tomb.HostNetwork && len(tomb.IPs) > 0 {
		for _, a := range tomb.IPs {
			s.byIP[a] = append(s.byIP[a], &tomb)
		}
		s.tombs = append(s.tombs, &tomb)
		d.Pods = []trace.Pod{tracePod(&tomb)}
	}
	s.changedLocked(d)
	s.pruneLocked()
}

// unindexLivePod removes p from byIP and hostPorts (not from pods).
func (s *store) unindexLivePod(p *PodInfo) {
	for _, a := range p.IPs {
		s.removeIP(a, p)
	}
	for _, hp := range p.HostPorts {
		k := hostPortKey{node: p.Node, proto: hp.Proto, port: hp.HostPort}
		l := slices.DeleteFunc(s.hostPorts[k], func(q *PodInfo) bool { return q == p })
		if len(l) == 0 {
			delete(s.hostPorts, k)
		} else {
			s.hostPorts[k] = l
		}
	}
}

func (s *store) removeIP(a netip.Addr, p *PodInfo) {
	l := slices.DeleteFunc(s.byIP[a], func(q *PodInfo) bool { return q == p })
	if len(l) == 0 {
		delete(s.byIP, a)
	} else {
		s.byIP[a] = l
	}
}

// pruneLocked forgets tombstones older than the retention period. It runs on
// every pod change, which bounds memory by the cluster's churn.
func (s *store) pruneLocked() {
	cut := s.now().Add(-s.retention)
	n := 0
	var gone []trace.ObjectRef
	for n < len(s.tombs) && s.tombs[n].Deleted.Before(cut) {
		for _, a := range s.tombs[n].IPs {
			s.removeIP(a, s.tombs[n])
		}
		gone = append(gone, trace.ObjectRef{Namespace: s.tombs[n].Namespace, Name: s.tombs[n].Name, Deleted: s.tombs[n].Deleted.UTC()})
		n++
	}
	if n > 0 {
		s.tombs = slices.Delete(s.tombs, 0, n)
		s.changedLocked(&trace.MetadataChange{PodsGone: gone})
	}
}

func (s *store) upsertService(svc *ServiceInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := svc.Key()
	if old := s.services[key]; old != nil {
		s.unindexService(old)
	}
	s.services[key] = svc
	s.changedLocked(&trace.MetadataChange{Services: []trace.Service{traceService(svc)}})
	for _, a := range serviceIPs(svc) {
		l := s.svcByIP[a]
		if slices.Contains(l, svc) {
			continue // the same IP listed twice (clusterIP and externalIP)
		}
		l = append(l, svc)
		// Sorted, so a shared externalIP resolves the same way every time.
		slices.SortFunc(l, func(x, y *ServiceInfo) int {
			return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
		})
		s.svcByIP[a] = l
	}
	for i, p := range svc.Ports {
		if p.NodePort != 0 {
			k := protoPort{proto: p.Proto, port: p.NodePort}
			s.nodePorts[k] = append(s.nodePorts[k], svcPort{svc: svc, port: i})
		}
	}
}

func (s *store) deleteService(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := ServiceRef{Namespace: namespace, Name: name}
	if old := s.services[key]; old != nil {
		s.unindexService(old)
		delete(s.services, key)
		now := s.now()
		s.svcTombs = append(s.svcTombs, deletedService{svc: old, deleted: now})
		n := 0
		for n < len(s.svcTombs) && s.svcTombs[n].deleted.Before(now.Add(-s.retention)) {
			n++
		}
		s.svcTombs = slices.Delete(s.svcTombs, 0, n)
		s.changedLocked(&trace.MetadataChange{ServicesGone: []trace.ObjectRef{{Namespace: namespace, Name: name}}})
	}
}

func (s *store) unindexService(svc *ServiceInfo) {
	for _, a := range serviceIPs(svc) {
		l := slices.DeleteFunc(s.svcByIP[a], func(q *ServiceInfo) bool { return q == svc })
		if len(l) == 0 {
			delete(s.svcByIP, a)
		} else {
			s.svcByIP[a] = l
		}
	}
	for _, p := range svc.Ports {
		if p.NodePort == 0 {
			continue
		}
		k := protoPort{proto: p.Proto, port: p.NodePort}
		l := slices.DeleteFunc(s.nodePorts[k], func(q svcPort) bool { return q.svc == svc })
		if len(l) == 0 {
			delete(s.nodePorts, k)
		} else {
			s.nodePorts[k] = l
		}
	}
}

// serviceIPs is every address a client can address the Service by, apart
// from node addresses.
func serviceIPs(svc *ServiceInfo) []netip.Addr {
	out := make([]netip.Addr, 0, len(svc.ClusterIPs)+len(svc.ExternalIPs)+len(svc.LBIngress))
	out = append(out, svc.ClusterIPs...)
	out = append(out, svc.ExternalIPs...)
	for _, in := range svc.LBIngress {
		if in.IP.IsValid() {
			out = append(out, in.IP)
		}
	}
	return out
}

func (s *store) upsertSlice(si *sliceInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteSliceLocked(si.key)
	s.slices[si.key] = si
	m := s.bySvc[si.svc]
	if m == nil {
		m = map[string]*sliceInfo{}
		s.bySvc[si.svc] = m
	}
	m[si.key] = si
}

func (s *store) deleteSlice(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteSliceLocked(key)
}

func (s *store) deleteSliceLocked(key string) {
	old := s.slices[key]
	if old == nil {
		return
	}
	delete(s.slices, key)
	if m := s.bySvc[old.svc]; m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(s.bySvc, old.svc)
		}
	}
}

// PodByIP implements Index.
func (s *store) PodByIP(a netip.Addr, at time.Time) (PodInfo, bool) {
	a = a.Unmap()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if at.IsZero() {
		at = s.now()
	}
	var best, last *PodInfo
	for _, p := range s.byIP[a] {
		if gone := p.gone(); !gone.IsZero() && !gone.After(at) {
			if at.Sub(gone) < HandOver && (last == nil || gone.After(last.gone())) {
				last = p
			}
			continue // gone before the event
		}
		if p.Created.After(at.Add(CreatedSkew)) {
			continue // created after the event
		}
		if best == nil || betterAt(p, best, at) {
			best = p
		}
	}
	if best == nil {
		return PodInfo{}, false
	}
	if last != nil && best.Seen.After(at) {
		// The address was between pods: the last one was gone just
		// before, the next one is only known from after. Name the one
		// that held it (a pod deleted by force may still answer); the
		// next one's creationTimestamp, in whole seconds, cannot say it
		// came first.
		return *last, true
	}
	return *best, true
}

// HandOver is how long after a pod let go of an address PodByIP still
// names it, when the only other candidate was seen after the event: the
// granularity of the creationTimestamp that might have placed the
// newcomer before it. Replay (enrich.TimelineMetadata) uses the same.
const HandOver = time.Second

// gone is when the pod stopped holding its IPs, zero if it still does (or
// the time is unknown).
func (p *PodInfo) gone() time.Time {
	switch {
	case p.Deleted.IsZero():
		return p.Finished
	case p.Finished.IsZero() || p.Deleted.Before(p.Finished):
		return p.Deleted
	}
	return p.Finished
}

// betterAt reports whether p is a better owner of an address at time at than
// q, both alive at that time: a pod created by then beats one created later
// (which can only match through clock skew, see CreatedSkew), a running pod beats a finished one whose end is unknown (its IP is
// free for reuse), and otherwise the newest wins.
func betterAt(p, q *PodInfo, at time.Time) bool {
	// Both are alive at at. One since deleted held the address then: IPAM
	// hands an address on only once its pod is gone, and a newer pod
	// created in the same second (creationTimestamp has whole seconds)
	// looks created by at when it was not.
	if pDel, qDel := !p.Deleted.IsZero(), !q.Deleted.IsZero(); pDel != qDel && !p.Terminal && !q.Terminal {
		live := p
		if pDel {
			live = q
		}
		// A live pod created well before at had the address then: the
		// deletion reached the index late.
		if !live.Created.Before(at.Add(-time.Second)) {
			return pDel
		}
	}
	pBy, qBy := !p.Created.After(at), !q.Created.After(at)
	if pBy != qBy {
		return pBy
	}
	if p.Terminal != q.Terminal {
		return !p.Terminal
	}
	if pBy {
		return p.Created.After(q.Created)
	}
	return p.Created.Before(q.Created)
}

// ServiceByAddr implements Index.
func (s *store) ServiceByAddr(a netip.Addr, port uint16, proto string, nodeAddr bool, at time.Time) (ServiceInfo, ServicePortInfo, bool) {
	a = a.Unmap()
	proto = strings.ToLower(proto)
	s.mu.RLock()
	defer s.mu.RUnlock()
	// A Service deleted since at held its addresses then: the API server
	// hands an address on only once its Service is gone.
	for _, svc := range s.deletedSince(at) {
		if p, ok := servicePort(svc, a, port, proto, nodeAddr); ok {
			return *svc, p, true
		}
	}
	// An address that is a Service's own IP wins over a NodePort: in IPVS
	// mode the VIPs are local addresses too, but the client addressed the
	// VIP.
	for _, svc := range s.svcByIP[a] {
		for _, p := range svc.Ports {
			if p.Port == port && p.Proto == proto {
				return *svc, p, true
			}
		}
	}
	if nodeAddr {
		if l := s.nodePorts[protoPort{proto: proto, port: port}]; len(l) > 0 {
			sp := l[0]
			return *sp.svc, sp.svc.Ports[sp.port], true
		}
	}
	return ServiceInfo{}, ServicePortInfo{}, false
}

// deletedSince lists the Services deleted after at, the first deleted
// first: of two that held an address one after the other, that one held
// it at at. None for a zero at (now).
func (s *store) deletedSince(at time.Time) []*ServiceInfo {
	if at.IsZero() {
		return nil
	}
	i := sort.Search(len(s.svcTombs), func(i int) bool { return s.svcTombs[i].deleted.After(at) })
	out := make([]*ServiceInfo, 0, len(s.svcTombs)-i)
	for _, d := range s.svcTombs[i:] {
		out = append(out, d.svc)
	}
	return out
}

// servicePort is svc's port a client reached at a:port, by one of its
// IPs or, on a node address, its NodePort.
func servicePort(svc *ServiceInfo, a netip.Addr, port uint16, proto string, nodeAddr bool) (ServicePortInfo, bool) {
	ownIP := slices.Contains(serviceIPs(svc), a)
	for _, p := range svc.Ports {
		if p.Proto == proto && (ownIP && p.Port == port || nodeAddr && p.NodePort == port) {
			return p, true
		}
	}
	return ServicePortInfo{}, false
}

// ServiceByIP implements Index.
func (s *store) ServiceByIP(a netip.Addr, at time.Time) (ServiceInfo, bool) {
	a = a.Unmap()
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, svc := range s.deletedSince(at) {
		if slices.Contains(serviceIPs(svc), a) {
			return *svc, true
		}
	}
	if l := s.svcByIP[a]; len(l) > 0 {
		return *l[0], true
	}
	return ServiceInfo{}, false
}

// PodByHostPort implements Index.
func (s *store) PodByHostPort(proto string, port uint16, node string) (PodInfo, bool) {
	return s.hostPortPod(proto, port, node, false)
}

// HostNetworkPod implements Index.
func (s *store) HostNetworkPod(proto string, port uint16, node string) (PodInfo, bool) {
	return s.hostPortPod(proto, port, node, true)
}

func (s *store) hostPortPod(proto string, port uint16, node string, hostNetwork bool) (PodInfo, bool) {
	proto = strings.ToLower(proto)
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var best *PodInfo
	for _, p := range s.hostPorts[hostPortKey{node: node, proto: proto, port: port}] {
		if p.HostNetwork != hostNetwork {
			continue
		}
		if best == nil || betterAt(p, best, now) {
			best = p
		}
	}
	if best == nil {
		return PodInfo{}, false
	}
	return *best, true
}

// EndpointsOf implements Index.
func (s *store) EndpointsOf(svc ServiceRef) []Endpoint {
	s.mu.RLock()
	var out []Endpoint
	for _, si := range s.bySvc[svc] {
		out = append(out, si.endpoints...)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(x, y Endpoint) int {
		return cmp.Or(x.Addr.Compare(y.Addr), cmp.Compare(x.Proto, y.Proto), cmp.Compare(x.PortName, y.PortName))
	})
	// Dual-stack or overlapping slices can repeat an endpoint.
	return slices.CompactFunc(out, func(x, y Endpoint) bool {
		return x.Addr == y.Addr && x.Proto == y.Proto && x.PortName == y.PortName
	})
}

// Snapshot implements Index.
func (s *store) Snapshot() ([]trace.Pod, []trace.Service) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	cut := s.now().Add(-s.retention)
	pods := make([]*PodInfo, 0, len(s.pods)+len(s.tombs))
	for _, p := range s.pods {
		pods = append(pods, p)
	}
	for _, p := range s.tombs {
		if !p.Deleted.Before(cut) {
			pods = append(pods, p)
		}
	}
	slices.SortFunc(pods, func(x, y *PodInfo) int {
		return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name), x.Created.Compare(y.Created), x.Deleted.Compare(y.Deleted))
	})
	tp := make([]trace.Pod, 0, len(pods))
	for _, p := range pods {
		tp = append(tp, tracePod(p))
	}
	svcs := make([]*ServiceInfo, 0, len(s.services))
	for _, v := range s.services {
		svcs = append(svcs, v)
	}
	slices.SortFunc(svcs, func(x, y *ServiceInfo) int {
		return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
	})
	ts := make([]trace.Service, 0, len(svcs))
	for _, v := range svcs {
		ts = append(ts, traceService(v))
	}
	return tp, ts
}

func tracePod(p *PodInfo) trace.Pod {
	t := trace.Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Node, HostNetwork: p.HostNetwork, Deleted: p.Deleted.UTC()}
	for _, a := range p.IPs {
		t.IPs = append(t.IPs, a.String())
	}
	if len(p.ContainerIDs) > 0 {
		t.ContainerID = p.ContainerIDs[0]
	}
	for _, hp := range p.HostPorts {
		t.HostPorts = append(t.HostPorts, hp.String())
	}
	return t
}

// Trace is the Service as a trace records it.
func (v ServiceInfo) Trace() trace.Service { return traceService(&v) }

func traceService(v *ServiceInfo) trace.Service {
	t := trace.Service{Namespace: v.Namespace, Name: v.Name, Type: v.Type, ETP: v.ExternalTrafficPolicy}
	for _, a := range v.ClusterIPs {
		t.ClusterIPs = append(t.ClusterIPs, a.String())
	}
	for _, a := range v.ExternalIPs {
		t.External = append(t.External, a.String())
	}
	for _, in := range v.LBIngress {
		if in.IP.IsValid() {
			t.LBIPs = append(t.LBIPs, in.IP.String())
		}
	}
	for _, p := range v.Ports {
		t.Ports = append(t.Ports, trace.ServicePort{Name: p.Name, Proto: p.Proto, Port: p.Port, NodePort: p.NodePort, Target: p.TargetPort})
	}
	return t
}
