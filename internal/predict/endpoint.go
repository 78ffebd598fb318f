package predict

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Endpoint is one end of a connection to predict, with what it names.
type Endpoint struct {
	Addr netip.AddrPort // port 0 when none was given
	// Label is what the address is: "pod ns/name", "Service ns/name port
	// p", "the node", "outside the cluster"; "" for a plain address.
	Label string
}

func (e Endpoint) String() string {
	s := endpoint(e.Addr)
	if e.Label != "" {
		s += " (" + e.Label + ")"
	}
	return s
}

// Outside stands for a client outside the cluster: documentation
// addresses (RFC 5737, RFC 3849), which no node or pod has.
var Outside = map[bool]netip.Addr{false: netip.MustParseAddr("203.0.113.1"), true: netip.MustParseAddr("2001:db8::1")}

// ParseEndpoint reads FROM or TO of `tracer explain`: IP, IP:PORT,
// [IPv6]:PORT, pod/NS/NAME (or NS/NAME), svc/NS/NAME[:PORT] (a port
// number or name; a Service with one port needs none), "node" (the
// node's own first address) or "outside" (a client outside the
// cluster). v6 picks the IPv6 address of a dual-stack pod, Service or
// node.
func ParseEndpoint(s string, snap *trace.Snapshot, v6 bool) (Endpoint, error) {
	switch {
	case s == "":
		return Endpoint{}, fmt.Errorf("empty endpoint")
	case s == "outside":
		return Endpoint{Addr: netip.AddrPortFrom(Outside[v6], 0), Label: "outside the cluster"}, nil
	case s == "node":
		return nodeEndpoint(snap, v6)
	case strings.HasPrefix(s, "svc/"):
		return serviceEndpoint(strings.TrimPrefix(s, "svc/"), snap, v6)
	case strings.HasPrefix(s, "pod/"):
		return podEndpoint(strings.TrimPrefix(s, "pod/"), snap, v6)
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return Endpoint{Addr: unmapped(ap)}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return Endpoint{Addr: netip.AddrPortFrom(a.Unmap(), 0)}, nil
	}
	if strings.Count(s, "/") == 1 {
		return podEndpoint(s, snap, v6)
	}
	return Endpoint{}, fmt.Errorf("%q is none of IP, IP:PORT, pod/NS/NAME, svc/NS/NAME[:PORT], node, outside", s)
}

func unmapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// pick is the first address of the wanted family.
func pick(addrs []string, v6 bool) (netip.Addr, bool) {
	for _, s := range addrs {
		a, err := netip.ParseAddr(s)
		if err == nil && a.Unmap().Is6() == v6 {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

func splitName(s string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q: want NAMESPACE/NAME", s)
	}
	return ns, name, nil
}

func podEndpoint(s string, snap *trace.Snapshot, v6 bool) (Endpoint, error) {
	ns, name, err := splitName(s)
	if err != nil {
		return Endpoint{}, fmt.Errorf("pod %w", err)
	}
	if snap == nil {
		return Endpoint{}, fmt.Errorf("pod %s/%s: no pod metadata (--kubeconfig or --metadata)", ns, name)
	}
	for _, p := range snap.Pods {
		if p.Namespace != ns || p.Name != name {
			continue
		}
		a, ok := pick(p.IPs, v6)
		if !ok {
			return Endpoint{}, fmt.Errorf("pod %s/%s has no %s address", ns, name, family(v6))
		}
		return Endpoint{Addr: netip.AddrPortFrom(a, 0), Label: "pod " + ns + "/" + name}, nil
	}
	return Endpoint{}, fmt.Errorf("no pod %s/%s in the metadata", ns, name)
}

func serviceEndpoint(s string, snap *trace.Snapshot, v6 bool) (Endpoint, error) {
	ref, port, _ := strings.Cut(s, ":")
	ns, name, err := splitName(ref)
	if err != nil {
		return Endpoint{}, fmt.Errorf("svc %w", err)
	}
	if snap == nil {
		return Endpoint{}, fmt.Errorf("svc/%s/%s: no Service metadata (--kubeconfig or --metadata)", ns, name)
	}
	for _, sv := range snap.Services {
		if sv.Namespace != ns || sv.Name != name {
			continue
		}
		a, ok := pick(sv.ClusterIPs, v6)
		if !ok {
			return Endpoint{}, fmt.Errorf("Service %s/%s has no %s ClusterIP", ns, name, family(v6))
		}
		sp, err := servicePort(sv, port)
		if err != nil {
			return Endpoint{}, err
		}
		return Endpoint{Addr: netip.AddrPortFrom(a, sp.Port), Label: "Service " + ns + "/" + name}, nil
	}
	return Endpoint{}, fmt.Errorf("no Service %s/%s in the metadata", ns, name)
}

// servicePort finds a Service's port by number or name; "" is its only
// port.
func servicePort(sv trace.Service, want string) (trace.ServicePort, error) {
	var names []string
	for _, p := range sv.Ports {
		if want == "" && len(sv.Ports) == 1 || p.Name == want || want == strconv.Itoa(int(p.Port)) {
			return p, nil
		}
		names = append(names, fmt.Sprintf("%d (%s)", p.Port, p.Name))
	}
	if want == "" {
		return trace.ServicePort{}, fmt.Errorf("Service %s/%s has ports %s: say which, svc/%s/%s:PORT", sv.Namespace, sv.Name, strings.Join(names, ", "), sv.Namespace, sv.Name)
	}
	return trace.ServicePort{}, fmt.Errorf("Service %s/%s has no port %q (it has %s)", sv.Namespace, sv.Name, want, strings.Join(names, ", "))
}

func nodeEndpoint(snap *trace.Snapshot, v6 bool) (Endpoint, error) {
	for _, a := range NodeAddrs(snap) {
		if a.Addr.Is6() == v6 {
			return Endpoint{Addr: netip.AddrPortFrom(a.Addr, 0), Label: "the node, " + a.Interface}, nil
		}
	}
	return Endpoint{}, fmt.Errorf("the node has no %s address on an interface that is up", family(v6))
}

// NodeAddr is one of the node's own addresses and its interface.
type NodeAddr struct {
	Addr      netip.Addr
	Interface string
}

// NodeAddrs are the addresses a client can reach the node on: on an
// interface that is up, not loopback, link-local or kube-ipvs0's Service
// addresses.
func NodeAddrs(snap *trace.Snapshot) []NodeAddr {
	if snap == nil {
		return nil
	}
	var out []NodeAddr
	for _, a := range snap.Addresses {
		p, err := netip.ParsePrefix(a.Address)
		if err != nil || !a.Up || a.Interface == "lo" || a.Interface == "kube-ipvs0" || p.Addr().IsLinkLocalUnicast() || p.Addr().IsLoopback() {
			continue
		}
		out = append(out, NodeAddr{Addr: p.Addr(), Interface: a.Interface})
	}
	return out
}
