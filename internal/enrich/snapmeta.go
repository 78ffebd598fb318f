package enrich

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// SnapshotMetadata is the Metadata recorded in a trace header: pods and
// Services as they were when the trace was taken.
type SnapshotMetadata struct {
	podByIP  map[netip.Addr]trace.Pod
	pods     map[trace.PodRef]trace.Pod
	services []trace.Service
	index    serviceIndex
}

var _ Metadata = (*SnapshotMetadata)(nil)

// NewSnapshotMetadata indexes recorded pods and Services. Host-network pods
// share the node's address and are not indexed by IP: the address is the
// node's, not theirs.
func NewSnapshotMetadata(pods []trace.Pod, services []trace.Service) *SnapshotMetadata {
	m := &SnapshotMetadata{podByIP: map[netip.Addr]trace.Pod{}, pods: map[trace.PodRef]trace.Pod{}, services: services,
		index: newServiceIndex()}
	for i, s := range services {
		m.index.add(i, &s)
	}
	for _, p := range pods {
		ref := trace.PodRef{Namespace: p.Namespace, Name: p.Name}
		if was, ok := m.pods[ref]; !ok || newerPod(p, was) {
			m.pods[ref] = p
		}
		if p.HostNetwork {
			continue
		}
		for _, ip := range p.IPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				if was, ok := m.podByIP[a]; !ok || newerPod(p, was) {
					m.podByIP[a] = p
				}
			}
		}
	}
	return m
}

// newerPod: of two pods with one name or address, a live one holds it
// over a deleted one (IP reuse), and of two deleted the later deleted.
func newerPod(p, than trace.Pod) bool {
	if p.Deleted.IsZero() != than.Deleted.IsZero() {
		return p.Deleted.IsZero()
	}
	return !p.Deleted.Before(than.Deleted)
}

func (m *SnapshotMetadata) PodByIP(a netip.Addr, _ time.Time) (trace.PodRef, bool) {
	p, ok := m.podByIP[a]
	return trace.PodRef{Namespace: p.Namespace, Name: p.Name}, ok
}

func (m *SnapshotMetadata) PodNode(ref trace.PodRef) string { return m.pods[ref].Node }

func (m *SnapshotMetadata) Service(ref trace.ServiceRef) (trace.Service, bool) {
	for _, s := range m.services {
		if s.Namespace == ref.Namespace && s.Name == ref.Name {
			return s, true
		}
	}
	return trace.Service{}, false
}

// ServiceByAddr finds the Service whose ClusterIP, externalIP or LB IP is a
// with that port (or, for a node address, whose NodePort it is). It
// ignores the time: a snapshot is the state at one time.
func (m *SnapshotMetadata) ServiceByAddr(a netip.Addr, port uint16, proto string, nodeAddr bool, _ time.Time) (trace.ServiceRef, bool) {
	return m.index.find(a, port, proto, nodeAddr, func(i int) *trace.Service { return &m.services[i] })
}

// serviceIndex finds Services, each known by its position in a list, by
// address (ClusterIP, externalIP, LB IP) and NodePort, in list order.
type serviceIndex struct {
	byAddr     map[netip.Addr][]int
	byNodePort map[uint16][]int
}

func newServiceIndex() serviceIndex {
	return serviceIndex{byAddr: map[netip.Addr][]int{}, byNodePort: map[uint16][]int{}}
}

// add indexes s as Service i.
func (x serviceIndex) add(i int, s *trace.Service) {
	for _, ip := range slices.Concat(s.ClusterIPs, s.External, s.LBIPs) {
		if a, err := netip.ParseAddr(ip); err == nil && !slices.Contains(x.byAddr[a], i) {
			x.byAddr[a] = append(x.byAddr[a], i)
		}
	}
	for _, sp := range s.Ports {
		if sp.NodePort != 0 && !slices.Contains(x.byNodePort[sp.NodePort], i) {
			x.byNodePort[sp.NodePort] = append(x.byNodePort[sp.NodePort], i)
		}
	}
}

// find matches a client's a:port against the Services with that address
// (and, on a node address, NodePort), asked in the order recorded, as a
// scan of all would; svc gives candidate i's Service, nil to pass it by.
func (x serviceIndex) find(a netip.Addr, port uint16, proto string, nodeAddr bool, svc func(int) *trace.Service) (trace.ServiceRef, bool) {
	cands := x.byAddr[a]
	if nodeAddr && len(x.byNodePort[port]) > 0 {
		cands = slices.Concat(cands, x.byNodePort[port])
		slices.Sort(cands)
		cands = slices.Compact(cands)
	}
	if len(cands) == 0 {
		return trace.ServiceRef{}, false
	}
	// The Services list addresses as text: a's is compared without
	// making a string of it.
	var buf [64]byte
	ip := a.AppendTo(buf[:0])
	var onIP *trace.Service
	for _, i := range cands {
		s := svc(i)
		if s == nil {
			continue
		}
		ref, vip, ok := servicePortRef(s, ip, port, proto, nodeAddr)
		if ok {
			return ref, true
		}
		if vip && onIP == nil {
			onIP = s
		}
	}
	// The address is the Service's even where the port is not one of its
	// (a ping to a ClusterIP, an LB port that belongs elsewhere).
	if onIP != nil {
		return trace.ServiceRef{Namespace: onIP.Namespace, Name: onIP.Name}, true
	}
	return trace.ServiceRef{}, false
}

// servicePortRef matches a client's ip:port against s: the port's
// reference when one matches, and whether ip is one of s's own addresses.
func servicePortRef(s *trace.Service, ip []byte, port uint16, proto string, nodeAddr bool) (ref trace.ServiceRef, vip, ok bool) {
	is := func(addr string) bool { return addr == string(ip) }
	vip = slices.ContainsFunc(s.ClusterIPs, is) || slices.ContainsFunc(s.External, is) || slices.ContainsFunc(s.LBIPs, is)
	for _, sp := range s.Ports {
		if !strings.EqualFold(sp.Proto, proto) && proto != "icmp" {
			continue
		}
		if vip && sp.Port == port || nodeAddr && sp.NodePort != 0 && sp.NodePort == port {
			return trace.ServiceRef{Namespace: s.Namespace, Name: s.Name, Port: portName(sp)}, vip, true
		}
	}
	return trace.ServiceRef{}, vip, false
}

func portName(sp trace.ServicePort) string {
	if sp.Name != "" {
		return sp.Name
	}
	return strings.ToLower(sp.Proto) + "/" + itoa(sp.Port)
}

func itoa(n uint16) string {
	return netip.AddrPortFrom(netip.IPv4Unspecified(), n).String()[len("0.0.0.0:"):]
}

func (m *SnapshotMetadata) HostNetworkPod(proto string, port uint16, node string) (trace.PodRef, bool) {
	want := strings.ToLower(proto) + "/" + itoa(port)
	for _, p := range m.pods {
		if p.HostNetwork && p.Node == node && slices.Contains(p.HostPorts, want) {
			return trace.PodRef{Namespace: p.Namespace, Name: p.Name}, true
		}
	}
	return trace.PodRef{}, false
}
