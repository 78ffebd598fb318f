package lab

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/rules"
)

// containerPort is a port of a pod's container; HostPort > 0 asks portmap
// for a hostPort.
type containerPort struct {
	Name     string
	Proto    string // tcp or udp
	Port     int
	HostPort int
	HostIP   string // the hostPort only on this node address
}

// pod is a Kubernetes pod: its own namespace wired by the CNI plugins, or
// the node's namespace for a hostNetwork pod.
type pod struct {
	namespace, name string
	node            *node
	ns              netlab.Namespace
	ip              string
	ip6             string // in a dual-stack cluster
	uid             string
	sandboxID       string // CNI_CONTAINERID: the pause container's id
	containerID     string // the app container's id (containerStatuses)
	hostNetwork     bool
	ports           []containerPort
	// dnatChain is the CNI-DN-* chain portmap writes for the hostPorts, as
	// the tracer names it (the tests check portmap really wrote it).
	dnatChain string
}

func (p *pod) hostPorts() []containerPort {
	var hp []containerPort
	for _, cp := range p.ports {
		if cp.HostPort > 0 {
			hp = append(hp, cp)
		}
	}
	return hp
}

// addPod creates a pod on n the way a container runtime does: a namespace,
// then the bridge plugin (host-local IPAM), then portmap with the bridge's
// result as prevResult when the pod has hostPorts, then its servers.
func (c *cluster) addPod(n *node, namespace, name string, ports ...containerPort) (*pod, error) {
	ns, err := c.lab.Namespace(name)
	if err != nil {
		return nil, fmt.Errorf("create pod %s: %w", name, err)
	}
	p := &pod{namespace: namespace, name: name, node: n, ns: ns, uid: newUID(),
		sandboxID: randomHex(64), containerID: randomHex(64), ports: ports}
	result, err := c.bridgeAdd(n, p)
	if err != nil {
		return nil, err
	}
	if p.ip, p.ip6, err = sandboxIPs(result); err != nil {
		return nil, fmt.Errorf("pod %s: %w", name, err)
	}
	switch {
	case len(p.hostPorts()) == 0:
	case n.portmapNFT != "":
		err = c.portmapNFTAdd(n, p)
	default:
		err = c.portmapAdd(n, p, result)
	}
	if err != nil {
		return nil, err
	}
	if err := c.serve(ns, name, ports); err != nil {
		return nil, err
	}
	c.pods = append(c.pods, p)
	return p, nil
}

// addHostNetworkPod is a pod with hostNetwork: true; its servers listen in
// the node's own namespace.
func (c *cluster) addHostNetworkPod(n *node, namespace, name string, ports ...containerPort) (*pod, error) {
	p := &pod{namespace: namespace, name: name, node: n, ns: n.ns, ip: n.ip, ip6: n.ip6, uid: newUID(),
		sandboxID: randomHex(64), containerID: randomHex(64), hostNetwork: true, ports: ports}
	if err := c.serve(n.ns, name, ports); err != nil {
		return nil, err
	}
	c.pods = append(c.pods, p)
	return p, nil
}

// bridgeAdd runs the bridge plugin with host-local IPAM, as flannel's
// cbr0 conflist does, and returns its result.
func (c *cluster) bridgeAdd(n *node, p *pod) ([]byte, error) {
	_, subnet, err := net.ParseCIDR(n.podCIDR)
	if err != nil {
		return nil, fmt.Errorf("pod cidr %s: %w", n.podCIDR, err)
	}
	gw := make(net.IP, 4)
	copy(gw, subnet.IP.To4())
	gw[3]++
	ranges := [][]map[string]string{{{"subnet": n.podCIDR, "gateway": gw.String()}}}
	routes := []map[string]string{{"dst": "0.0.0.0/0"}}
	if n.podCIDR6 != "" {
		// A dual-stack network: host-local gives the pod one address of
		// each range, as a dual-stack flannel or kindnet conflist asks.
		p6, err := netip.ParsePrefix(n.podCIDR6)
		if err != nil {
			return nil, fmt.Errorf("pod cidr %s: %w", n.podCIDR6, err)
		}
		ranges = append(ranges, []map[string]string{{"subnet": n.podCIDR6, "gateway": p6.Addr().Next().String()}})
		routes = append(routes, map[string]string{"dst": "::/0"})
	}
	conf := map[string]any{
		"cniVersion":  "1.0.0",
		"name":        netName,
		"type":        "bridge",
		"bridge":      "cni0",
		"isGateway":   true,
		"hairpinMode": true,
		"ipam": map[string]any{
			"type":    "host-local",
			"ranges":  ranges,
			"routes":  routes,
			"dataDir": filepath.Join(c.stateDir, n.name, "ipam"),
		},
	}
	out, err := c.runPlugin(n, p, "bridge", conf)
	if err != nil {
		return nil, fmt.Errorf("cni bridge add %s: %w", p.name, err)
	}
	return out, nil
}

// portmapAdd runs portmap with runtimeConfig.portMappings and the bridge's
// result as prevResult, exactly as the runtime chains a conflist.
func (c *cluster) portmapAdd(n *node, p *pod, prevResult []byte) error {
	var mappings []map[string]any
	for _, hp := range p.hostPorts() {
		mappings = append(mappings, map[string]any{
			"hostPort": hp.HostPort, "containerPort": hp.Port, "protocol": hp.Proto,
		})
	}
	conf := map[string]any{
		"cniVersion":    "1.0.0",
		"name":          netName,
		"type":          "portmap",
		"capabilities":  map[string]bool{"portMappings": true},
		"snat":          true,
		"runtimeConfig": map[string]any{"portMappings": mappings},
		"prevResult":    json.RawMessage(prevResult),
	}
	if _, err := c.runPlugin(n, p, "portmap", conf); err != nil {
		return fmt.Errorf("cni portmap add %s: %w", p.name, err)
	}
	p.dnatChain = rules.PortmapChainName(netName, p.sandboxID)
	if n.portmapFirst {
		if err := portmapJumpsFirst(n, "iptables"); err != nil {
			return err
		}
		if p.ip6 != "" {
			if err := portmapJumpsFirst(n, "ip6tables"); err != nil {
				return err
			}
		}
	}
	for _, kp := range []*kubeProxy{n.kp, n.kp6} {
		if kp == nil {
			continue
		}
		if err := kp.keepStandInLast(); err != nil {
			return err
		}
	}
	return nil
}

// runPlugin executes a CNI plugin inside the node's namespace (so it writes
// its links and rules there, never in the host's), with the pod's
// namespace as CNI_NETNS.
func (c *cluster) runPlugin(n *node, p *pod, plugin string, conf map[string]any) ([]byte, error) {
	in, err := json.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("encode %s config: %w", plugin, err)
	}
	cmd := exec.Command("ip", "netns", "exec", n.ns.Name, filepath.Join(c.env.CNIPath, plugin))
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND=ADD",
		"CNI_CONTAINERID="+p.sandboxID,
		"CNI_NETNS="+p.ns.Path(),
		"CNI_IFNAME=eth0",
		"CNI_PATH="+c.env.CNIPath,
	)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		// A CNI plugin reports its error as JSON on stdout.
		return nil, fmt.Errorf("%w: %s %s", err, strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// cniResult is the part of a CNI 1.0 result portmap relies on.
type cniResult struct {
	Interfaces []struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox"`
	} `json:"interfaces"`
	IPs []struct {
		Address   string `json:"address"`
		Interface *int   `json:"interface"`
	} `json:"ips"`
}

// sandboxIPs returns the pod's IPv4 address and its IPv6 one (if any) from
// a bridge result, and insists the addresses point to an interface with a
// sandbox: without it portmap silently writes no rule at all.
func sandboxIPs(result []byte) (ip4, ip6 string, err error) {
	var r cniResult
	if err := json.Unmarshal(result, &r); err != nil {
		return "", "", fmt.Errorf("decode cni result: %w", err)
	}
	for _, ip := range r.IPs {
		if ip.Interface == nil || *ip.Interface < 0 || *ip.Interface >= len(r.Interfaces) {
			continue
		}
		if r.Interfaces[*ip.Interface].Sandbox == "" {
			continue
		}
		addr, _, err := net.ParseCIDR(ip.Address)
		if err != nil {
			return "", "", fmt.Errorf("cni result address %q: %w", ip.Address, err)
		}
		switch {
		case addr.To4() != nil && ip4 == "":
			ip4 = addr.String()
		case addr.To4() == nil && ip6 == "":
			ip6 = addr.String()
		}
	}
	if ip4 == "" {
		return "", "", fmt.Errorf("cni result has no IPv4 address on a sandbox interface: %s", result)
	}
	return ip4, ip6, nil
}

// portmapJumpsFirst moves portmap's PREROUTING and OUTPUT jumps to the top
// of their chains, where portmap ≤ 0.7.4 put them (CVE-2019-9946): the
// order of the seed's cluster, ahead of kube-proxy's KUBE-SERVICES.
func portmapJumpsFirst(n *node, iptables string) error {
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		rule := []string{chain, "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"}
		if _, err := n.ns.Run(iptables, append([]string{"-w", "-t", "nat", "-D"}, rule...)...); err != nil {
			return fmt.Errorf("move portmap jump in %s: %w", chain, err)
		}
		ins := append([]string{"-w", "-t", "nat", "-I", chain, "1"}, rule[1:]...)
		if _, err := n.ns.Run(iptables, ins...); err != nil {
			return fmt.Errorf("move portmap jump in %s: %w", chain, err)
		}
	}
	return nil
}
