package nft

import (
	"net/netip"
	"testing"

	"github.com/tracer-dev/tracer/internal/rules"
)

// What the real portmap plugins wrote for a dual-stack pod
// (tests/cni TestPortmapFixtures): an IPv6 hostPort connection is
// attributed to the ip6 cni_hostport rule, a hostIP mapping only for its
// own family's address, and an IPv4 one still to the ip table.
func TestPortmapDualStackAttribution(t *testing.T) {
	for _, tc := range []struct {
		fixture, src, dst, to string
		family                string
		handle                int
	}{
		{"portmap-v1.10.0-dualstack", "[fd92::1]:40000", "[fd92::2]:8080", "[fd88::2]:80", "ip6", 11},
		{"portmap-v1.10.0-dualstack", "[fd92::1]:40000", "[fd92::2]:8086", "[fd88::2]:86", "ip6", 13},
		{"portmap-v1.10.0-dualstack", "192.168.0.1:40000", "192.168.0.2:8083", "10.88.0.2:83", "ip", 12},
		{"portmap-v1.8.0-dualstack", "[fd92::1]:40000", "[fd92::2]:8086", "[fd88::2]:86", "ip6", 12},
		{"portmap-v1.8.0-dualstack", "[fd92::1]:40000", "[fd92::2]:5353", "[fd88::2]:53", "ip6", 11},
	} {
		rs := load(t, tc.fixture)
		pkt := tcp(tc.src, tc.dst)
		if tc.to == "[fd88::2]:53" {
			pkt.Proto = rules.ProtoUDP
		}
		node := rules.NewMemNode()
		if err := node.AddLocal("192.168.0.2", "fd92::2"); err != nil {
			t.Fatal(err)
		}
		at, err := rs.Attribute(pkt, node, rules.KernelAction{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: netip.MustParseAddrPort(tc.to)})
		if err != nil || at == nil || at.Outcome.Rule == nil {
			t.Errorf("%s %s → %s: DNAT to %s not attributed: %v %v", tc.fixture, tc.src, tc.dst, tc.to, at, err)
			continue
		}
		r := at.Outcome.Rule
		if at.Uncertain || int(r.Handle) != tc.handle || r.Chain.Table.Family != tc.family {
			t.Errorf("%s %s → %s: got %s %s handle %d (uncertain %v %v), want %s handle %d",
				tc.fixture, tc.src, tc.dst, r.Chain.Table.Family, r.Chain.Name, r.Handle, at.Uncertain, at.Reasons, tc.family, tc.handle)
		}
	}
}
