package cni

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	corev1 "k8s.io/api/core/v1"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// DebianPluginDir holds Debian's containernetworking-plugins (1.1.1:
// bridge, host-local, loopback, portmap with the iptables backend).
const DebianPluginDir = "/usr/lib/cni"

// ConfList is a CNI network configuration list, as a runtime reads it
// from /etc/cni/net.d: each plugin's config is kept as the JSON object it
// is, so fields this package does not know pass through to the plugin.
type ConfList struct {
	CNIVersion string           `json:"cniVersion"`
	Name       string           `json:"name"`
	Plugins    []map[string]any `json:"plugins"`
}

// NodeNetwork describes the conflist of a node: a bridge with host-local
// addresses from the node's PodCIDR, then portmap.
type NodeNetwork struct {
	Name   string // the network's name (portmap's rules carry it)
	Bridge string // the bridge device in the node's namespace
	Subnet string // the node's PodCIDR, host-local's range
	// DataDir is host-local's store of allocated addresses; a test's temp
	// dir, so nothing is written to the host's /var/lib/cni.
	DataDir string
	// PortmapBackend is "nftables" for portmap's nftables backend (v1.6+)
	// or "" for the iptables one, the only one Debian's 1.1.1 has.
	PortmapBackend string
}

// ConfList is the network's conflist: bridge (the node's gateway for the
// pods, hairpin so a pod reaches itself through a Service) with host-local
// IPAM and a default route, then portmap with the portMappings capability
// and its default snat. ipMasq stays off: the test node routes the pod CIDR
// (its uplink has a route back), so no SNAT hides which pod a packet came
// from.
func (n NodeNetwork) ConfList() ConfList {
	portmap := map[string]any{
		"type":         "portmap",
		"capabilities": map[string]any{"portMappings": true},
	}
	if n.PortmapBackend != "" {
		portmap["backend"] = n.PortmapBackend
	}
	return ConfList{
		CNIVersion: "1.0.0",
		Name:       n.Name,
		Plugins: []map[string]any{
			{
				"type":        "bridge",
				"bridge":      n.Bridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": n.Subnet}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": n.DataDir,
				},
			},
			portmap,
		},
	}
}

// PortMappingsOf is what a pod's spec asks the runtime for: the kubelet
// passes every containers[].ports[] entry (kubecontainer.MakePortMappings,
// dropping an entry whose name a container already used) and containerd
// hands portmap those with a hostPort, the protocol lower-cased, with
// their hostIP (toCNIPortMappings). The API server defaults an empty
// protocol to TCP; so does this.
func PortMappingsOf(pod *corev1.Pod) []PortMapping {
	var out []PortMapping
	for _, c := range pod.Spec.Containers {
		names := map[string]bool{}
		for _, p := range c.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			name := p.Name
			if name == "" {
				family := "any"
				if p.HostIP != "" {
					family = "v4"
					if strings.Contains(p.HostIP, ":") {
						family = "v6"
					}
				}
				name = fmt.Sprintf("%s-%s-%s:%d:%d", family, proto, p.HostIP, p.ContainerPort, p.HostPort)
			}
			if names[name] {
				continue
			}
			names[name] = true
			if p.HostPort <= 0 {
				continue
			}
			out = append(out, PortMapping{HostPort: int(p.HostPort), ContainerPort: int(p.ContainerPort),
				Protocol: strings.ToLower(string(proto)), HostIP: p.HostIP})
		}
	}
	return out
}

// Runtime runs a conflist's plugins for pod sandboxes as containerd and
// CRI-O do (libcni's AddNetworkList / DelNetworkList): each plugin is
// called with CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME and
// CNI_PATH, its config from the list with the list's name and cniVersion,
// the previous plugin's result as prevResult, and runtimeConfig holding
// only the capabilities it declares. DEL runs the list in reverse with the
// cached ADD result as prevResult. Before the list, loopback brings up
// the sandbox's lo, as the runtimes do with a network of its own.
type Runtime struct {
	// Node is the namespace the plugins run in, the runtime's own: the
	// bridge and portmap's rules land there.
	Node netlab.Namespace
	// Path is CNI_PATH: the directories searched for each plugin type, in
	// order (a portmap build ahead of Debian's directory wins).
	Path []string
	List ConfList

	mu      sync.Mutex
	results map[string]json.RawMessage
}

// PodSandbox is one pod's sandbox as the runtime passes it.
type PodSandbox struct {
	ContainerID string
	NetNS       string // CNI_NETNS, the pod's namespace path
	IfName      string // default eth0
	Mappings    []PortMapping
}

func (s PodSandbox) ifName() string {
	if s.IfName == "" {
		return "eth0"
	}
	return s.IfName
}

// Result is what a test needs of the list's final result.
type Result struct {
	Raw json.RawMessage
	// IP is the sandbox interface's address with its prefix.
	IP netip.Prefix
	// Gateway is the address's gateway (the bridge).
	Gateway netip.Addr
}

// Add runs loopback, then ADD of every plugin of the list in order.
func (r *Runtime) Add(s PodSandbox) (Result, error) {
	if _, err := r.exec("ADD", loopbackConf(r.List.CNIVersion), PodSandbox{ContainerID: s.ContainerID, NetNS: s.NetNS, IfName: "lo"}); err != nil {
		return Result{}, fmt.Errorf("cni add %s: loopback: %w", s.ContainerID, err)
	}
	var prev json.RawMessage
	for i, p := range r.List.Plugins {
		conf, err := r.pluginConf(p, prev, s)
		if err != nil {
			return Result{}, fmt.Errorf("cni add %s: %w", s.ContainerID, err)
		}
		out, err := r.exec("ADD", conf, s)
		if err != nil {
			return Result{}, fmt.Errorf("cni add %s: plugin %d (%v): %w", s.ContainerID, i, p["type"], err)
		}
		prev = out
	}
	r.mu.Lock()
	if r.results == nil {
		r.results = map[string]json.RawMessage{}
	}
	r.results[s.ContainerID] = prev
	r.mu.Unlock()
	res, err := parseResult(prev, s.ifName())
	if err != nil {
		return Result{}, fmt.Errorf("cni add %s: %w", s.ContainerID, err)
	}
	return res, nil
}

// Del runs DEL of every plugin in reverse order, each with the cached ADD
// result as prevResult, then loopback's.
func (r *Runtime) Del(s PodSandbox) error {
	r.mu.Lock()
	prev := r.results[s.ContainerID]
	delete(r.results, s.ContainerID)
	r.mu.Unlock()
	for i := len(r.List.Plugins) - 1; i >= 0; i-- {
		p := r.List.Plugins[i]
		conf, err := r.pluginConf(p, prev, s)
		if err != nil {
			return fmt.Errorf("cni del %s: %w", s.ContainerID, err)
		}
		if _, err := r.exec("DEL", conf, s); err != nil {
			return fmt.Errorf("cni del %s: plugin %d (%v): %w", s.ContainerID, i, p["type"], err)
		}
	}
	if _, err := r.exec("DEL", loopbackConf(r.List.CNIVersion), PodSandbox{ContainerID: s.ContainerID, NetNS: s.NetNS, IfName: "lo"}); err != nil {
		return fmt.Errorf("cni del %s: loopback: %w", s.ContainerID, err)
	}
	return nil
}

func loopbackConf(version string) []byte {
	b, _ := json.Marshal(map[string]string{"cniVersion": version, "name": "cni-loopback", "type": "loopback"})
	return b
}

// pluginConf is what libcni's buildOneConfig and injectRuntimeConfig give
// a plugin: its own config, the list's name and cniVersion, prevResult
// when there is one, runtimeConfig entries for declared capabilities only.
func (r *Runtime) pluginConf(p map[string]any, prev json.RawMessage, s PodSandbox) ([]byte, error) {
	conf := map[string]any{}
	for k, v := range p {
		conf[k] = v
	}
	conf["name"] = r.List.Name
	conf["cniVersion"] = r.List.CNIVersion
	if prev != nil {
		conf["prevResult"] = prev
	}
	if caps, ok := p["capabilities"].(map[string]any); ok && caps["portMappings"] == true && len(s.Mappings) > 0 {
		conf["runtimeConfig"] = map[string]any{"portMappings": s.Mappings}
	}
	b, err := json.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("encode %v config: %w", p["type"], err)
	}
	return b, nil
}

// exec runs the plugin named by conf's type, found in Path, in the node's
// namespace (`ip netns exec`, so it and the tools it starts see only that
// namespace) and returns its stdout.
func (r *Runtime) exec(command string, conf []byte, s PodSandbox) ([]byte, error) {
	if r.Node.Name == "" {
		return nil, fmt.Errorf("run plugin: no node namespace")
	}
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(conf, &head); err != nil {
		return nil, fmt.Errorf("read plugin type: %w", err)
	}
	bin, err := r.find(head.Type)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", r.Node.Name, bin)
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+s.ContainerID,
		"CNI_NETNS="+s.NetNS,
		"CNI_IFNAME="+s.ifName(),
		"CNI_PATH="+strings.Join(r.Path, string(os.PathListSeparator)),
	)
	cmd.Stdin = bytes.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		// A CNI plugin reports its error as JSON on stdout.
		return nil, fmt.Errorf("%s %s: %w: %s %s", bin, command, err, strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// find is the first executable named typ in Path, as libcni's FindInPath.
func (r *Runtime) find(typ string) (string, error) {
	if typ == "" || strings.ContainsRune(typ, '/') {
		return "", fmt.Errorf("find plugin: bad type %q", typ)
	}
	for _, dir := range r.Path {
		p := filepath.Join(dir, typ)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("find plugin %s in %v: not found", typ, r.Path)
}

// parseResult reads a CNI 1.0.0 result: the address on the interface
// named ifName inside the sandbox.
func parseResult(raw json.RawMessage, ifName string) (Result, error) {
	var res struct {
		Interfaces []struct {
			Name    string `json:"name"`
			Sandbox string `json:"sandbox"`
		} `json:"interfaces"`
		IPs []struct {
			Address   string `json:"address"`
			Gateway   string `json:"gateway"`
			Interface *int   `json:"interface"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return Result{}, fmt.Errorf("decode result: %w", err)
	}
	for _, ip := range res.IPs {
		if ip.Interface == nil || *ip.Interface < 0 || *ip.Interface >= len(res.Interfaces) {
			continue
		}
		iface := res.Interfaces[*ip.Interface]
		if iface.Name != ifName || iface.Sandbox == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			return Result{}, fmt.Errorf("result address %q: %w", ip.Address, err)
		}
		gw, _ := netip.ParseAddr(ip.Gateway)
		return Result{Raw: raw, IP: pfx, Gateway: gw}, nil
	}
	return Result{}, fmt.Errorf("result has no address on sandbox interface %s: %s", ifName, raw)
}
