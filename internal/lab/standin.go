package lab

import (
	"fmt"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// StandInMode is which kube-proxy the lab stands in for.
type StandInMode string

// The lab's kube-proxy stand-ins.
const (
	// StandInIPVS is IPVS mode (kubeproxy.go): with IPVS the virtual
	// servers, without it the KUBE-SVC/KUBE-SEP substitute.
	StandInIPVS StandInMode = "ipvs"
	// StandInNFTables is nftables mode (kubeproxynft.go).
	StandInNFTables StandInMode = "nftables"
)

// StandInNode is the node the stand-in is written for.
type StandInNode struct {
	Name        string
	IP          string // the node address (NodePorts, nodeport-ips)
	ClusterCIDR string // the pods' range, as kube-proxy's clusterCIDR
	ServiceCIDR string // nftables mode: the ClusterIP range it drops unallocated addresses of
	// IP6, ClusterCIDR6 and ServiceCIDR6 make the node dual-stack
	// (nftables mode): its IPv6 proxier serves the Services' IPv6 side.
	IP6, ClusterCIDR6, ServiceCIDR6 string
	// IPVS: write virtual servers (the kernel must have IPVS); otherwise
	// IPVS mode gets the KUBE-SVC/KUBE-SEP substitute.
	IPVS bool
	// Dummy: kube-ipvs0 is a dummy link; otherwise a bridge left down.
	Dummy bool
}

// StandInService is a Service as the stand-in sees it.
type StandInService struct {
	Namespace, Name string
	Type            string // ClusterIP, NodePort or LoadBalancer
	ClusterIP       string
	ClusterIP6      string // a dual-stack Service's IPv6 ClusterIP
	LoadBalancerIP  string
	// ExternalLocal is externalTrafficPolicy: Local.
	ExternalLocal       bool
	HealthCheckNodePort int
	Ports               []StandInPort
	Endpoints           []StandInEndpoint
}

// StandInPort is one port of a Service (Proto "tcp" or "udp").
type StandInPort struct {
	Name       string
	Proto      string
	Port       int
	TargetPort int
	NodePort   int
}

// StandInEndpoint is one ready endpoint; Local says it runs on the node.
type StandInEndpoint struct {
	IP    string
	IP6   string // its IPv6 address, for a dual-stack Service
	Local bool
}

// WriteKubeProxyStandIn writes into ns what the lab's kube-proxy of mode
// writes for services on node sn, the same code the lab's scenarios run, so
// tests can hold it against the real kube-proxy without building a lab
// scenario. ns must be fresh: it gets kube-ipvs0 (IPVS mode) and the
// rules.
func WriteKubeProxyStandIn(ns netlab.Namespace, mode StandInMode, sn StandInNode, services []StandInService) error {
	n := &node{name: sn.Name, ns: ns, ip: sn.IP, ip6: sn.IP6}
	other := &node{name: sn.Name + "-other"}
	svcs := make([]*service, len(services))
	for i, s := range services {
		svcs[i] = s.service(n, other)
	}
	switch mode {
	case StandInIPVS:
		return writeIPVSStandIn(n, sn, svcs)
	case StandInNFTables:
		kp := &kubeProxyNFT{n: n, services: svcs,
			v4: ipv4Proxier(sn.IP, sn.ClusterCIDR, sn.ServiceCIDR), v6: ipv6Proxier()}
		if sn.IP6 != "" {
			kp.v6 = dualStackIPv6Proxier(sn.IP6, sn.ClusterCIDR6, sn.ServiceCIDR6)
		}
		return kp.start()
	}
	return fmt.Errorf("write kube-proxy stand-in: unknown mode %q", mode)
}

func writeIPVSStandIn(n *node, sn StandInNode, svcs []*service) error {
	kp, err := startKubeProxy(n, &Env{IPVS: sn.IPVS, Dummy: sn.Dummy}, sn.ClusterCIDR, false)
	if err != nil {
		return fmt.Errorf("write kube-proxy stand-in: %w", err)
	}
	for _, s := range svcs {
		if err := kp.addService(s); err != nil {
			return fmt.Errorf("write kube-proxy stand-in: %w", err)
		}
	}
	return nil
}

// service is s with its endpoints on n (Local) or other.
func (s StandInService) service(n, other *node) *service {
	svc := &service{namespace: s.Namespace, name: s.Name, typ: s.Type, clusterIP: s.ClusterIP, clusterIP6: s.ClusterIP6,
		lbIP: s.LoadBalancerIP, etpLocal: s.ExternalLocal, healthCheckPort: s.HealthCheckNodePort}
	for _, p := range s.Ports {
		svc.ports = append(svc.ports, servicePort(p))
	}
	for _, ep := range s.Endpoints {
		on := other
		if ep.Local {
			on = n
		}
		svc.endpoints = append(svc.endpoints, &pod{ip: ep.IP, ip6: ep.IP6, node: on})
	}
	return svc
}
