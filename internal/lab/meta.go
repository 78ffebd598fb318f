package lab

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// The metadata is what `kubectl get pods,services,endpointslices -A -o json`
// prints: a v1 List. Only the fields the tracer joins on are filled, with
// the addresses the CNI plugins really assigned. (k8s.io/api's types are
// not usable here without changing go.sum, so these are plain maps.)

type obj = map[string]any

func (c *cluster) metadata() ([]byte, error) {
	items := []any{}
	for _, p := range c.pods {
		items = append(items, podObject(p))
	}
	for _, s := range c.services {
		items = append(items, serviceObject(s))
	}
	for _, s := range c.services {
		items = append(items, endpointSliceObject(s, "IPv4"))
		if s.clusterIP6 != "" {
			items = append(items, endpointSliceObject(s, "IPv6"))
		}
	}
	out, err := json.MarshalIndent(obj{
		"apiVersion": "v1",
		"kind":       "List",
		"metadata":   obj{"resourceVersion": ""},
		"items":      items,
	}, "", "    ")
	if err != nil {
		return nil, fmt.Errorf("encode metadata: %w", err)
	}
	return out, nil
}

var created = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339)

func podObject(p *pod) obj {
	var ports []obj
	for _, cp := range p.ports {
		port := obj{"name": cp.Name, "containerPort": cp.Port, "protocol": strings.ToUpper(cp.Proto)}
		if cp.HostPort > 0 {
			port["hostPort"] = cp.HostPort
		}
		if cp.HostIP != "" {
			port["hostIP"] = cp.HostIP
		}
		if p.hostNetwork {
			// The API server defaults hostPort to containerPort for hostNetwork pods.
			port["hostPort"] = cp.Port
		}
		ports = append(ports, port)
	}
	image := "registry.lab/" + p.name + ":1"
	hostIPs, podIPs := []obj{{"ip": p.node.ip}}, []obj{{"ip": p.ip}}
	if p.ip6 != "" {
		hostIPs, podIPs = append(hostIPs, obj{"ip": p.node.ip6}), append(podIPs, obj{"ip": p.ip6})
	}
	return obj{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata": obj{
			"name": p.name, "namespace": p.namespace, "uid": p.uid,
			"labels":            obj{"app": p.name},
			"creationTimestamp": created,
		},
		"spec": obj{
			"nodeName":    p.node.name,
			"hostNetwork": p.hostNetwork,
			"containers":  []obj{{"name": p.name, "image": image, "ports": ports}},
		},
		"status": obj{
			"phase":   "Running",
			"hostIP":  p.node.ip,
			"hostIPs": hostIPs,
			"podIP":   p.ip,
			"podIPs":  podIPs,
			"containerStatuses": []obj{{
				"name": p.name, "image": image, "imageID": image,
				"containerID": "containerd://" + p.containerID,
				"ready":       true, "started": true, "restartCount": 0,
				"state": obj{"running": obj{"startedAt": created}},
			}},
		},
	}
}

func serviceObject(s *service) obj {
	var ports []obj
	for _, p := range s.ports {
		port := obj{"name": p.Name, "protocol": strings.ToUpper(p.Proto), "port": p.Port, "targetPort": p.TargetPort}
		if p.NodePort > 0 {
			port["nodePort"] = p.NodePort
		}
		ports = append(ports, port)
	}
	spec := obj{
		"type": s.typ, "clusterIP": s.clusterIP, "clusterIPs": []string{s.clusterIP}, "ports": ports,
		"ipFamilies": []string{"IPv4"}, "ipFamilyPolicy": "SingleStack",
	}
	if s.clusterIP6 != "" {
		spec["clusterIPs"] = []string{s.clusterIP, s.clusterIP6}
		spec["ipFamilies"], spec["ipFamilyPolicy"] = []string{"IPv4", "IPv6"}, "RequireDualStack"
	}
	if len(s.endpoints) > 0 {
		// Every endpoint of a lab Service is one pod, labelled app=<pod name>.
		spec["selector"] = obj{"app": s.endpoints[0].name}
	}
	status := obj{"loadBalancer": obj{}}
	if s.typ != "ClusterIP" {
		spec["externalTrafficPolicy"] = "Cluster"
		if s.etpLocal {
			spec["externalTrafficPolicy"] = "Local"
		}
	}
	if s.healthCheckPort > 0 {
		spec["healthCheckNodePort"] = s.healthCheckPort
	}
	if s.lbIP != "" {
		ingress := []obj{{"ip": s.lbIP, "ipMode": "VIP"}}
		if s.lbIP6 != "" {
			ingress = append(ingress, obj{"ip": s.lbIP6, "ipMode": "VIP"})
		}
		status["loadBalancer"] = obj{"ingress": ingress}
	}
	return obj{
		"apiVersion": "v1",
		"kind":       "Service",
		"metadata":   obj{"name": s.name, "namespace": s.namespace, "uid": s.uid, "creationTimestamp": created},
		"spec":       spec,
		"status":     status,
	}
}

// endpointSliceObject is the Service's EndpointSlice of one address type
// (IPv4 or IPv6): the EndpointSlice controller makes one per family.
func endpointSliceObject(s *service, addressType string) obj {
	var eps []obj
	for _, p := range s.endpoints {
		addr := p.ip
		if addressType == "IPv6" {
			addr = p.ip6
		}
		eps = append(eps, obj{
			"addresses":  []string{addr},
			"conditions": obj{"ready": true, "serving": true, "terminating": false},
			"nodeName":   p.node.name,
			"targetRef":  obj{"kind": "Pod", "name": p.name, "namespace": p.namespace, "uid": p.uid},
		})
	}
	var ports []obj
	for _, p := range s.ports {
		ports = append(ports, obj{"name": p.Name, "protocol": strings.ToUpper(p.Proto), "port": p.TargetPort})
	}
	name := s.name + "-" + s.uid[:5]
	if addressType == "IPv6" {
		name = s.name + "-v6" + s.uid[:5]
	}
	return obj{
		"apiVersion":  "discovery.k8s.io/v1",
		"kind":        "EndpointSlice",
		"metadata":    obj{"name": name, "namespace": s.namespace, "labels": obj{"kubernetes.io/service-name": s.name}},
		"addressType": addressType,
		"endpoints":   eps,
		"ports":       ports,
	}
}
