package kubeproxy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func diffStrings(ds []Difference) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.String()
	}
	return out
}

// TestModelDiff: rule order counts and a changed rule is named with the
// words that differ; facts differ by key and value.
func TestModelDiff(t *testing.T) {
	real := &Model{Facts: map[string]string{"a": "1", "b": "2"}, Chains: map[string][]string{"c": {"x", "y -j A", "z"}}}
	got := &Model{Facts: map[string]string{"a": "1", "b": "3", "d": "4"}, Chains: map[string][]string{"c": {"x", "y -j B", "z", "w"}}}
	want := []string{
		`b: kube-proxy "2", stand-in "3"`,
		`chain c rule 2: kube-proxy "y -j A", stand-in "y -j B" (kube-proxy has "A", stand-in has "B")`,
		`chain c rule 4: only in the stand-in: w`,
		`d: only in the stand-in: 4`,
	}
	if d := diffStrings(Diff(real, got)); !slices.Equal(d, want) {
		t.Errorf("Diff:\n%s\nwant:\n%s", strings.Join(d, "\n"), strings.Join(want, "\n"))
	}
	swapped := &Model{Facts: real.Facts, Chains: map[string][]string{"c": {"y -j A", "x", "z"}}}
	if d := Diff(real, swapped); len(d) == 0 {
		t.Error("rules in another order compare equal")
	}
	if d := Diff(real, real); len(d) != 0 {
		t.Errorf("a model differs from itself: %v", d)
	}
}

// TestUnexplained: a listed difference explains only the exact one, and
// one listed but not seen is reported.
func TestUnexplained(t *testing.T) {
	diffs := []Difference{{"x", "only in kube-proxy: 1"}, {"y", "only in kube-proxy: 2"}}
	known := []KnownDifference{{"x: only in kube-proxy: 1", "r"}, {"y: only in kube-proxy: 22", "r"}, {"z: gone", "r"}}
	un, unused := Unexplained(diffs, known)
	if len(un) != 1 || un[0].Where != "y" {
		t.Errorf("unexplained %v, want only y", un)
	}
	if len(unused) != 2 {
		t.Errorf("unused %v, want the y and z entries", unused)
	}
}

// TestIdents: iptables-mode names map to their Service port and endpoint
// (hashes from kube-proxy's own proxier_test.go), and a nftables name whose
// hash is not kube-proxy's is marked.
func TestIdents(t *testing.T) {
	id := NewIdents([]ServicePortID{{Namespace: "ns1", Name: "svc1", Port: "p80", Proto: "tcp", Endpoints: []string{"10.180.0.1:80"}}})
	// pkg/proxy/iptables/proxier_test.go: KUBE-SVC-XPGD46QRK7WJZT7O is ns1/svc1:p80, KUBE-SEP-SXIVWICOYRO3J4NJ its endpoint 10.180.0.1:80.
	for in, want := range map[string]string{
		"-j KUBE-SVC-XPGD46QRK7WJZT7O": "-j KUBE-SVC-{ns1/svc1:p80}",
		"-j KUBE-SEP-SXIVWICOYRO3J4NJ": "-j KUBE-SEP-{ns1/svc1:p80 10.180.0.1:80}",
		"-j KUBE-SVC-AAAAAAAAAAAAAAAA": "-j KUBE-SVC-AAAAAAAAAAAAAAAA",
	} {
		if got := id.IPTables(in); got != want {
			t.Errorf("IPTables(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"goto service-ULMVA6XW-ns1/svc1/tcp/p80":   "goto service-{ns1/svc1/tcp/p80}",
		"goto service-ULMVA6XX-ns1/svc1/tcp/p80 }": "goto service-{ns1/svc1/tcp/p80}#ULMVA6XX-is-not-its-hash }",
	} {
		if got := NFTIdent(in); got != want {
			t.Errorf("NFTIdent(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestNFTablesModelRecorded models the ruleset the real kube-proxy v1.37.2
// wrote (internal/nft/testdata) and checks that the model sees what the
// tracer depends on, and that one changed rule, element comment or base
// chain priority is named as a difference.
func TestNFTablesModelRecorded(t *testing.T) {
	dir := testdataDir(t)
	js, err := os.ReadFile(filepath.Join(dir, fixtureBase+".json"))
	if err != nil {
		t.Fatal(err)
	}
	listing, err := os.ReadFile(filepath.Join(dir, fixtureBase+".nft"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NFTablesModel(js, listing)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"nft chain ip kube-proxy nat-prerouting":                                    "type nat hook prerouting priority -100 policy accept",
		"nft chain ip kube-proxy filter-forward":                                    "type filter hook forward priority 0 policy accept",
		"nft element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 }": `comment "ns6/svc6:p80" : goto reject-chain`,
		"nft element ip kube-proxy service-ips { 172.30.0.44 . tcp . 80 }":          `comment "" : goto service-{ns4/svc4/tcp/p80}`,
		"nft set ip kube-proxy service-nodeports":                                   "map inet_proto . inet_service : verdict",
	} {
		if m.Facts[k] != v {
			t.Errorf("model of the recorded ruleset: %s = %q, want %q", k, m.Facts[k], v)
		}
	}
	if r := m.Chains["ip kube-proxy reject-chain"]; !slices.Equal(r, []string{"reject"}) {
		t.Errorf("reject-chain rules %q", r)
	}
	// One element comment changed in the JSON, one rule in the listing.
	for _, c := range []struct {
		from, to, want string
		inJSON         bool
	}{
		{"ns6/svc6:p80", "ns6/svc6:p81", `nft element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 }: kube-proxy "comment \"ns6/svc6:p80\" : goto reject-chain", stand-in "comment \"ns6/svc6:p81\" : goto reject-chain"`, true},
		{"masquerade fully-random # handle", "masquerade # handle", `chain ip kube-proxy masquerading rule 1: kube-proxy "meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random", stand-in "meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade" (kube-proxy has "fully-random", stand-in has "")`, false},
	} {
		j, l := js, listing
		if c.inJSON {
			j = []byte(strings.Replace(string(js), c.from, c.to, 1))
		} else {
			l = []byte(strings.Replace(string(listing), c.from, c.to, 1))
		}
		changed, err := NFTablesModel(j, l)
		if err != nil {
			t.Fatal(err)
		}
		if d := diffStrings(Diff(m, changed)); !slices.Equal(d, []string{c.want}) {
			t.Errorf("%s -> %s: differences\n%s\nwant\n%s", c.from, c.to, strings.Join(d, "\n"), c.want)
		}
	}
}
