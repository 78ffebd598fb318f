package lab

import (
	"fmt"
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
// checks the lab writes them byte for byte.
func portmapNFTTx(version, containerID, podIP string, ports []containerPort) (string, error) {
	var b strings.Builder
	op := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	const t = "ip cni_hostport"
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
			match = "ip daddr " + hp.HostIP + " " + match
		}
		op("add rule %s %s %s dnat to %s comment %q", t, hostPortChain(version, hp), match, net4(podIP, hp.Port), containerID)
	}
	op("add rule %s masquerading ip saddr %s ip daddr %s masquerade comment %q", t, podIP, podIP, containerID)
	op("add rule %s masquerading ip saddr 127.0.0.1 ip daddr %s masquerade comment %q", t, podIP, containerID)
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
// (main.go cmdAdd): knftables.New's check, the transaction, and
// route_localnet on the node's interface towards the pod (the bridge),
// which snat sets so 127.0.0.1 can be DNAT'd across it.
func (c *cluster) portmapNFTAdd(n *node, p *pod) error {
	tx, err := portmapNFTTx(n.portmapNFT, p.sandboxID, p.ip, p.hostPorts())
	if err != nil {
		return err
	}
	if err := knftablesCheck(n, "ip cni_hostport"); err != nil {
		return fmt.Errorf("portmap %s add %s: %w", n.portmapNFT, p.name, err)
	}
	if err := runStdin(n.ns, tx, "nft", "-f", "-"); err != nil {
		return fmt.Errorf("portmap %s add %s: %w", n.portmapNFT, p.name, err)
	}
	if err := n.ns.Sysctl("net.ipv4.conf.cni0.route_localnet", "1"); err != nil {
		return fmt.Errorf("portmap %s add %s: %w", n.portmapNFT, p.name, err)
	}
	return nil
}
