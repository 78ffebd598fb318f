package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

func createNamespace(ctx context.Context, cs kubernetes.Interface, name string) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	return nil
}

// runPod does what the scheduler and the kubelet would: it creates a pod
// bound to node and writes a running status with ips and hostIP through the
// status subresource.
func runPod(ctx context.Context, cs kubernetes.Interface, ns, name, node, hostIP string, ips ...string) (*corev1.Pod, error) {
	p, err := cs.CoreV1().Pods(ns).Create(ctx, testPod(ns, name, node), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIP = hostIP
	p.Status.HostIPs = []corev1.HostIP{{IP: hostIP}}
	p.Status.PodIP = ips[0]
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	now := metav1.Now()
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "c", Image: "registry.invalid/app:1", ImageID: "registry.invalid/app@sha256:00", Ready: true,
		ContainerID: containerID(ns, name),
		State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
	}}
	p, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update pod %s/%s status: %w", ns, name, err)
	}
	return p, nil
}

// createService creates svc and, for a LoadBalancer with lbIPs, writes its
// ingress through the status subresource as a cloud controller would.
func createService(ctx context.Context, cs kubernetes.Interface, svc *corev1.Service, lbIPs ...string) (*corev1.Service, error) {
	s, err := cs.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	if len(lbIPs) == 0 {
		return s, nil
	}
	for _, ip := range lbIPs {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	s, err = cs.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, s, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update service %s/%s status: %w", svc.Namespace, svc.Name, err)
	}
	return s, nil
}

func service(ns, name string, typ corev1.ServiceType, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: typ, Selector: map[string]string{"app": name}, Ports: ports},
	}
}

func tcpPort(name string, port, target, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(target), NodePort: nodePort}
}

// createSlice writes the EndpointSlice the endpointslice controller would:
// ready endpoints for pods on port.
func createSlice(ctx context.Context, cs kubernetes.Interface, svc *corev1.Service, portName string, port int32, pods ...*corev1.Pod) error {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace, Name: svc.Name + "-abcde",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "e2e.tracer.dev"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, p := range pods {
		node := p.Spec.NodeName
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		})
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(svc.Namespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpointslice %s/%s: %w", es.Namespace, es.Name, err)
	}
	return nil
}

// containerID is a stable fake runtime ID for a pod's container.
func containerID(ns, name string) string {
	return fmt.Sprintf("containerd://%x", sha256.Sum256([]byte(ns+"/"+name)))
}

func ptr[T any](v T) *T { return &v }
