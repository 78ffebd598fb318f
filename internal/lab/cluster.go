package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// Addresses shared by every scenario (each scenario has its own
// namespaces, so they never collide).
const (
	lanCIDRBits = "/24"
	clusterCIDR = "10.244.0.0/16"
	netName     = "cbr0" // the CNI network name, as flannel's conflist
)

// cluster is one scenario's nodes, pods and Services, joined by a LAN: a
// bridge in its own namespace, so a reply can go from one node straight to
// an outside client without passing the node that DNAT'd the request.
type cluster struct {
	env      *Env
	scenario string
	lab      *netlab.Lab
	lan      netlab.Namespace
	lanPorts int
	stateDir string
	// dualStack gives nodes, pods and outside hosts an IPv6 address
	// beside the IPv4 one (ip6Of), and the servers listen on both.
	dualStack bool

	nodes    []*node
	outside  []*host
	pods     []*pod
	services []*service
	closers  []func() error
}

// node is a Kubernetes node: a namespace with eth0 on the LAN, a cni0
// bridge made by the bridge plugin, and (optionally) kube-proxy's state.
type node struct {
	name    string // the Kubernetes node name
	ns      netlab.Namespace
	ip      string // on the LAN
	podCIDR string
	// ip6 and podCIDR6 are the IPv6 twins of a dual-stack cluster's node.
	ip6, podCIDR6 string
	kp            *kubeProxy
	// kp6 is kube-proxy's IPv6 proxier on a dual-stack node (IPVS mode).
	kp6 *kubeProxy
	// kpNFT is kube-proxy in nftables mode, instead of kp.
	kpNFT *kubeProxyNFT
	// portmapNFT is the portmap release whose nftables backend writes the
	// hostPorts ("v1.10.0", "v1.8.0"); "" runs Debian's portmap 1.1.1 with
	// iptables.
	portmapNFT string
	// policyNFT: the lab's own network policy is a native table.
	policyNFT bool
	// portmapFirst reproduces portmap ≤ 0.7.4, which prepended its jump to
	// CNI-HOSTPORT-DNAT ahead of kube-proxy's KUBE-SERVICES.
	portmapFirst bool
}

// nftables says the node's kube-proxy, portmap or policy writes native
// nftables tables: the lab proves what they did from `nft -a list ruleset`.
func (n *node) nftables() bool { return n.kpNFT != nil || n.portmapNFT != "" || n.policyNFT }

// host is a machine outside the cluster on the LAN.
type host struct {
	name string
	ns   netlab.Namespace
	ip   string
	ip6  string // in a dual-stack cluster
}

func newCluster(env *Env, scenario string) (*cluster, error) {
	l, err := netlab.New(Prefix + "-" + scenario)
	if err != nil {
		return nil, fmt.Errorf("start lab %s: %w", scenario, err)
	}
	c := &cluster{env: env, scenario: scenario, lab: l, stateDir: filepath.Join(stateRoot, scenario)}
	if err := os.RemoveAll(c.stateDir); err != nil {
		return nil, fmt.Errorf("remove old state %s: %w", c.stateDir, err)
	}
	c.lan, err = l.Namespace("lan")
	if err != nil {
		c.close()
		return nil, fmt.Errorf("create lan: %w", err)
	}
	if err := runAll(c.lan, [][]string{
		{"ip", "link", "add", "br0", "type", "bridge"},
		{"ip", "link", "set", "br0", "up"},
	}); err != nil {
		c.close()
		return nil, fmt.Errorf("create lan bridge: %w", err)
	}
	return c, nil
}

// The IPv6 twins of the cluster's IPv4 addresses in a dual-stack
// cluster: the LAN 172.18.0.0/24 is fd18::/64 (172.18.0.N is fd18::N),
// ClusterIPs 10.96.0.N are fd96::N, load-balancer IPs 192.168.1.N are
// fd19::N, the cluster CIDR is fd44::/48, node-N's pod CIDR 10.244.N.0/24
// is fd44:0:0:N::/64, the service CIDR fd96::/108.
const (
	lanCIDRBits6 = "/64"
	clusterCIDR6 = "fd44::/48"
	serviceCIDR6 = "fd96::/108"
)

var twinPrefixes = map[string]string{"172.18.0.": "fd18::", "10.96.0.": "fd96::", "192.168.1.": "fd19::"}

// ip6Of is the IPv6 twin of a LAN, ClusterIP or load-balancer address
// ("" for any other).
func ip6Of(v4 string) string {
	i := strings.LastIndexByte(v4, '.') + 1
	if p, ok := twinPrefixes[v4[:i]]; ok {
		return p + v4[i:]
	}
	return ""
}

func podCIDR6Of(podCIDR string) string {
	third := strings.Split(podCIDR, ".")[2]
	return "fd44:0:0:" + third + "::/64"
}

// plug connects ns to the LAN bridge with eth0 = cidr (and cidr6 when
// set). The veth is created inside the LAN namespace with its peer
// directly in ns, so the host's namespace never holds either end.
func (c *cluster) plug(ns netlab.Namespace, cidr, cidr6 string) error {
	port := fmt.Sprintf("lp%d", c.lanPorts)
	c.lanPorts++
	if _, err := c.lan.Run("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns.Name); err != nil {
		return fmt.Errorf("plug %s into lan: %w", ns.Name, err)
	}
	if _, err := c.lan.Run("ip", "link", "set", port, "master", "br0", "up"); err != nil {
		return fmt.Errorf("plug %s into lan: %w", ns.Name, err)
	}
	cmds := [][]string{{"ip", "addr", "add", cidr, "dev", "eth0"}}
	if cidr6 != "" {
		// nodad: usable at once; the lab's addresses are unique by design.
		cmds = append(cmds, []string{"ip", "-6", "addr", "add", cidr6, "dev", "eth0", "nodad"})
	}
	return runAll(ns, append(cmds, []string{"ip", "link", "set", "eth0", "up"}))
}

// addNode creates a node with eth0 = ip on the LAN and podCIDR for cni0.
func (c *cluster) addNode(name, ip, podCIDR string) (*node, error) {
	ns, err := c.lab.Namespace(name)
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", name, err)
	}
	n := &node{name: name, ns: ns, ip: ip, podCIDR: podCIDR}
	cidr6 := ""
	if c.dualStack {
		n.ip6, n.podCIDR6 = ip6Of(ip), podCIDR6Of(podCIDR)
		cidr6 = n.ip6 + lanCIDRBits6
	}
	if err := c.plug(ns, ip+lanCIDRBits, cidr6); err != nil {
		return nil, err
	}
	// A node forwards; it must not answer a DNAT back out of the interface
	// it came in on with an ICMP redirect, which would be noise in a trace.
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv4.conf.all.send_redirects", "0"},
		{"net.ipv4.conf.default.send_redirects", "0"},
		{"net.ipv4.conf.eth0.send_redirects", "0"},
	} {
		if err := ns.Sysctl(kv[0], kv[1]); err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
	}
	if c.dualStack {
		if err := ns.Sysctl("net.ipv6.conf.all.forwarding", "1"); err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
	}
	c.nodes = append(c.nodes, n)
	return n, nil
}

// addOutside creates a machine on the LAN outside the cluster whose
// default route is gw (the node a cloud load balancer would pick).
func (c *cluster) addOutside(name, ip, gw string) (*host, error) {
	ns, err := c.lab.Namespace(name)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", name, err)
	}
	h := &host{name: name, ns: ns, ip: ip}
	cidr6 := ""
	if c.dualStack {
		h.ip6 = ip6Of(ip)
		cidr6 = h.ip6 + lanCIDRBits6
	}
	if err := c.plug(ns, ip+lanCIDRBits, cidr6); err != nil {
		return nil, err
	}
	if _, err := ns.Run("ip", "route", "add", "default", "via", gw); err != nil {
		return nil, fmt.Errorf("route %s via %s: %w", name, gw, err)
	}
	if c.dualStack {
		if _, err := ns.Run("ip", "-6", "route", "add", "default", "via", ip6Of(gw)); err != nil {
			return nil, fmt.Errorf("route %s via %s: %w", name, ip6Of(gw), err)
		}
	}
	c.outside = append(c.outside, h)
	return h, nil
}

// routeNodes gives every node a route to every other node's pod CIDR, as
// flannel's host-gw backend does.
func (c *cluster) routeNodes() error {
	for _, a := range c.nodes {
		for _, b := range c.nodes {
			if a == b {
				continue
			}
			if _, err := a.ns.Run("ip", "route", "add", b.podCIDR, "via", b.ip); err != nil {
				return fmt.Errorf("route %s to %s: %w", a.name, b.podCIDR, err)
			}
			if b.podCIDR6 == "" {
				continue
			}
			if _, err := a.ns.Run("ip", "-6", "route", "add", b.podCIDR6, "via", b.ip6); err != nil {
				return fmt.Errorf("route %s to %s: %w", a.name, b.podCIDR6, err)
			}
		}
	}
	return nil
}

// close stops the servers, deletes the namespaces and the IPAM state.
func (c *cluster) close() error {
	var errs []error
	for i := len(c.closers) - 1; i >= 0; i-- {
		errs = append(errs, c.closers[i]())
	}
	c.closers = nil
	errs = append(errs, c.lab.Close())
	if err := os.RemoveAll(c.stateDir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", c.stateDir, err))
	}
	return errors.Join(errs...)
}

// built wraps the cluster as a Built observed at node (and extra), whose
// Traffic makes atts.
func (c *cluster) built(n *node, atts []attempt, extra ...netlab.Namespace) (*Built, error) {
	if err := c.settleIPv6(); err != nil {
		return nil, err
	}
	meta, err := c.metadata()
	if err != nil {
		return nil, err
	}
	mode := c.mode()
	return &Built{
		Node:         n.ns,
		Observe:      append([]netlab.Namespace{n.ns}, extra...),
		MetadataJSON: meta,
		NodeName:     n.name,
		Mode:         mode,
		Planned:      planned(atts),
		Traffic:      func(ctx context.Context) ([]Expectation, error) { return c.run(ctx, n, atts) },
		Close:        c.close,
		cluster:      c,
	}, nil
}

// settleIPv6 waits until no IPv6 address of the cluster is tentative.
// The bridge plugin waits for the pod's own addresses but not for cni0's
// gateway address: until its duplicate address detection ends, a pod's
// neighbour solicitation for the gateway goes unanswered, and its first
// replies wait seconds while the client retransmits, which is the lab's
// doing, not the incident's.
func (c *cluster) settleIPv6() error {
	if !c.dualStack {
		return nil
	}
	var spaces []netlab.Namespace
	for _, n := range c.nodes {
		spaces = append(spaces, n.ns)
	}
	for _, h := range c.outside {
		spaces = append(spaces, h.ns)
	}
	for _, p := range c.pods {
		if !p.hostNetwork {
			spaces = append(spaces, p.ns)
		}
	}
	return netlab.SettleIPv6(10*time.Second, spaces...)
}

// mode says how kube-proxy's service handling ran, and with nftables
// which portmap backend wrote the hostPorts.
func (c *cluster) mode() string {
	mode := "no kube-proxy"
	for _, n := range c.nodes {
		switch {
		case n.kp != nil && n.kp.ipvs:
			mode = "ipvs"
		case n.kp != nil:
			mode = "iptables stand-in for IPVS"
		case n.kpNFT != nil:
			mode = "nftables (kube-proxy v1.37.2)"
		}
	}
	for _, n := range c.nodes {
		if n.portmapNFT != "" {
			return mode + ", portmap " + n.portmapNFT + " nftables backend"
		}
	}
	return mode
}

func randomHex(n int) string {
	b := make([]byte, n/2)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on Linux
	}
	return hex.EncodeToString(b)
}

func newUID() string {
	h := randomHex(32)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func runAll(ns netlab.Namespace, cmds [][]string) error {
	for _, c := range cmds {
		if _, err := ns.Run(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

func planned(atts []attempt) []Planned {
	out := make([]Planned, len(atts))
	for i, a := range atts {
		out[i] = Planned{Proto: a.exp.Proto, Src: a.srcIP, Dst: a.dst}
	}
	return out
}
