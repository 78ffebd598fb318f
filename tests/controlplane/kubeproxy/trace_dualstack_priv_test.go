package kubeproxy

import (
	"testing"
	"time"
)

// The dual-stack cluster of TestPrivTraceKubeProxyNFTDualStack: the
// cluster of TestPrivTraceKubeProxyNFT with an IPv6 twin of every address.
// The node has DefaultNodeIP6 on kp0 beside its IPv4 address, each pod an
// IPv6 /128 routed through the node's link-local podGateway6 on its veth,
// and the uplink 2001:db8:100::1, which forwards nothing:
//
//	shop/client fd00:10:180::2 --- veth-c ┐
//	web/echo-a  fd00:10:180::3 --- veth-a ├ node 2001:db8:100::10 (kp0) --- (kp1) 2001:db8:100::1 uplink
//	web/echo-b  fd00:10:180::4 --- veth-b ┘
//
// The API server allocates from 172.30.0.0/16 and fd00:30::/108; web/echo
// and web/empty are RequireDualStack with the ClusterIPs 172.30.0.10 and
// fd00:30::10, and 172.30.0.20 and fd00:30::20; web/echo has an
// EndpointSlice of each address type.
const (
	e2eClientIP6 = "fd00:10:180::2"
	e2eEchoA6    = "fd00:10:180::3"
	e2eEchoB6    = "fd00:10:180::4"
	echoIP6      = "fd00:30::10"
	emptyIP6     = "fd00:30::20"
	// serviceCIDR6 is the IPv6 Service range: a /108, the widest the API
	// server takes (20 bits of addresses, --service-cluster-ip-range).
	serviceCIDR6 = "fd00:30::/108"
	uplinkGW6    = "2001:db8:100::1"
)

// ipv6 is the IPv6 family of the dual-stack cluster. nft's plain `reject`
// in an ip6 table sends ICMPv6 destination unreachable, port unreachable
// (type 1 code 4).
var ipv6 = traceFamily{label: "ipv6 ", v6: true, nft: "ip6", icmp: "icmpv6", nodeIP: DefaultNodeIP6, uplinkGW: uplinkGW6,
	serviceCIDR: serviceCIDR6, echoIP: echoIP6, emptyIP: emptyIP6, unreachable: [2]int{1, 4}}

// TestPrivTraceKubeProxyNFTDualStack is TestPrivTraceKubeProxyNFT on a
// dual-stack cluster: the API server with an IPv4 and an IPv6 Service
// range, the real kube-proxy v1.37.2 in nftables mode with a cluster CIDR
// of each family and a node with an address of each, so that its IPv6
// proxier fills `table ip6 kube-proxy`, and the pods with an address of
// each family, their servers on one dual-stack socket. web/echo and
// web/empty are RequireDualStack, web/echo has EndpointSlices of both
// address types. Every attempt of the IPv4 test is made over both
// families in the same tier (the same live pipeline), and each flow is
// checked against the node's and the client's truth (which server
// answered, `conntrack -L -f ipv6` for IPv6, the ICMPv6 error or
// ECONNREFUSED the client got) and against the rule `nft -a list table
// ip6 kube-proxy` prints: family ip6, its handle and text, its elements.
// At the end it deletes the ip6 table's unallocated-ClusterIP drop, as
// when kube-proxy's ServiceCIDRs come after its first full sync, and
// checks that the harness's WaitSynced asks for the full sync that
// brings it back.
func TestPrivTraceKubeProxyNFTDualStack(t *testing.T) {
	skipShort(t)
	SkipUnlessPrivileged(t)
	requireTools(t, "conntrack", "sysctl")
	checkHostUnchanged(t, NFTables)
	t0 := time.Now()
	c := startTraceClusterOf(t, NFTables, ipv4, ipv6)
	t.Logf("dual-stack cluster, kube-proxy rules of both tables and metadata ready in %s", time.Since(t0).Round(time.Millisecond))
	c.runNFTTiers(t)
	checkFullSyncRestoresDrop(t, c.kp, ipv6.nft, traceSynced(NFTables, c.families))
}
