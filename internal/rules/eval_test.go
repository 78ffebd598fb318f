package rules

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func loadSave(t testing.TB, name string) *Ruleset {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs, err := ParseSave(f, IPv4)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// testNode is the node of kube-proxy-ipvs.md: 172.18.0.2 with every
// ClusterIP and the LB IP on kube-ipvs0, and kube-proxy's ipsets.
func testNode(t testing.TB) *MemNode {
	t.Helper()
	n := NewMemNode()
	if err := n.AddLocal("172.18.0.2", "10.244.1.1", "10.96.0.10", "10.96.0.20", "10.96.0.30", "192.168.1.200"); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join("testdata", "ipsets.save"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := n.LoadIPSetSave(f); err != nil {
		t.Fatal(err)
	}
	return n
}

func tcp(src, dst string) Packet {
	return Packet{Proto: ProtoTCP, Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst), State: CTNew, InIface: "eth0"}
}

func mustEval(t *testing.T, rs *Ruleset, table, chain string, p Packet, n NodeState) *Result {
	t.Helper()
	res, err := rs.Evaluate(table, chain, p, n)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestQuick(t *testing.T) {
	rs := loadSave(t, "appended.save")
	n := testNode(t)
	res := mustEval(t, rs, "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.96.0.20:3306"), n)
	t.Logf("%s path=%s unc=%v reasons=%v", res.Outcome.String(), res.PathString(), res.Uncertain, res.Reasons)
	res = mustEval(t, rs, "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.96.0.20:80"), n)
	t.Logf("%s path=%s unc=%v reasons=%v", res.Outcome.String(), res.PathString(), res.Uncertain, res.Reasons)
	_ = strings.Join
}
