package meta

import (
	"cmp"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/tracer-dev/tracer/internal/trace"
)

// podInfo converts a Pod as the API (or kubectl) gives it. Errors name the
// field, so a bad file can be fixed.
func podInfo(p *corev1.Pod) (*PodInfo, error) {
	if p.Name == "" {
		return nil, fmt.Errorf("metadata.name is empty")
	}
	info := &PodInfo{
		Namespace:   p.Namespace,
		Name:        p.Name,
		UID:         string(p.UID),
		Node:        p.Spec.NodeName,
		HostNetwork: p.Spec.HostNetwork,
		Created:     p.CreationTimestamp.Time,
		Terminal:    p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
	}
	switch {
	case len(p.Status.PodIPs) > 0:
		for i, pip := range p.Status.PodIPs {
			a, err := parseIP(pip.IP)
			if err != nil {
				return nil, fmt.Errorf("status.podIPs[%d]: %w", i, err)
			}
			info.IPs = append(info.IPs, a)
		}
	case p.Status.PodIP != "":
		a, err := parseIP(p.Status.PodIP)
		if err != nil {
			return nil, fmt.Errorf("status.podIP: %w", err)
		}
		info.IPs = []netip.Addr{a}
	}
	// Only regular containers: the kubelet builds the sandbox's port
	// mappings, which portmap turns into rules, from them.
	for ci, c := range p.Spec.Containers {
		for pi, port := range c.Ports {
			if port.HostPort == 0 {
				continue
			}
			hp, err := hostPort(port)
			if err != nil {
				return nil, fmt.Errorf("spec.containers[%d].ports[%d]: %w", ci, pi, err)
			}
			info.HostPorts = append(info.HostPorts, hp)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; info.Terminal && t != nil && t.FinishedAt.After(info.Finished) {
			info.Finished = t.FinishedAt.Time
		}
		if id := stripRuntime(cs.ContainerID); id != "" {
			info.ContainerIDs = append(info.ContainerIDs, id)
		}
	}
	return info, nil
}

func hostPort(port corev1.ContainerPort) (HostPort, error) {
	if port.HostPort < 0 || port.HostPort > 65535 {
		return HostPort{}, fmt.Errorf("hostPort %d out of range", port.HostPort)
	}
	if port.ContainerPort < 0 || port.ContainerPort > 65535 {
		return HostPort{}, fmt.Errorf("containerPort %d out of range", port.ContainerPort)
	}
	hp := HostPort{
		Proto:         protoOf(port.Protocol),
		HostPort:      uint16(port.HostPort),
		ContainerPort: uint16(port.ContainerPort),
	}
	if port.HostIP != "" {
		a, err := parseIP(port.HostIP)
		if err != nil {
			return HostPort{}, fmt.Errorf("hostIP: %w", err)
		}
		hp.HostIP = a
	}
	return hp, nil
}

// stripRuntime turns "containerd://3f1c..." into "3f1c...", the form
// iptables comments and runtime tools use.
func stripRuntime(id string) string {
	if i := strings.Index(id, "://"); i >= 0 {
		return id[i+3:]
	}
	return id
}

// protoOf lower-cases a Kubernetes protocol; unset means TCP, as the API
// defaults it.
func protoOf(p corev1.Protocol) string {
	if p == "" {
		return "tcp"
	}
	return strings.ToLower(string(p))
}

func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("bad IP %q", s)
	}
	return a.Unmap(), nil
}

func serviceInfo(s *corev1.Service) (*ServiceInfo, error) {
	if s.Name == "" {
		return nil, fmt.Errorf("metadata.name is empty")
	}
	info := &ServiceInfo{
		Namespace:             s.Namespace,
		Name:                  s.Name,
		Type:                  string(s.Spec.Type),
		ExternalTrafficPolicy: string(s.Spec.ExternalTrafficPolicy),
	}
	if info.Type == "" {
		info.Type = string(corev1.ServiceTypeClusterIP)
	}
	clusterIPs := s.Spec.ClusterIPs
	if len(clusterIPs) == 0 && s.Spec.ClusterIP != "" {
		clusterIPs = []string{s.Spec.ClusterIP}
	}
	for i, c := range clusterIPs {
		if c == "" || c == corev1.ClusterIPNone {
			continue // headless: no VIP to address
		}
		a, err := parseIP(c)
		if err != nil {
			return nil, fmt.Errorf("spec.clusterIPs[%d]: %w", i, err)
		}
		info.ClusterIPs = append(info.ClusterIPs, a)
	}
	for i, e := range s.Spec.ExternalIPs {
		a, err := parseIP(e)
		if err != nil {
			return nil, fmt.Errorf("spec.externalIPs[%d]: %w", i, err)
		}
		info.ExternalIPs = append(info.ExternalIPs, a)
	}
	for i, in := range s.Status.LoadBalancer.Ingress {
		lb := LBIngress{Hostname: in.Hostname}
		if in.IP != "" {
			a, err := parseIP(in.IP)
			if err != nil {
				return nil, fmt.Errorf("status.loadBalancer.ingress[%d].ip: %w", i, err)
			}
			lb.IP = a
		}
		if in.IPMode != nil {
			lb.IPMode = string(*in.IPMode)
		}
		info.LBIngress = append(info.LBIngress, lb)
	}
	for i, p := range s.Spec.Ports {
		if p.Port <= 0 || p.Port > 65535 || p.NodePort < 0 || p.NodePort > 65535 {
			return nil, fmt.Errorf("spec.ports[%d]: port %d nodePort %d out of range", i, p.Port, p.NodePort)
		}
		info.Ports = append(info.Ports, ServicePortInfo{
			Name:       p.Name,
			Proto:      protoOf(p.Protocol),
			Port:       uint16(p.Port),
			NodePort:   uint16(p.NodePort),
			TargetPort: p.TargetPort.String(),
		})
	}
	return info, nil
}

// sliceInfo keeps the ready endpoints of an EndpointSlice, the set kube-proxy
// programs as real servers. A slice without a service-name label belongs to
// no Service and yields nil.
func sliceInfoOf(es *discoveryv1.EndpointSlice) (*sliceInfo, error) {
	svc := es.Labels[discoveryv1.LabelServiceName]
	if svc == "" {
		return nil, nil
	}
	si := &sliceInfo{key: es.Namespace + "/" + es.Name, svc: ServiceRef{Namespace: es.Namespace, Name: svc}}
	if es.AddressType == discoveryv1.AddressTypeFQDN {
		return si, nil
	}
	for ei, ep := range es.Endpoints {
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
			continue // nil means ready, as the API documents
		}
		var node string
		if ep.NodeName != nil {
			node = *ep.NodeName
		}
		var pod *trace.PodRef
		if r := ep.TargetRef; r != nil && r.Kind == "Pod" {
			pod = &trace.PodRef{Namespace: cmp.Or(r.Namespace, es.Namespace), Name: r.Name}
		}
		for ai, addr := range ep.Addresses {
			a, err := parseIP(addr)
			if err != nil {
				return nil, fmt.Errorf("endpoints[%d].addresses[%d]: %w", ei, ai, err)
			}
			for pi, port := range es.Ports {
				if port.Port == nil {
					continue // "all ports": nothing to name
				}
				if *port.Port <= 0 || *port.Port > 65535 {
					return nil, fmt.Errorf("ports[%d]: port %d out of range", pi, *port.Port)
				}
				e := Endpoint{
					Addr:        netip.AddrPortFrom(a, uint16(*port.Port)),
					Proto:       "tcp",
					Node:        node,
					Pod:         pod,
					Serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
					Terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating,
				}
				if port.Protocol != nil {
					e.Proto = protoOf(*port.Protocol)
				}
				if port.Name != nil {
					e.PortName = *port.Name
				}
				si.endpoints = append(si.endpoints, e)
			}
		}
	}
	return si, nil
}
