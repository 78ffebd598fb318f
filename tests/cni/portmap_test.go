package cni

import (
	"encoding/json"
	"testing"
)

// TestPortmapConfig checks the stdin portmap gets: without the nftables
// backend it would write iptables rules, and without a prevResult
// interface named like CNI_IFNAME with a sandbox it writes nothing at all.
func TestPortmapConfig(t *testing.T) {
	s := Sandbox{ContainerID: "c1", NetNS: "/run/netns/trpm-pod", IP: "10.88.0.2/16",
		Mappings: []PortMapping{{HostPort: 8083, ContainerPort: 83, Protocol: "tcp", HostIP: "192.168.0.2"}}}
	b, err := Portmap{}.Config(s)
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		CNIVersion    string          `json:"cniVersion"`
		Name          string          `json:"name"`
		Type          string          `json:"type"`
		Backend       string          `json:"backend"`
		Capabilities  map[string]bool `json:"capabilities"`
		RuntimeConfig struct {
			PortMappings []PortMapping `json:"portMappings"`
		} `json:"runtimeConfig"`
		PrevResult struct {
			CNIVersion string `json:"cniVersion"`
			Interfaces []struct {
				Name, Sandbox string
			} `json:"interfaces"`
			IPs []struct {
				Address   string `json:"address"`
				Interface *int   `json:"interface"`
			} `json:"ips"`
		} `json:"prevResult"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	if conf.CNIVersion != "1.0.0" || conf.Type != "portmap" || conf.Name == "" || conf.Backend != "nftables" || !conf.Capabilities["portMappings"] {
		t.Errorf("config header wrong: %s", b)
	}
	if len(conf.RuntimeConfig.PortMappings) != 1 || conf.RuntimeConfig.PortMappings[0] != s.Mappings[0] {
		t.Errorf("portMappings = %+v, want %+v", conf.RuntimeConfig.PortMappings, s.Mappings)
	}
	pr := conf.PrevResult
	if pr.CNIVersion != "1.0.0" || len(pr.Interfaces) != 1 || pr.Interfaces[0].Name != "eth0" || pr.Interfaces[0].Sandbox != s.NetNS ||
		len(pr.IPs) != 1 || pr.IPs[0].Address != s.IP || pr.IPs[0].Interface == nil || *pr.IPs[0].Interface != 0 {
		t.Errorf("prevResult wrong: %s", b)
	}
	if _, err := (Portmap{}).Config(Sandbox{IP: "10.88.0.2"}); err == nil {
		t.Error("an address without its prefix length was accepted")
	}
}
