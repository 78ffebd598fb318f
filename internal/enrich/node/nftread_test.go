package node

import (
	"context"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/nft"
)

// What nft 1.0.6 printed for two native tables in a namespace whose
// iptables is iptables-nft (its "ip nat" beside them).
const (
	hostportJSON    = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "ip", "name": "cni_hostport", "handle": 2}}, {"chain": {"family": "ip", "table": "cni_hostport", "name": "hostports", "handle": 1}}, {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 2, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}}, {"dnat": {"addr": "10.244.0.2", "port": 80}}]}}]}` + "\n"
	hostportListing = "table ip cni_hostport { # handle 2\n\tchain hostports { # handle 1\n\t\ttcp dport 80 dnat to 10.244.0.2:80 # handle 2\n\t}\n}\n"
	kubeProxy6JSON  = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "ip6", "name": "kube-proxy", "handle": 3}}]}` + "\n"
	kubeProxy6List  = "table ip6 kube-proxy { # handle 3\n}\n"
)

// Under iptables-nft the native tables are listed one by one, and
// iptables-nft's own, which hold every iptables rule of the node, not at
// all; the listings read as one ruleset.
func TestReadNFTListsOnlyNativeTablesUnderIPTablesNFT(t *testing.T) {
	f := &fakeRunner{out: map[string]string{
		"nft list tables":                   "table ip nat\ntable ip cni_hostport\ntable ip6 kube-proxy\n",
		"nft -j list table ip cni_hostport": hostportJSON,
		"nft -a list table ip cni_hostport": hostportListing,
		"nft -j list table ip6 kube-proxy":  kubeProxy6JSON,
		"nft -a list table ip6 kube-proxy":  kubeProxy6List,
	}, calls: map[string]int{}}
	tables, snap, err := readNFT(context.Background(), f.run, func(string) error { return nil }, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tb := range tables {
		names = append(names, tb.Family+" "+tb.Name)
	}
	if got := strings.Join(names, ", "); got != "ip cni_hostport, ip6 kube-proxy" {
		t.Errorf("tables %q", got)
	}
	for cmd, n := range f.calls {
		if strings.Contains(cmd, "ruleset") || strings.Contains(cmd, " nat") {
			t.Errorf("%q ran %d times", cmd, n)
		}
	}
	rs, err := nft.Parse(snap.JSON, []byte(snap.Listing), snap.Skip)
	if err != nil {
		t.Fatalf("the joined listings do not parse: %v\n%s", err, snap.JSON)
	}
	if len(rs.Tables) != 2 || strings.Count(string(snap.JSON), `"metainfo"`) != 1 {
		t.Errorf("parsed %d tables from %s", len(rs.Tables), snap.JSON)
	}
	if got := nft.JSONRules(snap.JSON); got != 1 || nft.ListedRules([]byte(snap.Listing)) != 1 {
		t.Errorf("rules: %d in the JSON, %d listed; want 1", got, nft.ListedRules([]byte(snap.Listing)))
	}
}

// With iptables-legacy every nftables table is native: the ruleset is
// listed whole.
func TestReadNFTListsTheRulesetUnderIPTablesLegacy(t *testing.T) {
	f := &fakeRunner{out: map[string]string{
		"nft -j list ruleset": hostportJSON,
		"nft -a list ruleset": hostportListing,
	}, calls: map[string]int{}}
	tables, _, err := readNFT(context.Background(), f.run, func(string) error { return nil }, false, nil)
	if err != nil || len(tables) != 1 {
		t.Fatalf("tables %+v, %v", tables, err)
	}
	if n := f.count("nft list tables"); n != 0 {
		t.Errorf("tables listed %d times", n)
	}
}
