// Package meta answers "whose address is this?" for the tracer: the pod that
// owns an IP (also shortly after the pod is gone, since events are joined
// after the fact), the Service a client addressed, the pod behind a hostPort
// rule, and the endpoints of a Service. The same Index is built from three
// sources: a `kubectl get pods,services,endpointslices -A -o json` file,
// client-go informers, or a kubeconfig (or the in-cluster config).
//
// Values returned by an Index are copies, but their slices are shared with
// the index: treat them as read-only.
package meta

import (
	"net/netip"
	"strconv"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Index resolves addresses to pods and Services. All methods are safe for
// concurrent use.
type Index interface {
	// PodByIP returns the pod that held a at time at. A pod deleted after
	// at is still found during the retention period; when several pods
	// held the address (IP reuse), the newest one created by at wins.
	// hostNetwork pods are never returned: their address is the node's.
	PodByIP(a netip.Addr, at time.Time) (PodInfo, bool)
	// ServiceByAddr returns the Service and port a client addressed by
	// a:port (ClusterIP, externalIP or LoadBalancer ingress IP), or, when
	// nodeAddr is true (a is one of this node's own addresses), by NodePort,
	// at time at: a Service deleted after at is still found during the
	// retention period (zero at: now). proto is "tcp", "udp" or "sctp", in
	// any case.
	ServiceByAddr(a netip.Addr, port uint16, proto string, nodeAddr bool, at time.Time) (ServiceInfo, ServicePortInfo, bool)
	// ServiceByIP returns the Service owning a as a ClusterIP, externalIP or
	// LoadBalancer ingress IP at time at, whatever the port: it names the
	// Service of a ping to a ClusterIP or of a port the Service does not
	// have.
	ServiceByIP(a netip.Addr, at time.Time) (ServiceInfo, bool)
	// PodByHostPort returns the pod on node declaring hostPort port/proto,
	// the pod whose portmap rule DNATs it. hostNetwork pods are not
	// considered: portmap writes no rules for them (see HostNetworkPod).
	PodByHostPort(proto string, port uint16, node string) (PodInfo, bool)
	// HostNetworkPod returns a hostNetwork pod on node declaring the port:
	// the listener a hostPort rule bypasses (incident 2).
	HostNetworkPod(proto string, port uint16, node string) (PodInfo, bool)
	// EndpointsOf returns the ready endpoints of a Service from its
	// EndpointSlices, sorted by address and port.
	EndpointsOf(svc ServiceRef) []Endpoint
	// Snapshot is what a trace header records: every pod (live, and
	// deleted within the retention period) and every Service, sorted.
	Snapshot() ([]trace.Pod, []trace.Service)
	// Synced reports whether the index has seen a complete list of every
	// kind at least once.
	Synced() bool
	// Warnings says why the metadata may be incomplete or stale.
	Warnings() []string
	// OnChange has fn told of each change of what Snapshot lists, with
	// the time the index took it, as a delta of Snapshot's lists. fn runs
	// under the index's lock: it must return at once and not call the
	// index.
	OnChange(fn func(time.Time, *trace.MetadataChange))
}

// PodInfo is the part of a pod the tracer uses.
type PodInfo struct {
	Namespace   string
	Name        string
	UID         string
	Node        string
	IPs         []netip.Addr
	HostNetwork bool
	HostPorts   []HostPort
	// ContainerIDs are the IDs of the pod's containers as the runtime names
	// them, without the "containerd://" scheme. The CNI sandbox ID that
	// portmap writes into its rule comments is not among them (the API does
	// not carry it); match hostPort rules by their DNAT target instead.
	ContainerIDs []string
	// Created is the pod's creationTimestamp; an IP lookup for an earlier
	// time does not prefer this pod.
	Created time.Time
	// Deleted is when the index saw the pod's deletion; zero while it exists.
	Deleted time.Time
	// Seen is when the index first had the pod with its addresses.
	Seen time.Time
	// Terminal is true for a Succeeded or Failed pod: its IP may already be
	// reused, so a running pod with the same IP wins.
	Terminal bool
	// Finished is when the last container of a Terminal pod stopped, if
	// known: the pod held its IP until then.
	Finished time.Time
}

// Ref names the pod in a trace.
func (p PodInfo) Ref() trace.PodRef { return trace.PodRef{Namespace: p.Namespace, Name: p.Name} }

// Key is "namespace/name".
func (p PodInfo) Key() string { return p.Namespace + "/" + p.Name }

// HostPort is one hostPort declaration of a container.
type HostPort struct {
	Proto         string // lower case: tcp, udp, sctp
	HostPort      uint16
	ContainerPort uint16
	HostIP        netip.Addr // invalid when unset (all addresses)
}

// String is the trace's "proto/port" form.
func (h HostPort) String() string { return h.Proto + "/" + strconv.Itoa(int(h.HostPort)) }

// ServiceRef names a Service.
type ServiceRef struct {
	Namespace string
	Name      string
}

// ServiceInfo is the part of a Service the tracer uses.
type ServiceInfo struct {
	Namespace   string
	Name        string
	Type        string // ClusterIP, NodePort, LoadBalancer, ExternalName
	ClusterIPs  []netip.Addr
	ExternalIPs []netip.Addr
	LBIngress   []LBIngress
	Ports       []ServicePortInfo
	// ExternalTrafficPolicy is Cluster or Local ("" for ClusterIP Services).
	ExternalTrafficPolicy string
}

// Key names the Service.
func (s ServiceInfo) Key() ServiceRef { return ServiceRef{Namespace: s.Namespace, Name: s.Name} }

// Ref names the Service and the addressed port in a trace. The port is the
// port's name, or its number when it has none.
func (s ServiceInfo) Ref(p ServicePortInfo) trace.ServiceRef {
	r := trace.ServiceRef{Namespace: s.Namespace, Name: s.Name}
	switch {
	case p.Name != "":
		r.Port = p.Name
	case p.Port != 0:
		r.Port = strconv.Itoa(int(p.Port))
	}
	return r
}

// ServicePortInfo is one port of a Service.
type ServicePortInfo struct {
	Name     string
	Proto    string // lower case
	Port     uint16
	NodePort uint16
	// TargetPort is a number or a container port name, as in the spec.
	TargetPort string
}

// LBIngress is one status.loadBalancer.ingress entry.
type LBIngress struct {
	IP       netip.Addr // invalid for hostname-only ingress
	Hostname string
	// IPMode is VIP or Proxy (k8s >= 1.30), "" when unset (VIP behaviour).
	// With Proxy, kube-proxy does not bind the IP on the node, so in-cluster
	// traffic to it leaves the node (incident 4's fix).
	IPMode string
}

// Endpoint is one ready address:port of a Service, from an EndpointSlice.
type Endpoint struct {
	Addr     netip.AddrPort
	Proto    string // lower case
	PortName string
	Node     string // "" when the slice does not say
	Pod      *trace.PodRef
	// Serving and Terminating are the slice's conditions; only endpoints
	// with ready true (or unset, which means ready) are returned.
	Serving     bool
	Terminating bool
}
