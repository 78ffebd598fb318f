package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/rules"
)

// testdata/inet-nat.* is what nft 1.0.6 lists for testdata/inet-nat-src.nft:
// an inet table whose NAT statements name their family (`dnat ip to`,
// `dnat ip6 to`), which nft requires there.

// The kernel's nft_nat_inet_eval does nothing for a NAT statement of the
// other family, so the rule goes on: each packet must reach its own
// family's DNAT whichever comes first.
func TestInetNATOfOtherFamilyIsSkipped(t *testing.T) {
	rs := load(t, "inet-nat")
	for _, tc := range []struct {
		src, dst, to string
		handle       int
	}{
		{"192.0.2.9:40000", "192.0.2.1:80", "10.0.0.1:8080", 2},
		{"[2001:db8::9]:40000", "[2001:db8::1]:80", "[fd00::1]:8080", 3},
		{"[2001:db8::9]:40000", "[2001:db8::1]:90", "[fd00::2]:9090", 4},
		{"192.0.2.9:40000", "192.0.2.1:90", "10.0.0.2:9090", 5},
	} {
		pkt := tcp(tc.src, tc.dst)
		c := rs.HookChains("ip", "prerouting")
		if pkt.Dst.Addr().Is6() {
			c = rs.HookChains("ip6", "prerouting")
		}
		if len(c) != 1 {
			t.Fatalf("%s: %d base chains", tc.dst, len(c))
		}
		res := rs.Evaluate(c[0], pkt, rules.NewMemNode())
		if len(res.Outcomes) == 0 || res.Outcomes[0].Rule == nil || int(res.Outcomes[0].Rule.Handle) != tc.handle {
			t.Errorf("%s → %s: walk ended %v, want rule %d", tc.src, tc.dst, outcomes(res), tc.handle)
		}
		at, err := rs.Attribute(pkt, rules.NewMemNode(),
			rules.KernelAction{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: netip.MustParseAddrPort(tc.to)})
		if err != nil || at == nil {
			t.Errorf("%s → %s: DNAT to %s not attributed: %v", tc.src, tc.dst, tc.to, err)
			continue
		}
		if at.Uncertain || at.Outcome.Rule == nil || int(at.Outcome.Rule.Handle) != tc.handle {
			t.Errorf("%s → %s: got %s, uncertain %v %v", tc.src, tc.dst, at.Outcome.String(), at.Uncertain, at.Reasons)
		}
	}
}

func outcomes(res *Result) []string {
	var out []string
	for i := range res.Outcomes {
		out = append(out, res.Outcomes[i].String())
	}
	return out
}

// IPv6 NAT targets with a port are written as nft writes them, bracketed.
func TestIPv6NATTargetText(t *testing.T) {
	rs := load(t, "inet-nat")
	c := rs.HookChains("ip6", "prerouting")[0]
	res := rs.Evaluate(c, tcp("[2001:db8::9]:40000", "[2001:db8::1]:81"), rules.NewMemNode())
	o := res.Outcomes[0]
	err := o.NAT.agrees(netip.MustParseAddrPort("[fd00::9]:80"), netip.MustParseAddrPort("[2001:db8::1]:81"), false)
	if err == nil || !strings.Contains(err.Error(), "one of [fd00::4]:80, [fd00::5]:80:") {
		t.Errorf("numgen choices: %v", err)
	}
	res = rs.Evaluate(c, tcp("[2001:db8::9]:40000", "[2001:db8::1]:82"), rules.NewMemNode())
	if got := res.Outcomes[0].Target(); got != "[fd00::1]-[fd00::3]:8082" {
		t.Errorf("range target %q", got)
	}
	res = rs.Evaluate(rs.HookChains("ip", "prerouting")[0], tcp("192.0.2.9:40000", "192.0.2.1:80"), rules.NewMemNode())
	if got := res.Outcomes[0].Target(); got != "10.0.0.1:8080" {
		t.Errorf("IPv4 target %q", got)
	}
}
