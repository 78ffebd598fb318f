package lab

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/tests/controlplane/kubeproxy"
)

// overallRules is what kube-proxy v1.37.2's own TestOverallNFTablesRules
// (pkg/proxy/nftables/proxier_test.go, baseRules and the expected dump)
// wants for its Services svc1, svc2, svc3 and svc6, without what the lab
// does not model: svc2's external IP and the localhost NodePort rejects
// (an alpha feature that test turns on).
const overallRules = `
add table ip kube-proxy { comment "rules for kube-proxy" ; }
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }
add set ip kube-proxy hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; comment "service hairpin connections" ; }
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy firewall-check
add chain ip kube-proxy masquerading
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-endpoints-check
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random
add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or 0x4000 comment "masquerade clusterIP traffic from outside cluster"
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
add element ip kube-proxy nodeport-ips { 192.168.0.2 }
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services

add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to 10.180.0.1:80
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy hairpin-connections { 10.180.0.1 . 10.180.0.1 . tcp . 80 }

add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 meta l4proto tcp dnat to 10.180.0.2:80
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local mark set mark or 0x4000 comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop }

add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 meta l4proto tcp dnat to 10.180.0.3:80
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 mark set mark or 0x4000 comment "masquerade"
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy hairpin-connections { 10.180.0.3 . 10.180.0.3 . tcp . 80 }

add element ip kube-proxy cluster-ips { 172.30.0.46 }
add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }
`

// The lab's kube-proxy writes, for the Services of kube-proxy's own test,
// exactly what that test expects the real one to write.
func TestKubeProxyNFTMatchesKubeProxysOwnTest(t *testing.T) {
	testNode, otherNode := &node{name: "test-node", ip: "192.168.0.2"}, &node{name: "other-node"}
	ep := func(ip string, n *node) *pod { return &pod{ip: ip, node: n} }
	p80 := func(nodePort int) []servicePort {
		return []servicePort{{Name: "p80", Proto: "tcp", Port: 80, TargetPort: 80, NodePort: nodePort}}
	}
	kp := &kubeProxyNFT{n: testNode, v4: ipv4Proxier("192.168.0.2", "10.0.0.0/8", "172.30.0.0/16"), services: []*service{
		{namespace: "ns1", name: "svc1", typ: "ClusterIP", clusterIP: "172.30.0.41", ports: p80(0), endpoints: []*pod{ep("10.180.0.1", testNode)}},
		{namespace: "ns2", name: "svc2", typ: "LoadBalancer", clusterIP: "172.30.0.42", lbIP: "1.2.3.4", etpLocal: true,
			ports: p80(3001), endpoints: []*pod{ep("10.180.0.2", otherNode)}},
		{namespace: "ns3", name: "svc3", typ: "NodePort", clusterIP: "172.30.0.43", ports: p80(3003), endpoints: []*pod{ep("10.180.0.3", testNode)}},
		{namespace: "ns6", name: "svc6", typ: "ClusterIP", clusterIP: "172.30.0.46", ports: p80(0)},
	}}
	got, want := finalObjects(kp.syncTx(kp.v4, nil).b.String()), finalObjects(overallRules)
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("missing: %s", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("unexpected: %s", g)
		}
	}
}

// finalObjects is what a transaction leaves: its add lines, less the
// objects it deletes again and the flushes, each once, sorted.
func finalObjects(tx string) []string {
	var out []string
	for _, line := range strings.Split(tx, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) < 5:
		case f[0] == "delete":
			obj := strings.Join(f[1:5], " ")
			out = slices.DeleteFunc(out, func(l string) bool { return strings.Join(strings.Fields(l)[1:5], " ") == obj })
		case f[0] == "add" && !slices.Contains(out, line):
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return out
}

func TestKubeProxyChainHash(t *testing.T) {
	// proxier_test.go: service-ULMVA6XW-ns1/svc1/tcp/p80, service-LAUZTJTB-ns4/svc4/tcp/p80.
	for _, c := range []struct{ ns, name, want string }{{"ns1", "svc1", "ULMVA6XW"}, {"ns4", "svc4", "LAUZTJTB"}} {
		s := &service{namespace: c.ns, name: c.name}
		if got := kpChainBase(s, servicePort{Name: "p80", Proto: "tcp"}); got != c.want+"-"+c.ns+"/"+c.name+"/tcp/p80" {
			t.Errorf("%s/%s: %s", c.ns, c.name, got)
		}
	}
}

// The lab's kube-proxy, given the Services tests/controlplane/kubeproxy
// gave the real kube-proxy v1.37.2 (its fixtureServices, the "kubernetes"
// Service, node 198.51.100.10, cluster CIDR 10.180.0.0/16, service CIDR
// 172.30.0.0/16), leaves in a fresh namespace the ruleset the real one
// left there: internal/nft/testdata/kube-proxy-v1.37.2.json, compared as
// that harness compares it (kubeproxy.Canonical: handles, listing order
// and element order aside, which follow the proxier's Go map order).
func TestKubeProxyNFTMatchesRealKubeProxy(t *testing.T) {
	requirePrivileged(t)
	l, err := netlab.New(Prefix + "-kpwriter")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ns, err := l.Namespace("node")
	if err != nil {
		t.Fatal(err)
	}
	this, other := &node{name: "trkp-node", ns: ns, ip: "198.51.100.10"}, &node{name: "trkp-other-node"}
	ep := func(ip string, n *node) *pod { return &pod{ip: ip, node: n} }
	port := func(name, proto string, port, target int) []servicePort {
		return []servicePort{{Name: name, Proto: proto, Port: port, TargetPort: target}}
	}
	svc7 := port("p80", "tcp", 80, 80)
	svc7[0].NodePort = 30007
	kp := &kubeProxyNFT{n: this, v4: ipv4Proxier(this.ip, "10.180.0.0/16", "172.30.0.0/16"), v6: ipv6Proxier(), services: []*service{
		{namespace: "default", name: "kubernetes", typ: "ClusterIP", clusterIP: "172.30.0.1", ports: port("https", "tcp", 443, 6443), endpoints: []*pod{ep("192.0.2.1", nil)}},
		{namespace: "ns4", name: "svc4", typ: "ClusterIP", clusterIP: "172.30.0.44", ports: port("p80", "tcp", 80, 80), endpoints: []*pod{ep("10.180.0.4", this), ep("10.180.0.5", this)}},
		{namespace: "ns6", name: "svc6", typ: "ClusterIP", clusterIP: "172.30.0.46", ports: port("p80", "tcp", 80, 80)},
		{namespace: "ns7", name: "svc7", typ: "NodePort", clusterIP: "172.30.0.47", etpLocal: true, ports: svc7, endpoints: []*pod{ep("10.180.1.7", other)}},
		{namespace: "ns8", name: "svc8", typ: "ClusterIP", clusterIP: "172.30.0.48", ports: port("p53", "udp", 53, 53), endpoints: []*pod{ep("10.180.0.8", this)}},
	}}
	if err := kp.start(); err != nil {
		t.Fatal(err)
	}
	js, err := ns.Run("nft", "-j", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	real, err := os.ReadFile("../nft/testdata/kube-proxy-v1.37.2.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := kubeproxy.Canonical([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	want, err := kubeproxy.Canonical(real)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("missing: %s", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("unexpected: %s", g)
		}
	}
}
