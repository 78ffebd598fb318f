package kubeproxy

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// FixtureServiceCIDR is the Service range the fixture's ClusterIPs are in;
// start the control plane with it (cphelper.Options.ServiceCIDR).
const FixtureServiceCIDR = "172.30.0.0/16"

// OtherNode is the node the Local NodePort Service's only endpoint runs on.
const OtherNode = "trkp-other-node"

// APIServerEndpoint is what the fixture writes as the "kubernetes"
// Service's endpoint (the API server's advertise address and the usual
// port). Start the control plane with cphelper.Options.NoEndpointReconciler
// so the API server does not write its own, random, port there.
const (
	APIServerEndpointIP   = "192.0.2.1"
	APIServerEndpointPort = 6443
)

// fixtureService is one Service of the fixture and its endpoints.
type fixtureService struct {
	svc       *corev1.Service
	endpoints []fixtureEndpoint
}

type fixtureEndpoint struct {
	ip, node string
}

// FixtureServices are the Services the recorded rulesets hold:
//   - ns4/svc4 ClusterIP 172.30.0.44 tcp/80 (p80), two ready endpoints on
//     this node, 10.180.0.4:80 and 10.180.0.5:80;
//   - ns6/svc6 ClusterIP 172.30.0.46 tcp/80 (p80), no endpoints;
//   - ns7/svc7 NodePort 30007, ClusterIP 172.30.0.47 tcp/80 (p80),
//     externalTrafficPolicy Local, one endpoint 10.180.1.7:80 on OtherNode
//     (none on this node);
//   - ns8/svc8 ClusterIP 172.30.0.48 udp/53 (p53), one endpoint
//     10.180.0.8:53 on this node;
//
// and the "kubernetes" Service's EndpointSlice (192.0.2.1:6443).
func fixtureServices(node string) []fixtureService {
	svc := func(ns, name, ip string, proto corev1.Protocol, port int32, portName string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{
				Type:       corev1.ServiceTypeClusterIP,
				ClusterIP:  ip,
				ClusterIPs: []string{ip},
				Ports: []corev1.ServicePort{{
					Name: portName, Protocol: proto, Port: port, TargetPort: intstr.FromInt32(port),
				}},
			},
		}
	}
	svc7 := svc("ns7", "svc7", "172.30.0.47", corev1.ProtocolTCP, 80, "p80")
	svc7.Spec.Type = corev1.ServiceTypeNodePort
	svc7.Spec.Ports[0].NodePort = 30007
	svc7.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	return []fixtureService{
		{svc: svc("ns4", "svc4", "172.30.0.44", corev1.ProtocolTCP, 80, "p80"),
			endpoints: []fixtureEndpoint{{"10.180.0.4", node}, {"10.180.0.5", node}}},
		{svc: svc("ns6", "svc6", "172.30.0.46", corev1.ProtocolTCP, 80, "p80")},
		{svc: svc7, endpoints: []fixtureEndpoint{{"10.180.1.7", OtherNode}}},
		{svc: svc("ns8", "svc8", "172.30.0.48", corev1.ProtocolUDP, 53, "p53"),
			endpoints: []fixtureEndpoint{{"10.180.0.8", node}}},
	}
}

// CreateFixture creates the fixture's namespaces, Services and
// EndpointSlices (see fixtureServices) and the "kubernetes" Service's
// EndpointSlice; node is the node kube-proxy runs as.
func CreateFixture(ctx context.Context, c kubernetes.Interface, node string) error {
	for _, fs := range fixtureServices(node) {
		ns := fs.svc.Namespace
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
		if _, err := c.CoreV1().Services(ns).Create(ctx, fs.svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create service %s/%s: %w", ns, fs.svc.Name, err)
		}
		if len(fs.endpoints) == 0 {
			continue
		}
		p := fs.svc.Spec.Ports[0]
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: fs.svc.Name + "-1",
				Labels: map[string]string{discoveryv1.LabelServiceName: fs.svc.Name, discoveryv1.LabelManagedBy: "tracer-test"},
			},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), Port: ptr.To(p.TargetPort.IntVal)}},
		}
		for _, ep := range fs.endpoints {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{ep.ip},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				NodeName:   ptr.To(ep.node),
			})
		}
		if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create endpointslice %s/%s: %w", ns, slice.Name, err)
		}
	}
	kube := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: metav1.NamespaceDefault, Name: "kubernetes",
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "tracer-test"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](APIServerEndpointPort)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{APIServerEndpointIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
	}
	if _, err := c.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(ctx, kube, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the kubernetes service's endpointslice: %w", err)
	}
	return nil
}

// FixtureSynced are strings `nft list ruleset` holds once kube-proxy v1.37
// has written every fixture Service, and the IPv6 proxier its (empty)
// table. (There are no
// endpoint-* chains to wait for: since v1.36.0 kube-proxy DNATs from the
// service chain itself, through a numgen map when there are several
// endpoints, and creates endpoint chains only for ClientIP session
// affinity.)
var FixtureSynced = []string{
	"dnat ip to numgen random mod 2 map { 0 : 10.180.0.4 . 80, 1 : 10.180.0.5 . 80 }",
	"dnat to 10.180.0.8:53",
	"dnat to 10.180.1.7:80",
	"dnat to 192.0.2.1:6443",
	`comment "ns6/svc6:p80" : goto reject-chain`,
	`comment "ns7/svc7:p80" : drop`,
	"tcp . 30007 : goto external-",
	"ip daddr 172.30.0.0/16 drop",
	"ip6 daddr . meta l4proto . th dport vmap @service-ips",
}

// FixtureSyncedIPTables are the same for iptables-save in iptables mode.
var FixtureSyncedIPTables = []string{
	`"ns4/svc4:p80 cluster IP"`,
	`"ns8/svc8:p53 cluster IP"`,
	`"ns6/svc6:p80 has no endpoints"`,
	"--dport 30007",
	"10.180.0.5:80",
}
