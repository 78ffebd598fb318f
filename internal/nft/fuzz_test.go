package nft

import (
	"bytes"
	"net/netip"
	"os"
	"testing"

	"github.com/tracer-dev/tracer/internal/rules"
)

// FuzzParse: no input makes the reader or the evaluator panic, and an
// attribution from whatever was read never names a rule with certainty
// while saying nothing was understood.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"sample", "portmap-v1.10.0", "portmap-v1.8.0", "portmap-v1.8.0-dualstack"} {
		js, err := os.ReadFile("testdata/" + name + ".json")
		if err != nil {
			f.Fatal(err)
		}
		listing, _ := os.ReadFile("testdata/" + name + ".nft")
		f.Add(js, listing)
		f.Add(js[:len(js)/2], listing)
	}
	f.Add([]byte(`{"nftables":[{"chain":{"family":"ip","table":"t","name":"c","hook":"prerouting","type":"nat","prio":-100}},{"table":{"family":"ip","name":"t"}},{"rule":{"family":"ip","table":"t","chain":"c","handle":1,"expr":[{"vmap":{"key":{"numgen":{"mod":0}},"data":{"set":[[0,{"jump":{"target":"c"}}]]}}}]}}]}`), []byte(nil))
	f.Fuzz(func(t *testing.T, js, listing []byte) {
		rs, err := Parse(js, listing, nil)
		if err != nil {
			return
		}
		node := rules.NewMemNode()
		for _, act := range []rules.KernelAction{
			{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: netip.MustParseAddrPort("10.88.0.2:80")},
			{Kind: rules.ActionReject, Hook: "FORWARD", ICMPType: 3, ICMPCode: 3},
			{Kind: rules.ActionDrop, Hook: "OUTPUT"},
		} {
			_, _ = rs.Attribute(tcp("10.1.0.9:40000", "172.30.0.44:8080"), node, act)
		}
	})
}

// TestMalformedRuleset: input that is not nft JSON is an error; a ruleset
// with parts this package cannot read gives warnings and an uncertain
// attribution, never a confident one.
func TestMalformedRuleset(t *testing.T) {
	js, err := os.ReadFile("testdata/portmap-v1.8.0.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]byte{js[:len(js)/2], []byte(`[]`), []byte(`{"other":1}`), nil} {
		if _, err := Parse(bad, nil, nil); err == nil {
			t.Errorf("Parse(%.40q) gave no error", bad)
		}
	}
	// The DNAT rule's match replaced by an expression nft may print but
	// this package does not know: "osf" (passive OS fingerprinting).
	partial := bytes.Replace(js, []byte(`{"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080`),
		[]byte(`{"osf": {"key": "name"}}, "right": "Linux"`), 1)
	if bytes.Equal(partial, js) {
		t.Fatal("fixture changed: the 8080 rule's match was not found")
	}
	rs, err := Parse(partial, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	at, err := rs.Attribute(tcp("10.1.0.9:40000", "172.30.0.44:8080"), rules.NewMemNode(),
		rules.KernelAction{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: netip.MustParseAddrPort("10.88.0.2:80")})
	if err != nil {
		t.Fatal(err)
	}
	// The unknown match is assumed both ways; the kernel's DNAT settles it
	// for the one rule that could have done it, which names the doubt.
	if at == nil || at.Outcome.Rule == nil || at.Outcome.Rule.Handle != 10 {
		t.Fatalf("attribution %+v", at)
	}
	if at.Outcome.Rule.Text != "" {
		t.Errorf("rule text %q without a listing", at.Outcome.Rule.Text)
	}
	if len(at.Notes) == 0 && !at.Uncertain {
		t.Errorf("the undecidable match left no trace: %+v", at)
	}
}
