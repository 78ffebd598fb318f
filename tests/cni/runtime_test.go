package cni

import (
	"encoding/json"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestPortMappingsOf checks the kubelet's and containerd's rules: only
// ports with a hostPort, the protocol lower-cased (TCP when unset), hostIP
// kept, a port name used twice in a container taken once.
func TestPortMappingsOf(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "a", Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: 80, HostPort: 8080, Protocol: corev1.ProtocolTCP},
			{Name: "http", ContainerPort: 81, HostPort: 8081, Protocol: corev1.ProtocolTCP}, // same name: dropped
			{Name: "metrics", ContainerPort: 9090},                                          // no hostPort
			{ContainerPort: 53, HostPort: 5353, Protocol: corev1.ProtocolUDP, HostIP: "192.0.2.7"},
			{ContainerPort: 3306, HostPort: 3306},
		}},
		{Name: "b", Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: 8443, HostPort: 443, Protocol: corev1.ProtocolSCTP}, // other container: kept
		}},
	}}}
	want := []PortMapping{
		{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"},
		{HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: "192.0.2.7"},
		{HostPort: 3306, ContainerPort: 3306, Protocol: "tcp"},
		{HostPort: 443, ContainerPort: 8443, Protocol: "sctp"},
	}
	if got := PortMappingsOf(pod); !slices.Equal(got, want) {
		t.Errorf("PortMappingsOf = %+v, want %+v", got, want)
	}
}

// TestPluginConf checks what each plugin of the list gets on stdin: the
// list's name and cniVersion, the previous result as prevResult, and
// runtimeConfig.portMappings only for the plugin declaring the capability.
func TestPluginConf(t *testing.T) {
	r := &Runtime{List: NodeNetwork{Name: "trki", Bridge: "cni0", Subnet: "10.180.0.0/24", DataDir: "/tmp/x", PortmapBackend: "nftables"}.ConfList()}
	s := PodSandbox{ContainerID: "c1", Mappings: []PortMapping{{HostPort: 3306, ContainerPort: 3306, Protocol: "tcp"}}}
	prev := json.RawMessage(`{"cniVersion":"1.0.0","ips":[{"address":"10.180.0.5/24","interface":2}]}`)
	type conf struct {
		Name, CNIVersion, Type, Backend string
		PrevResult                      json.RawMessage
		RuntimeConfig                   *struct{ PortMappings []PortMapping }
		IPAM                            *struct {
			Type, DataDir string
			Ranges        [][]struct{ Subnet string }
		}
	}
	decode := func(p map[string]any, prev json.RawMessage) conf {
		b, err := r.pluginConf(p, prev, s)
		if err != nil {
			t.Fatal(err)
		}
		var c conf
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	bridge := decode(r.List.Plugins[0], nil)
	if bridge.Type != "bridge" || bridge.Name != "trki" || bridge.CNIVersion != "1.0.0" || bridge.PrevResult != nil || bridge.RuntimeConfig != nil {
		t.Errorf("bridge config wrong: %+v", bridge)
	}
	if bridge.IPAM == nil || bridge.IPAM.Type != "host-local" || bridge.IPAM.DataDir != "/tmp/x" ||
		len(bridge.IPAM.Ranges) != 1 || len(bridge.IPAM.Ranges[0]) != 1 || bridge.IPAM.Ranges[0][0].Subnet != "10.180.0.0/24" {
		t.Errorf("bridge ipam wrong: %+v", bridge.IPAM)
	}
	pm := decode(r.List.Plugins[1], prev)
	if pm.Type != "portmap" || pm.Backend != "nftables" || string(pm.PrevResult) != string(prev) ||
		pm.RuntimeConfig == nil || !slices.Equal(pm.RuntimeConfig.PortMappings, s.Mappings) {
		t.Errorf("portmap config wrong: %+v", pm)
	}
	if _, ok := r.List.Plugins[1]["runtimeConfig"]; ok {
		t.Error("pluginConf wrote runtimeConfig into the list itself")
	}
}

// TestParseResult reads the sandbox interface's address, not the
// bridge's or the host veth's.
func TestParseResult(t *testing.T) {
	raw := json.RawMessage(`{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"x"},{"name":"veth1","mac":"y"},{"name":"eth0","mac":"z","sandbox":"/run/netns/p"}],
		"ips":[{"address":"10.180.0.7/24","gateway":"10.180.0.1","interface":2}]}`)
	res, err := parseResult(raw, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if res.IP.String() != "10.180.0.7/24" || res.Gateway.String() != "10.180.0.1" {
		t.Errorf("result = %+v", res)
	}
	if _, err := parseResult(raw, "eth1"); err == nil {
		t.Error("no error for a result without the sandbox interface")
	}
}
