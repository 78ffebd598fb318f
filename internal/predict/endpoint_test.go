package predict

import (
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

var endpointSnap = &trace.Snapshot{
	Addresses: []trace.Address{
		{Interface: "lo", Address: "127.0.0.1/8", Up: true},
		{Interface: "eth0", Address: "fe80::1/64", Up: true},
		{Interface: "eth0", Address: "172.18.0.2/16", Up: true},
		{Interface: "eth0", Address: "fd00:18::2/64", Up: true},
	},
	Pods: []trace.Pod{{Namespace: "db", Name: "mysql-0", IPs: []string{"10.244.1.5", "fd44::5"}}},
	Services: []trace.Service{
		{Namespace: "db", Name: "mysql", ClusterIPs: []string{"10.96.0.20", "fd96::20"}, Ports: []trace.ServicePort{{Name: "mysql", Proto: "TCP", Port: 3306}}},
		{Namespace: "web", Name: "front", ClusterIPs: []string{"10.96.0.30"}, Ports: []trace.ServicePort{{Name: "http", Proto: "TCP", Port: 80}, {Name: "https", Proto: "TCP", Port: 443}}},
	},
}

func TestParseEndpoint(t *testing.T) {
	for _, c := range []struct {
		in   string
		v6   bool
		want string
	}{
		{"10.0.0.1", false, "10.0.0.1"},
		{"10.0.0.1:80", false, "10.0.0.1:80"},
		{"[fd00::1]:80", true, "[fd00::1]:80"},
		{"::ffff:10.0.0.1", false, "10.0.0.1"},
		{"pod/db/mysql-0", false, "10.244.1.5 (pod db/mysql-0)"},
		{"db/mysql-0", true, "fd44::5 (pod db/mysql-0)"},
		{"svc/db/mysql", false, "10.96.0.20:3306 (Service db/mysql)"},
		{"svc/db/mysql:mysql", true, "[fd96::20]:3306 (Service db/mysql)"},
		{"svc/web/front:443", false, "10.96.0.30:443 (Service web/front)"},
		{"svc/web/front:http", false, "10.96.0.30:80 (Service web/front)"},
		{"node", false, "172.18.0.2 (the node, eth0)"},
		{"node", true, "fd00:18::2 (the node, eth0)"},
		{"outside", false, "203.0.113.1 (outside the cluster)"},
	} {
		got, err := ParseEndpoint(c.in, endpointSnap, c.v6)
		if err != nil || got.String() != c.want {
			t.Errorf("%q (v6 %v): %q, %v; want %q", c.in, c.v6, got.String(), err, c.want)
		}
	}
}

func TestParseEndpointRefuses(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", "empty"},
		{"mysql", "none of"},
		{"pod/db", "NAMESPACE/NAME"},
		{"pod/db/nope", "no pod db/nope"},
		{"svc/db/mysql:5432", `no port "5432"`},
		{"svc/web/front", "say which"},
		{"svc/web/front", "80 (http), 443 (https)"},
		{"svc/nope/x", "no Service nope/x"},
		{"svc//x", "NAMESPACE/NAME"},
		{"db/mysql-0/x", "none of"},
	} {
		_, err := ParseEndpoint(c.in, endpointSnap, false)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %q", c.in, err, c.want)
		}
	}
	if _, err := ParseEndpoint("svc/web/front:http", endpointSnap, true); err == nil || !strings.Contains(err.Error(), "no IPv6 ClusterIP") {
		t.Errorf("an IPv4-only Service asked for IPv6: %v", err)
	}
	if _, err := ParseEndpoint("pod/db/mysql-0", nil, false); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("a pod without metadata: %v", err)
	}
}

// FuzzParseEndpoint: any text is read or refused with an error, never a
// panic, and what is read is a valid address.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "[fd00::1]:80", "pod/db/mysql-0", "svc/web/front:http", "svc/db/mysql", "node", "outside", "db/x", "svc/a/b:", "::ffff:1.2.3.4"} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, v6 bool) {
		e, err := ParseEndpoint(s, endpointSnap, v6)
		if err == nil && !e.Addr.Addr().IsValid() {
			t.Fatalf("%q: no error and no address", s)
		}
	})
}
