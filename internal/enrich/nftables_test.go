package enrich

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// portmapNode is a node whose only rules are what the real portmap wrote
// with its nftables backend (internal/nft/testdata, captured by
// tests/cni): hostPorts tcp 8080 -> 10.88.0.2:80 and, for host IP
// 192.168.0.2, tcp 8083 -> 10.88.0.2:83, of container 4f2a9c1e0b7d.
func portmapNode(t *testing.T, version string) *trace.Snapshot {
	t.Helper()
	js, err := os.ReadFile("../nft/testdata/portmap-" + version + ".json")
	if err != nil {
		t.Fatal(err)
	}
	listing, err := os.ReadFile("../nft/testdata/portmap-" + version + ".nft")
	if err != nil {
		t.Fatal(err)
	}
	return &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "192.168.0.2/24", Up: true}},
		NFTables:  &trace.NFTRuleset{JSON: js, Listing: string(listing)},
		Pods: []trace.Pod{
			{Namespace: "web", Name: "hp-0", IPs: []string{"10.88.0.2"}, Node: "node-1", ContainerID: "4f2a9c1e0b7d"},
			{Namespace: "shop", Name: "client", IPs: []string{"10.88.0.9"}, Node: "node-1"},
		},
		Services: []trace.Service{{Namespace: "db", Name: "orders", Type: "ClusterIP", ClusterIPs: []string{"172.30.0.44"},
			Ports: []trace.ServicePort{{Name: "http", Proto: "TCP", Port: 8080}}}},
	}
}

// TestJoinPortmapNFT attributes DNATs to the rules portmap's nftables
// backend wrote, in both of its shapes, and checks the verdicts: v1.10
// jumps to its hostports only for local destinations, v1.8 for every
// destination, so a ClusterIP or an outside address with the hostPort's
// port is captured there.
func TestJoinPortmapNFT(t *testing.T) {
	cases := []struct {
		name, version, src, dst, to string
		chain                       string
		handle                      uint64
		text                        string
		path                        []string
		verdict                     string
		says                        string
	}{
		{"v1.10 node address, a hostPort as intended", "v1.10.0", "203.0.113.5:40000", "192.168.0.2:8080", "10.88.0.2:80",
			"hostports", 11, `tcp dport 8080 dnat to 10.88.0.2:80 comment "4f2a9c1e0b7d"`,
			[]string{"prerouting", "hostports_all", "hostports"}, trace.VerdictOK, "a hostPort used as intended"},
		{"v1.10 host IP rule", "v1.10.0", "203.0.113.5:40000", "192.168.0.2:8083", "10.88.0.2:83",
			"hostports", 12, `ip daddr 192.168.0.2 tcp dport 8083 dnat to 10.88.0.2:83 comment "4f2a9c1e0b7d"`,
			[]string{"prerouting", "hostports_all", "hostports"}, trace.VerdictOK, "a hostPort used as intended"},
		{"v1.8 ClusterIP routed through the node", "v1.8.0", "10.88.0.9:40000", "172.30.0.44:8080", "10.88.0.2:80",
			"hostports", 10, `tcp dport 8080 dnat to 10.88.0.2:80 comment "4f2a9c1e0b7d"`,
			[]string{"prerouting", "hostports"}, trace.VerdictHostportHijack, "no locality check"},
		{"v1.8 outside database", "v1.8.0", "10.88.0.9:40000", "198.51.100.7:8080", "10.88.0.2:80",
			"hostports", 10, `tcp dport 8080 dnat to 10.88.0.2:80 comment "4f2a9c1e0b7d"`,
			[]string{"prerouting", "hostports"}, trace.VerdictHostportHijack, "the destination 198.51.100.7:8080 itself"},
		{"v1.8 host IP rule", "v1.8.0", "203.0.113.5:40000", "192.168.0.2:8083", "10.88.0.2:83",
			"hostip_hostports", 11, `ip daddr 192.168.0.2 tcp dport 8083 dnat to 10.88.0.2:83 comment "4f2a9c1e0b7d"`,
			[]string{"prerouting", "hostip_hostports"}, trace.VerdictOK, "a hostPort used as intended"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := joinOn(t, portmapNode(t, c.version), dnatTo(c.src, c.dst, c.to))
			r := f.Rule
			if r == nil || r.Backend != trace.BackendNFTables || r.Family != "ip" || r.Table != "cni_hostport" ||
				r.Chain != c.chain || r.Handle != c.handle || r.Text != c.text || r.EntryChain != "prerouting" ||
				!slices.Equal(r.Path, c.path) || r.Uncertain != "" {
				t.Fatalf("rule %+v", r)
			}
			if r.Owner == nil || r.Owner.ContainerID != "4f2a9c1e0b7d" || r.Owner.Pod == nil || r.Owner.Pod.Key() != "web/hp-0" {
				t.Errorf("owner %+v", r.Owner)
			}
			t.Log(f.Explanation)
			if f.Verdict != c.verdict || !strings.Contains(f.Explanation, c.says) {
				t.Errorf("verdict %s, want %s saying %q: %s", f.Verdict, c.verdict, c.says, f.Explanation)
			}
		})
	}
}

// TestJoinPortmapNFTv110IgnoresNonLocal: v1.10's locality check means its
// rules cannot have DNAT'd a ClusterIP that is not a node address; a DNAT
// the kernel reports there is not attributed to portmap.
func TestJoinPortmapNFTv110IgnoresNonLocal(t *testing.T) {
	f := joinOn(t, portmapNode(t, "v1.10.0"), dnatTo("10.88.0.9:40000", "172.30.0.44:8080", "10.88.0.2:80"))
	if f.Rule != nil && f.Rule.Table == "cni_hostport" && f.Rule.Uncertain == "" {
		t.Fatalf("attributed with certainty to %+v", f.Rule)
	}
}
