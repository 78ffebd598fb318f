package enrich

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// A trace written before snapshots carried the local routing table: every
// interface address (as a host address) and loopback count as local.
func TestNodeEnvOldTraceWithoutLocalRoutes(t *testing.T) {
	env, err := NewNodeEnv("node-1", &trace.Snapshot{Addresses: []trace.Address{{Interface: "eth0", Address: "172.18.0.2/16", Up: true}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]bool{"172.18.0.2": true, "172.18.0.3": false, "127.0.0.1": true, "::1": true} {
		if got, _ := env.IsLocal(netip.MustParseAddr(addr)); got != want {
			t.Errorf("IsLocal(%s) = %v, want %v", addr, got, want)
		}
	}
}

// kube-proxy IPVS mode names its IPv6 ipsets KUBE-6-*: their members are
// the IPv6 ClusterIPs' service ports.
func TestNodeEnvServicePortsIPv6(t *testing.T) {
	const ipsets = `create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.10,tcp:80
create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536
add KUBE-6-CLUSTER-IP fd00:10:96::a,tcp:80
add KUBE-6-CLUSTER-IP fd00:10:96::a,udp:53
create KUBE-6-LOAD-BALANCER hash:ip,port family inet6 hashsize 1024 maxelem 65536
add KUBE-6-LOAD-BALANCER fd00:192:168::200,tcp:443
create KUBE-6-EXTERNAL-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536
add KUBE-6-EXTERNAL-IP fd00:203::7,tcp:8080
create KUBE-6-EXTERNAL-IP-LOCAL hash:ip,port family inet6 hashsize 1024 maxelem 65536
add KUBE-6-EXTERNAL-IP-LOCAL fd00:203::8,tcp:8081
create KUBE-6-IPVS-IPS hash:ip family inet6 hashsize 1024 maxelem 65536
add KUBE-6-IPVS-IPS fd00:10:96::a
`
	env, err := NewNodeEnv("node-1", &trace.Snapshot{Ipsets: ipsets}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string][]string{
		"10.96.0.10":        {"tcp:80"},
		"fd00:10:96::a":     {"tcp:80", "udp:53"},
		"fd00:192:168::200": {"tcp:443"},
		"fd00:203::7":       {"tcp:8080"},
		"fd00:203::8":       {"tcp:8081"},
	} {
		if got := env.ServicePortsOn(netip.MustParseAddr(addr)); !slices.Equal(got, want) {
			t.Errorf("ServicePortsOn(%s) = %q, want %q", addr, got, want)
		}
	}
}

// Listener follows the kernel: 0.0.0.0 takes IPv4 only, [::] takes IPv6
// and IPv4 too unless V6ONLY, and a socket bound to the address itself
// comes first.
func TestNodeEnvListenerFamilies(t *testing.T) {
	snap := &trace.Snapshot{Listeners: []trace.Listener{
		{Proto: "tcp", Address: "0.0.0.0:80", Process: "v4-any"},
		{Proto: "tcp", Address: "[::]:80", V6Only: true, Process: "v6-any"},
		{Proto: "tcp", Address: "10.0.0.1:80", Process: "v4-exact"},
		{Proto: "tcp", Address: "[::]:443", Process: "dual"},
		{Proto: "tcp", Address: "0.0.0.0:443", Process: "v4-any-443"},
		{Proto: "tcp", Address: "[::]:8443", V6Only: true, Process: "v6only"},
		{Proto: "tcp", Address: "0.0.0.0:9000", Process: "v4-only"},
		{Proto: "tcp", Address: "[fd00::1]:9001", Process: "v6-exact"},
		{Proto: "udp", Address: "[::]:53", Process: "dns"},
	}}
	env, err := NewNodeEnv("node-1", snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ proto, dst, want string }{
		{"tcp", "10.0.0.1:80", "v4-exact"},
		{"tcp", "10.0.0.2:80", "v4-any"},
		{"tcp", "[fd00::1]:80", "v6-any"},
		{"tcp", "10.0.0.2:443", "v4-any-443"}, // 0.0.0.0 before a dual-stack [::]
		{"tcp", "[fd00::1]:443", "dual"},
		{"tcp", "10.0.0.1:8443", ""}, // V6ONLY
		{"tcp", "[fd00::1]:8443", "v6only"},
		{"tcp", "[fd00::1]:9000", ""}, // 0.0.0.0 takes no IPv6
		{"tcp", "[::ffff:10.0.0.1]:9000", "v4-only"},
		{"tcp", "[fd00::1]:9001", "v6-exact"},
		{"tcp", "[fd00::2]:9001", ""},
		{"udp", "10.0.0.1:53", "dns"},
		{"tcp", "10.0.0.1:53", ""},
	} {
		l, ok := env.Listener(c.proto, netip.MustParseAddrPort(c.dst))
		if got := l.Process; got != c.want || ok != (c.want != "") {
			t.Errorf("Listener(%s %s) = %q %v, want %q", c.proto, c.dst, got, ok, c.want)
		}
	}
}

// A trace written before listeners carried v6only reads its [::]
// listeners as Linux's default, dual-stack.
func TestNodeEnvListenerOldTrace(t *testing.T) {
	var snap trace.Snapshot
	if err := json.Unmarshal([]byte(`{"listeners":[{"proto":"tcp","address":"[::]:443","process":"old"}]}`), &snap); err != nil {
		t.Fatal(err)
	}
	env, err := NewNodeEnv("node-1", &snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{"10.0.0.1:443", "[fd00::1]:443"} {
		if l, ok := env.Listener("tcp", netip.MustParseAddrPort(dst)); !ok || l.Process != "old" {
			t.Errorf("Listener(%s) = %+v %v", dst, l, ok)
		}
	}
}
