package lab

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Portmap releases whose nftables backend the lab writes.
const (
	// PortmapV1100 checks locality: prerouting jumps to hostports_all only
	// for `fib daddr type local`.
	PortmapV1100 = "v1.10.0"
	// PortmapV180 has no locality check on prerouting (v1.6.1 to v1.8.x,
	// CVE-2025-67499): every destination with a hostPort's port is taken.
	PortmapV180 = "v1.8.0"
)

// portmapNFTTx is the transaction the nftables backend of portmap
// (containernetworking/plugins plugins/meta/portmap/portmap_nftables.go,
// forwardPorts: v1.10.0 lines 83-272, v1.8.0 lines 78-238) runs on CNI
// ADD for one pod with the conflist defaults (snat true, masqAll false, no
// conditions), in the text knftables writes. The rulesets it leaves are
// those in internal/nft/testdata/portmap-VERSION.nft, which the real
// plugins wrote (tests/cni TestPortmapFixtures); TestPortmapNFTWriter
// checks the lab writes them byte for byte. family is the pod address's:
// "ip" (table ip cni_hostport) or "ip6" (ip6 cni_hostport, written for a
// dual-stack pod's IPv6 address: portmap-VERSION-dualstack.nft).
func portmapNFTTx(version, family, containerID, podIP string, ports []containerPort) (string, error) {
	var b strings.Builder
	op := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	t := family + " cni_hostport"
	op(`add table %s { comment "CNI portmap plugin" ; }`, t)
	op("add chain %s hostports", t)
	op("add chain %s hostip_hostports", t)
	switch version {
	case PortmapV1100:
		op("add chain %s hostports_all", t)
		op("flush chain %s hostports_all", t)
		op("add rule %s hostports_all jump hostip_hostports", t)
		op("add rule %s hostports_all jump hostports", t)
		op("add chain %s prerouting { type nat hook prerouting priority -100 ; }", t)
		op("flush chain %s prerouting", t)
		op("add rule %s prerouting fib daddr type local jump hostports_all", t)
		op("add chain %s output { type nat hook output priority -100 ; }", t)
		op("flush chain %s output", t)
		op("add rule %s output fib daddr type local jump hostports_all", t)
	case PortmapV180:
		op("add chain %s prerouting { type nat hook prerouting priority -100 ; }", t)
		op("flush chain %s prerouting", t)
		op("add rule %s prerouting jump hostip_hostports", t)
		op("add rule %s prerouting jump hostports", t)
		op("add chain %s output { type nat hook output priority -100 ; }", t)
		op("flush chain %s output", t)
		op("add rule %s output jump hostip_hostports", t)
		op("add rule %s output fib daddr type local jump hostports", t)
	default:
		return "", fmt.Errorf("portmap %s: the lab writes the nftables backend of %s and %s only", version, PortmapV1100, PortmapV180)
	}
	op("add chain %s masquerading { type nat hook postrouting priority 100 ; }", t)
	for _, hp := range ports {
		match := fmt.Sprintf("%s dport %d", hp.Proto, hp.HostPort)
		if hp.HostIP != "" {
			if strings.Contains(hp.HostIP, ":") != (family == "ip6") {
				continue // portmap ignores a hostIP of the other family
			}
			match = family + " daddr " + hp.HostIP + " " + match
		}
		op("add rule %s %s %s dnat to %s comment %q", t, hostPortChain(version, hp), match, net.JoinHostPort(podIP, strconv.Itoa(hp.Port)), containerID)
	}
	op("add rule %s masquerading %s saddr %s %s daddr %s masquerade comment %q", t, family, podIP, family, podIP, containerID)
	if family == "ip" {
		// Only IPv4 can hairpin from localhost (route_localnet).
		op("add rule %s masquerading ip saddr 127.0.0.1 ip daddr %s masquerade comment %q", t, podIP, containerID)
	}
	return b.String(), nil
}

// hostPortChain is where a mapping's DNAT goes: a hostIP mapping went to
// hostip_hostports before v1.9 and to hostports since, together with
// every other one.
func hostPortChain(version string, hp containerPort) string {
	if hp.HostIP != "" && version == PortmapV180 {
		return "hostip_hostports"
	}
	return "hostports"
}

// portmapNFTAdd is portmap's CNI ADD with the nftables backend for p on n
// (main.go cmdAdd): for the IPv4 address knftables.New's check, the
// transaction, and route_localnet on the node's interface towards the pod
// (the bridge), which snat sets so 127.0.0.1 can be DNAT'd across it; then
// for an IPv6 address the same into ip6 cni_hostport.
func (c *cluster) portmapNFTAdd(n *node, p *pod) error {
	if err := portmapNFTFamily(n, p, "ip", p.ip); err != nil {
		return err
	}
	if err := n.ns.Sysctl("net.ipv4.conf.cni0.route_localnet", "1"); err != nil {
		return fmt.Errorf("portmap %s add %s: %w", n.portmapNFT, p.name, err)
	}
	if p.ip6 == "" {
		return nil
	}
	return portmapNFTFamily(n, p, "ip6", p.ip6)
}

// portmapNFTFamily is portmap's forwardPorts for one of p's addresses.
func portmapNFTFamily(n *node, p *pod, family, ip string) error {
	tx, err := portmapNFTTx(n.portmapNFT, family, p.sandboxID, ip, p.hostPorts())
	if err != nil {
		return err
	}
	if err := knftablesCheck(n, family+" cni_hostport"); err != nil {
		return fmt.Errorf("portmap %s add %s: %w", n.portmapNFT, p.name, err)
	}
	if err := runStdin(n.ns, tx, "nft", "-f", "-"); err != nil {
		return fmt.Errorf("portmap %s add %s (%s): %w", n.portmapNFT, p.name, family, err)
	}
	return nil
}
