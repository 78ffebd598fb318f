// Package cni runs real CNI plugin binaries the way a container runtime
// does, for tests that need the rules those plugins write. It is a package
// of its own, not part of cphelper (which only builds the binaries), so its
// privileged tests are not run with the control-plane suite and a test
// elsewhere can import it without the API-server helpers.
package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// PortMapping is one entry of runtimeConfig.portMappings, as the kubelet
// passes a container's hostPort to the runtime.
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"` // tcp, udp or sctp
	HostIP        string `json:"hostIP,omitempty"`
}

// Portmap runs one portmap binary with the nftables backend.
type Portmap struct {
	// Plugin is the path of the portmap binary (cphelper.EnsurePortmap).
	Plugin string
	// Node is the namespace the plugin runs in and writes its tables to:
	// the node's namespace, as the runtime's own.
	Node netlab.Namespace
	// NetName is the network's name in the config (default "trpm").
	NetName string
}

// Sandbox is the pod the mappings are for.
type Sandbox struct {
	// ContainerID is CNI_CONTAINERID; portmap puts it in every rule's
	// comment and deletes by it.
	ContainerID string
	// NetNS is CNI_NETNS, the pod's namespace path. portmap never enters
	// it, but the runtime always passes it and skel refuses ADD without it.
	NetNS string
	// IfName is CNI_IFNAME (default eth0); the prevResult's interface
	// carries the same name, or portmap skips the address.
	IfName string
	// IP is the pod's address with its prefix ("10.88.0.2/16"), given to
	// portmap as the prevResult a main plugin would return; IP6, when set,
	// its IPv6 address on a dual-stack network ("fd88::2/64").
	IP, IP6 string
	// Mappings become runtimeConfig.portMappings.
	Mappings []PortMapping
}

func (s Sandbox) ifName() string {
	if s.IfName == "" {
		return "eth0"
	}
	return s.IfName
}

// Add runs CNI ADD and returns the plugin's result (the prevResult passed
// through).
func (p Portmap) Add(s Sandbox) ([]byte, error) {
	out, err := p.run("ADD", s)
	if err != nil {
		return nil, fmt.Errorf("portmap add %s: %w", s.ContainerID, err)
	}
	return out, nil
}

// Del runs CNI DEL, which removes every rule whose comment is the container
// id and leaves the table and chains.
func (p Portmap) Del(s Sandbox) error {
	if _, err := p.run("DEL", s); err != nil {
		return fmt.Errorf("portmap del %s: %w", s.ContainerID, err)
	}
	return nil
}

// Config is the network configuration portmap reads on stdin: a chained
// plugin with the portMappings capability, the nftables backend, and the
// pod's address as prevResult. snat is left to its default (true), as in
// the conflists runtimes ship.
func (p Portmap) Config(s Sandbox) ([]byte, error) {
	name := p.NetName
	if name == "" {
		name = "trpm"
	}
	if !strings.Contains(s.IP, "/") || s.IP6 != "" && !strings.Contains(s.IP6, "/") {
		return nil, fmt.Errorf("sandbox ips %q %q: want addresses with their prefix length", s.IP, s.IP6)
	}
	iface := 0
	ips := []map[string]any{{"address": s.IP, "interface": &iface}}
	if s.IP6 != "" {
		ips = append(ips, map[string]any{"address": s.IP6, "interface": &iface})
	}
	conf := map[string]any{
		"cniVersion":    "1.0.0",
		"name":          name,
		"type":          "portmap",
		"backend":       "nftables",
		"capabilities":  map[string]bool{"portMappings": true},
		"runtimeConfig": map[string]any{"portMappings": s.Mappings},
		"prevResult": map[string]any{
			"cniVersion": "1.0.0",
			"interfaces": []map[string]string{{"name": s.ifName(), "sandbox": s.NetNS}},
			"ips":        ips,
		},
	}
	b, err := json.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("encode portmap config: %w", err)
	}
	return b, nil
}

// run executes the plugin with `ip netns exec`, so the plugin and the nft
// it starts see only the node's namespace: its tables can land nowhere
// else.
func (p Portmap) run(command string, s Sandbox) ([]byte, error) {
	if p.Node.Name == "" {
		return nil, fmt.Errorf("portmap %s: no node namespace", command)
	}
	in, err := p.Config(s)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", p.Node.Name, p.Plugin)
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+s.ContainerID,
		"CNI_NETNS="+s.NetNS,
		"CNI_IFNAME="+s.ifName(),
		"CNI_PATH="+filepath.Dir(p.Plugin),
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

// HostState is what a test running portmap must leave as it found it in
// the host's namespace: the nft ruleset and the route_localnet sysctls
// that are set (portmap sets it where it runs). Compare it before and
// after: a plugin run in the wrong namespace shows up here. Unset ones are
// left out because other tests' veths pass through the host's namespace
// on their way to theirs (netlab.Link), appearing and vanishing with
// route_localnet 0 while this runs.
func HostState() (string, error) {
	out, err := exec.Command("nft", "list", "ruleset").Output()
	if err != nil {
		return "", fmt.Errorf("list the host's ruleset: %w", err)
	}
	var b strings.Builder
	b.Write(out)
	paths, err := filepath.Glob("/proc/sys/net/ipv4/conf/*/route_localnet")
	if err != nil {
		return "", fmt.Errorf("list route_localnet sysctls: %w", err)
	}
	for _, p := range paths {
		v, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // such a passing veth, gone since the glob
		}
		if err != nil {
			return "", fmt.Errorf("read the host's %s: %w", p, err)
		}
		if strings.TrimSpace(string(v)) != "0" {
			fmt.Fprintf(&b, "%s=%s", p, v)
		}
	}
	return b.String(), nil
}
