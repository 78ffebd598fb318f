package meta

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

const incidentsFile = "../../testdata/metadata/incidents.json"

// fixtureNow is after every timestamp in incidentsFile.
var fixtureNow = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)

// checkIncidents asserts what the tracer needs from the incidents' cluster
// (testdata/metadata/incidents.json), whatever source filled the index. now
// is a time after every creation; history checks the fixture's own
// timestamps (a real API server sets its own).
func checkIncidents(t *testing.T, idx Index, now time.Time, history bool) {
	t.Helper()
	ip := netip.MustParseAddr

	// Incident 1: the hostPort pod that answers for mysql-a's Service.
	p, ok := idx.PodByIP(ip("10.244.1.5"), now)
	if !ok || p.Ref() != (trace.PodRef{Namespace: "default", Name: "mysql-b-0"}) || p.Node != "node-2" {
		t.Fatalf("PodByIP(10.244.1.5) = %+v, %v; want default/mysql-b-0 on node-2", p, ok)
	}
	if want := []HostPort{{Proto: "tcp", HostPort: 3306, ContainerPort: 3306}}; !slices.Equal(p.HostPorts, want) {
		t.Errorf("mysql-b-0 hostPorts = %+v, want %+v", p.HostPorts, want)
	}
	if len(p.ContainerIDs) != 1 || len(p.ContainerIDs[0]) != 64 {
		t.Errorf("mysql-b-0 container IDs = %q, want one 64-hex ID without the runtime scheme", p.ContainerIDs)
	}
	if p, ok := idx.PodByIP(ip("10.244.2.7"), now); !ok || p.Name != "mysql-a-0" || p.Node != "node-1" {
		t.Errorf("PodByIP(10.244.2.7) = %+v, %v; want mysql-a-0 on node-1", p, ok)
	}
	// 10.244.1.7 was a Job's until 07:00:41, the client's since 08:20:15.
	if p, ok := idx.PodByIP(ip("10.244.1.7"), now); !ok || p.Name != "client-6b7d9c5f8-kq2lm" {
		t.Errorf("PodByIP(10.244.1.7, now) = %s, %v; want the running client", p.Name, ok)
	}
	if at := time.Date(2026, 11, 28, 7, 0, 30, 0, time.UTC); history {
		if p, ok := idx.PodByIP(ip("10.244.1.7"), at); !ok || p.Name != "db-migrate-29411520-7bq4l" || !p.Terminal {
			t.Errorf("PodByIP(10.244.1.7, 07:00:30) = %s, %v; want the Job pod that still ran", p.Name, ok)
		}
	}
	if p, ok := idx.PodByIP(ip("::ffff:10.244.1.6"), now); !ok || p.Name != "nginx-7c5ddbdf54-p8lwz" {
		t.Errorf("PodByIP(v4-mapped 10.244.1.6) = %s, %v; want nginx", p.Name, ok)
	}
	for _, a := range []string{"192.168.1.12", "10.244.9.9", "10.96.0.20"} {
		if p, ok := idx.PodByIP(ip(a), now); ok {
			t.Errorf("PodByIP(%s) = %s, want none (node address, unknown, or a VIP)", a, p.Key())
		}
	}

	svcCases := []struct {
		addr     string
		port     uint16
		proto    string
		nodeAddr bool
		want     string // namespace/name:portname, "" for no match
	}{
		{"10.96.0.20", 3306, "tcp", false, "default/mysql-a:mysql"},
		{"10.96.0.20", 3306, "TCP", true, "default/mysql-a:mysql"},
		{"10.96.0.20", 3306, "udp", false, ""},
		{"10.96.0.20", 80, "tcp", false, ""},
		{"10.96.0.10", 53, "udp", false, "kube-system/kube-dns:dns"},
		{"10.96.0.10", 53, "tcp", false, "kube-system/kube-dns:dns-tcp"},
		{"192.168.1.12", 30080, "tcp", true, "default/nginx:http"},
		{"192.168.1.12", 30080, "tcp", false, ""},
		{"192.168.1.12", 30080, "udp", true, ""},
		{"192.168.1.250", 8080, "tcp", false, "default/legacy-api:http"},
		{"192.168.1.200", 80, "tcp", false, "default/web:http"},
		{"192.168.1.200", 443, "tcp", false, ""},
		{"192.168.1.11", 30081, "tcp", true, "default/web:http"},
	}
	for _, c := range svcCases {
		s, sp, ok := idx.ServiceByAddr(ip(c.addr), c.port, c.proto, c.nodeAddr, time.Time{})
		got := ""
		if ok {
			got = s.Namespace + "/" + s.Name + ":" + sp.Name
		}
		if got != c.want {
			t.Errorf("ServiceByAddr(%s, %d, %s, %v) = %q, want %q", c.addr, c.port, c.proto, c.nodeAddr, got, c.want)
		}
	}
	web, sp, ok := idx.ServiceByAddr(ip("192.168.1.200"), 80, "tcp", false, time.Time{})
	if !ok || web.Type != "LoadBalancer" || web.ExternalTrafficPolicy != "Local" || len(web.LBIngress) != 1 ||
		web.LBIngress[0].IPMode != "VIP" || sp.NodePort != 30081 || sp.TargetPort != "8080" {
		t.Errorf("web = %+v port %+v; want an ETP=Local LoadBalancer with VIP ingress, nodePort 30081, target 8080", web, sp)
	}
	if r := web.Ref(sp); r != (trace.ServiceRef{Namespace: "default", Name: "web", Port: "http"}) {
		t.Errorf("web.Ref = %+v", r)
	}
	// Incident 3 and 4: the Service is named even when the port is not its.
	for a, want := range map[string]string{"10.96.0.20": "mysql-a", "192.168.1.200": "web", "192.168.1.250": "legacy-api"} {
		if s, ok := idx.ServiceByIP(ip(a), time.Time{}); !ok || s.Name != want {
			t.Errorf("ServiceByIP(%s) = %s, %v; want %s", a, s.Name, ok, want)
		}
	}
	if s, ok := idx.ServiceByIP(ip("10.244.2.7"), time.Time{}); ok {
		t.Errorf("ServiceByIP(pod IP) = %s, want none", s.Name)
	}

	hpCases := []struct {
		proto string
		port  uint16
		node  string
		want  string
	}{
		{"tcp", 3306, "node-2", "mysql-b-0"},
		{"TCP", 3306, "node-2", "mysql-b-0"},
		{"tcp", 3306, "node-1", ""},
		{"udp", 3306, "node-2", ""},
		{"tcp", 30080, "node-2", "nginx-hostport-0"},
		{"tcp", 80, "node-2", "echo-hostport-66b9d4c7f8-w5n2c"},
		{"tcp", 9100, "node-2", ""}, // node-exporter is hostNetwork: no portmap rule
	}
	for _, c := range hpCases {
		p, ok := idx.PodByHostPort(c.proto, c.port, c.node)
		if ok != (c.want != "") || p.Name != c.want {
			t.Errorf("PodByHostPort(%s, %d, %s) = %q, %v; want %q", c.proto, c.port, c.node, p.Name, ok, c.want)
		}
	}
	if p, ok := idx.HostNetworkPod("tcp", 9100, "node-2"); !ok || p.Name != "node-exporter-q9wzb" || !p.HostNetwork {
		t.Errorf("HostNetworkPod(tcp, 9100, node-2) = %q, %v; want node-exporter-q9wzb", p.Name, ok)
	}

	eps := idx.EndpointsOf(ServiceRef{Namespace: "default", Name: "mysql-a"})
	wantEP := Endpoint{Addr: netip.MustParseAddrPort("10.244.2.7:3306"), Proto: "tcp", PortName: "mysql", Node: "node-1",
		Pod: &trace.PodRef{Namespace: "default", Name: "mysql-a-0"}, Serving: true}
	if len(eps) != 1 || !sameEndpoint(eps[0], wantEP) {
		t.Errorf("EndpointsOf(mysql-a) = %+v, want [%+v]", eps, wantEP)
	}
	// The terminating, not ready web pod is no endpoint.
	if eps := idx.EndpointsOf(ServiceRef{Namespace: "default", Name: "web"}); len(eps) != 1 || eps[0].Addr.String() != "10.244.2.8:8080" {
		t.Errorf("EndpointsOf(web) = %+v, want only 10.244.2.8:8080", eps)
	}
	if eps := idx.EndpointsOf(ServiceRef{Namespace: "kube-system", Name: "kube-dns"}); len(eps) != 6 {
		t.Errorf("EndpointsOf(kube-dns) has %d endpoints, want 2 pods x 3 ports", len(eps))
	}
	if eps := idx.EndpointsOf(ServiceRef{Namespace: "default", Name: "nope"}); len(eps) != 0 {
		t.Errorf("EndpointsOf(unknown) = %+v", eps)
	}

	pods, svcs := idx.Snapshot()
	if len(pods) != 20 || len(svcs) != 8 {
		t.Errorf("Snapshot has %d pods and %d services, want 20 and 8", len(pods), len(svcs))
	}
	if !slices.IsSortedFunc(pods, func(a, b trace.Pod) int {
		return cmpStrings(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	}) {
		t.Error("Snapshot pods are not sorted")
	}
	i := slices.IndexFunc(pods, func(p trace.Pod) bool { return p.Name == "mysql-b-0" })
	if i < 0 || !slices.Equal(pods[i].IPs, []string{"10.244.1.5"}) || !slices.Equal(pods[i].HostPorts, []string{"tcp/3306"}) || pods[i].ContainerID == "" {
		t.Errorf("snapshot of mysql-b-0 = %+v", pods)
	}
	i = slices.IndexFunc(svcs, func(s trace.Service) bool { return s.Name == "web" })
	if i < 0 || !slices.Equal(svcs[i].LBIPs, []string{"192.168.1.200"}) || svcs[i].ETP != "Local" ||
		len(svcs[i].Ports) != 1 || svcs[i].Ports[0] != (trace.ServicePort{Name: "http", Proto: "tcp", Port: 80, NodePort: 30081, Target: "8080"}) {
		t.Errorf("snapshot of web = %+v", svcs)
	}
	i = slices.IndexFunc(svcs, func(s trace.Service) bool { return s.Name == "mysql-a-headless" })
	if i < 0 || len(svcs[i].ClusterIPs) != 0 {
		t.Errorf("headless Service has ClusterIPs %v, want none", svcs)
	}
}

func sameEndpoint(a, b Endpoint) bool {
	if (a.Pod == nil) != (b.Pod == nil) || (a.Pod != nil && *a.Pod != *b.Pod) {
		return false
	}
	a.Pod, b.Pod = nil, nil
	return a == b
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
