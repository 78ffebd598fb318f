package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// nftTrace writes a trace whose snapshot holds what the real portmap v1.8.0
// wrote with its nftables backend (nftJSON replaces the ruleset's JSON
// when set) and one flow: a ClusterIP DNAT'd to the hostPort pod, recorded
// without a rule or a verdict.
func nftTrace(t *testing.T, nftJSON []byte) string {
	t.Helper()
	js, err := os.ReadFile("../../internal/nft/testdata/portmap-v1.8.0.json")
	if err != nil {
		t.Fatal(err)
	}
	listing, err := os.ReadFile("../../internal/nft/testdata/portmap-v1.8.0.nft")
	if err != nil {
		t.Fatal(err)
	}
	if nftJSON != nil {
		js = nftJSON
	}
	snap := &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "192.168.0.2/24", Up: true}},
		NFTables:  &trace.NFTRuleset{JSON: js, Listing: string(listing)},
		Pods:      []trace.Pod{{Namespace: "web", Name: "hp-0", IPs: []string{"10.88.0.2"}, ContainerID: "4f2a9c1e0b7d"}},
		Services: []trace.Service{{Namespace: "db", Name: "orders", Type: "ClusterIP", ClusterIPs: []string{"172.30.0.44"},
			Ports: []trace.ServicePort{{Name: "http", Proto: "TCP", Port: 8080}}}},
	}
	path := filepath.Join(t.TempDir(), "nft.ndjson")
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	w, err := trace.Create(path, trace.Header{Type: trace.TypeHeader, Schema: trace.Schema, Node: "node-1", Started: now, Hooks: []trace.Hook{}, Snapshot: snap})
	if err != nil {
		t.Fatal(err)
	}
	f := &trace.Flow{Type: trace.TypeFlow, Time: now, Proto: "tcp",
		Orig:  trace.Tuple{Src: "10.88.0.9:40000", Dst: "172.30.0.44:8080"},
		Reply: &trace.Tuple{Src: "10.88.0.2:80", Dst: "10.88.0.9:40000"},
		Events: []trace.Event{{Kind: trace.KindDNAT, Time: now, Hook: "nf_nat_setup_info", Via: "netfilter", Proto: "tcp",
			Packet: &trace.Tuple{Src: "10.88.0.9:40000", Dst: "172.30.0.44:8080"}, To: "10.88.0.2:80", NFHook: "PREROUTING"}},
	}
	if err := w.WriteFlow(f); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// A recorded trace of an nftables node is re-diagnosed from the ruleset
// its snapshot carries: the rule is named and the hijack found.
func TestReplayNFTables(t *testing.T) {
	code, out, stderr := runTracer("replay", "-o", "json", nftTrace(t, nil))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	tr, err := trace.ReadAll(strings.NewReader(out), "stdout")
	if err != nil || len(tr.Flows) != 1 {
		t.Fatalf("output: %v, %d flows", err, len(tr.Flows))
	}
	f := tr.Flows[0]
	r := f.Rule
	if r == nil || !r.NFTables() || r.Table != "cni_hostport" || r.Chain != "hostports" || r.Handle != 10 ||
		r.Text != `tcp dport 8080 dnat to 10.88.0.2:80 comment "4f2a9c1e0b7d"` || r.Owner == nil || r.Owner.Pod == nil {
		t.Fatalf("rule %+v", r)
	}
	if f.Verdict != trace.VerdictHostportHijack {
		t.Errorf("verdict %s: %s", f.Verdict, f.Explanation)
	}
}

// A snapshot ruleset that is not nft JSON leaves the flow without a
// native rule and says so in the header; it is not a crash, and not bad
// input: everything else in the trace stands.
func TestReplayNFTablesUnreadable(t *testing.T) {
	code, out, stderr := runTracer("replay", "-o", "json", nftTrace(t, []byte(`{"nftables": "truncated"}`)))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	tr, err := trace.ReadAll(strings.NewReader(out), "stdout")
	if err != nil || len(tr.Flows) != 1 {
		t.Fatalf("output: %v", err)
	}
	found := false
	for _, w := range tr.Header.Warnings {
		found = found || strings.Contains(w, "nftables ruleset not understood")
	}
	if !found {
		t.Errorf("header warnings %q", tr.Header.Warnings)
	}
	if r := tr.Flows[0].Rule; r != nil && r.Uncertain == "" {
		t.Errorf("a rule named with certainty from an unreadable ruleset: %+v", r)
	}
}
