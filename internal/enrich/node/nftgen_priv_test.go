package node

import (
	"maps"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// TestNFTGenerationMoves: a ruleset change in a namespace moves its
// generation, and nothing else's.
func TestNFTGenerationMoves(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("privileged test: needs root and not -short (a scratch network namespace)")
	}
	if !moduleReady("nf_tables") {
		t.Skip("nf_tables is not loaded and the test does not load it")
	}
	const name = "trnftgen"
	h := scratchNetns(t, name)
	hostBefore, err := nftGeneration(0)
	if err != nil {
		t.Fatal(err)
	}
	before, err := nftGeneration(int(h))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", name, "nft", "add", "table", "ip", "trgen").CombinedOutput(); err != nil {
		t.Fatalf("nft add table: %v: %s", err, out)
	}
	after, err := nftGeneration(int(h))
	if err != nil {
		t.Fatal(err)
	}
	if after == before {
		t.Errorf("generation stayed %d after adding a table", after)
	}
	again, err := nftGeneration(int(h))
	if err != nil || again != after {
		t.Errorf("generation moved from %d to %d (%v) with no change", after, again, err)
	}
	if hostAfter, err := nftGeneration(0); err != nil || hostAfter != hostBefore {
		t.Logf("host generation %d -> %d (%v): something else changed the host's rules meanwhile", hostBefore, hostAfter, err)
	}
}

// BenchmarkNFTGeneration is what a poll costs when nothing changed: one
// netlink round trip, whatever the ruleset's size.
func BenchmarkNFTGeneration(b *testing.B) {
	if os.Geteuid() != 0 || !moduleReady("nf_tables") {
		b.Skip("needs root and nf_tables loaded")
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := nftGeneration(0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestNFTTableNamesAgreesWithNFT: the tables the kernel lists by netlink
// are the ones `nft list tables` prints, in every family, including
// iptables-nft's.
func TestNFTTableNamesAgreesWithNFT(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("privileged test: needs root and not -short (a scratch network namespace)")
	}
	if !moduleReady("nf_tables") {
		t.Skip("nf_tables is not loaded and the test does not load it")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft is not installed: nothing to compare with")
	}
	const name = "trnfttables"
	h := scratchNetns(t, name)
	if names, err := nftTableNames(int(h)); err != nil || len(names) != 0 {
		t.Fatalf("a new namespace has tables %q (%v)", names, err)
	}
	for _, tb := range [][]string{{"ip", "cni_hostport"}, {"ip6", "kube-proxy"}, {"inet", "filter"}, {"bridge", "b"}, {"arp", "a"}, {"netdev", "n"}} {
		if out, err := exec.Command("ip", "netns", "exec", name, "nft", "add", "table", tb[0], tb[1]).CombinedOutput(); err != nil {
			t.Fatalf("nft add table %v: %v: %s", tb, err, out)
		}
	}
	if out, err := exec.Command("ip", "netns", "exec", name, "iptables", "-t", "nat", "-A", "POSTROUTING", "-j", "ACCEPT").CombinedOutput(); err != nil {
		t.Logf("iptables (for iptables-nft's table): %v: %s", err, out)
	}
	out, err := exec.Command("ip", "netns", "exec", name, "nft", "list", "tables").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			want[f[1]+" "+f[2]] = true
		}
	}
	names, err := nftTableNames(int(h))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, n := range names {
		got[n] = true
	}
	if !maps.Equal(got, want) || len(names) != len(got) {
		t.Errorf("netlink lists %q; nft lists %q", names, out)
	}
}

// scratchNetns is a new network namespace called name, deleted when the
// test ends.
func scratchNetns(t *testing.T, name string) netns.NsHandle {
	t.Helper()
	_ = exec.Command("ip", "netns", "del", name).Run()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}
