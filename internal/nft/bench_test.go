package nft

import (
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/tracer-dev/tracer/internal/nft/nftgen"
	"github.com/tracer-dev/tracer/internal/rules"
)

// The size the issue names: 5,000 Services with 3 endpoints each.
const benchServices, benchEndpoints = 5000, 3

func TestGeneratedKubeProxyTable(t *testing.T) {
	_, js, listing := nftgen.KubeProxy(50, 3)
	rs, err := Parse(js, listing, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkGenerated(t, rs, 50)
}

// checkGenerated attributes a DNAT of Service 37's ClusterIP to its second
// endpoint and a ping to Service 12's ClusterIP.
func checkGenerated(t *testing.T, rs *Ruleset, n int) {
	t.Helper()
	if len(rs.Warnings) > 0 {
		t.Fatalf("warnings: %v", rs.Warnings)
	}
	if got, want := rs.Rules(), 6+n*(2+2*3); got != want {
		t.Errorf("%d rules, want %d", got, want)
	}
	to := netip.AddrPortFrom(netip.MustParseAddr(nftgen.EpIP(37, 1)), 8080)
	at, err := rs.Attribute(tcp("10.1.0.9:40000", nftgen.SvcIP(37)+":80"), rules.NewMemNode(),
		rules.KernelAction{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: to})
	if err != nil || at == nil {
		t.Fatalf("attribute: %v %v", at, err)
	}
	if at.Uncertain || at.Outcome.Rule.Chain.Name != nftgen.EpChain(37, 1) || at.Outcome.Rule.Text != "meta l4proto tcp dnat to "+to.String() {
		t.Fatalf("got %s %v", at.Outcome.String(), at.Reasons)
	}
	ping := rules.Packet{Proto: rules.ProtoICMP, Src: netip.MustParseAddrPort("192.168.0.2:0"), Dst: netip.AddrPortFrom(netip.MustParseAddr(nftgen.SvcIP(12)), 0),
		State: rules.CTNew, ICMPType: 8, ICMPKnown: true}
	at, err = rs.Attribute(ping, rules.NewMemNode(), rules.KernelAction{Kind: rules.ActionReject, Hook: "OUTPUT", ICMPType: 3, ICMPCode: 3})
	if err != nil || at == nil || at.Uncertain || at.Outcome.Rule.Chain.Name != "cluster-ips-check" {
		t.Fatalf("ping: %+v %v", at, err)
	}
}

// TestGeneratedMatchesNFT loads the generated script into a scratch
// namespace with the real nft and reads it back: what nft prints must
// attribute as the generator's own JSON does, so the benchmarks measure
// what a node's ruleset costs.
func TestGeneratedMatchesNFT(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("privileged test: needs root and not -short (a scratch network namespace and nft)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("nft not installed: %v", err)
	}
	const ns = "trnftgen"
	_ = exec.Command("ip", "netns", "del", ns).Run()
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	script, _, _ := nftgen.KubeProxy(50, 3)
	f, err := os.CreateTemp(t.TempDir(), "gen*.nft")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(script); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-f", f.Name()).CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
	js, err := exec.Command("ip", "netns", "exec", ns, "nft", "-j", "list", "ruleset").Output()
	if err != nil {
		t.Fatal(err)
	}
	listing, err := exec.Command("ip", "netns", "exec", ns, "nft", "-a", "list", "ruleset").Output()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Parse(js, listing, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkGenerated(t, rs, 50)
}

func BenchmarkParseKubeProxy5000(b *testing.B) {
	_, js, listing := nftgen.KubeProxy(benchServices, benchEndpoints)
	b.SetBytes(int64(len(js) + len(listing)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(js, listing, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAttributeKubeProxy5000(b *testing.B) {
	_, js, listing := nftgen.KubeProxy(benchServices, benchEndpoints)
	rs, err := Parse(js, listing, nil)
	if err != nil {
		b.Fatal(err)
	}
	node := rules.NewMemNode()
	pkt := tcp("10.1.0.9:40000", nftgen.SvcIP(4321)+":80")
	act := rules.KernelAction{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: netip.AddrPortFrom(netip.MustParseAddr(nftgen.EpIP(4321, 2)), 8080)}
	b.ReportAllocs()
	for b.Loop() {
		at, err := rs.Attribute(pkt, node, act)
		if err != nil || at == nil || at.Uncertain {
			b.Fatalf("attribute: %+v %v", at, err)
		}
	}
}
