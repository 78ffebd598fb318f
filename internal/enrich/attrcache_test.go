package enrich

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// sportRulesIPT DNATs a ClusterIP to the same backend by two rules, the
// first only for source ports 1000-1999: the kernel's action is the same,
// the rule that made it is not.
const sportRulesIPT = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -d 10.96.0.1/32 -p tcp -m tcp --sport 1000:1999 --dport 80 -j DNAT --to-destination 10.0.0.1:80
-A PREROUTING -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:80
COMMIT
`

// sportRulesNFT is the same in a native table (nft 1.0.6's JSON for
// "tcp sport 1000-1999 ip daddr 10.96.0.1 tcp dport 80 dnat to
// 10.0.0.1:80" and the rule without the sport).
const sportRulesNFT = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "t", "handle": 1}},
{"chain": {"family": "ip", "table": "t", "name": "pre", "handle": 1, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"rule": {"family": "ip", "table": "t", "chain": "pre", "handle": 2, "expr": [
 {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "10.96.0.1"}},
 {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "sport"}}, "right": {"range": [1000, 1999]}}},
 {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}},
 {"dnat": {"addr": "10.0.0.1", "port": 80}}]}},
{"rule": {"family": "ip", "table": "t", "chain": "pre", "handle": 3, "expr": [
 {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "10.96.0.1"}},
 {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}},
 {"dnat": {"addr": "10.0.0.1", "port": 80}}]}}]}`

// TestAttributionCacheSourcePort: connections that differ only in their
// source port share a cached answer unless a rule read the port. With a
// rule that does, each connection is attributed to the rule its own port
// met, in whatever order they come; without one, the walk runs once.
func TestAttributionCacheSourcePort(t *testing.T) {
	snaps := map[string]*trace.Snapshot{
		"iptables": {Rules: map[string]string{"nat": sportRulesIPT}},
		"nftables": {NFTables: &trace.NFTRuleset{JSON: []byte(sportRulesNFT)}},
	}
	for name, snap := range snaps {
		t.Run(name, func(t *testing.T) {
			env, err := NewNodeEnv("node-1", snap, nil)
			if err != nil {
				t.Fatal(err)
			}
			wantFirst := map[bool]string{true: "--sport 1000:1999", false: "-A PREROUTING -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j DNAT"}
			if name == "nftables" {
				wantFirst = map[bool]string{true: "handle 2", false: "handle 3"}
			}
			for i, sport := range []int{40000, 1500, 40001, 1501, 2000, 999} {
				f := enrichOne(t, env, fmt.Sprintf("10.1.0.9:%d", sport), "10.96.0.1:80", "10.0.0.1:80")
				first := sport >= 1000 && sport <= 1999
				got := ""
				if f.Rule != nil {
					got = f.Rule.Text
					if f.Rule.Handle != 0 {
						got = fmt.Sprintf("handle %d", f.Rule.Handle)
					}
				}
				if !strings.Contains(got, wantFirst[first]) {
					t.Errorf("connection %d from port %d: rule %q, want %q", i, sport, got, wantFirst[first])
				}
			}
			if hits, misses := env.AttributionCacheStats(); misses != 6 || hits != 0 {
				t.Errorf("%d hits, %d misses: a rule read the source port, so every port is its own walk", hits, misses)
			}
		})
	}
	t.Run("no rule reads the port", func(t *testing.T) {
		env, err := NewNodeEnv("node-1", &trace.Snapshot{Rules: map[string]string{"nat": `*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:80
COMMIT
`}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for sport := 40000; sport < 40010; sport++ {
			f := enrichOne(t, env, fmt.Sprintf("10.1.0.9:%d", sport), "10.96.0.1:80", "10.0.0.1:80")
			if f.Rule == nil || f.Rule.Chain != "PREROUTING" {
				t.Fatalf("port %d: rule %+v", sport, f.Rule)
			}
		}
		if hits, misses := env.AttributionCacheStats(); misses != 1 || hits != 9 {
			t.Errorf("%d hits, %d misses, want 9 and 1", hits, misses)
		}
	})
}

// TestAttributionCacheRuleUnchanged: flows answered from the cache share
// its rule, so naming a flow's owner pod copies the rule rather than
// change the one the cache holds for the next flow.
func TestAttributionCacheRuleUnchanged(t *testing.T) {
	snap := portmapNode(t, "v1.10.0")
	env, err := NewNodeEnv("node-1", snap, NewSnapshotMetadata(snap.Pods, snap.Services))
	if err != nil {
		t.Fatal(err)
	}
	a := enrichOne(t, env, "203.0.113.5:40000", "192.168.0.2:8080", "10.88.0.2:80")
	b := enrichOne(t, env, "203.0.113.5:40001", "192.168.0.2:8080", "10.88.0.2:80")
	for _, f := range []*trace.Flow{a, b} {
		if f.Rule == nil || f.Rule.Owner == nil || f.Rule.Owner.Pod == nil || f.Rule.Owner.Pod.Key() != "web/hp-0" {
			t.Fatalf("rule %+v, want its owner's pod web/hp-0", f.Rule)
		}
	}
	if hits, _ := env.AttributionCacheStats(); hits != 1 {
		t.Errorf("%d hits, want the second flow answered from the cache", hits)
	}
	c := env.attributions()
	c.mu.Lock()
	defer c.mu.Unlock()
	var answers []attrAnswer
	for _, e := range c.answers {
		answers = append(answers, e.answer)
	}
	for _, e := range c.shapes {
		answers = append(answers, e.shape.answer)
	}
	for _, ans := range answers {
		if r := ans.rule; r != nil && r.Owner != nil && r.Owner.Pod != nil {
			t.Errorf("the cache's rule %q was given the pod %s", r.Text, r.Owner.Pod.Key())
		}
	}
}

func enrichOne(t *testing.T, env *NodeEnv, src, dst, to string) *trace.Flow {
	t.Helper()
	var out []*trace.Flow
	j := NewStages(&join.Joiner{}, &Enricher{Env: func(time.Time) Env { return env }, Emit: func(f *trace.Flow) { out = append(out, f) }})
	j.Add(dnatTo(src, dst, to), time.Unix(1700000000, 0))
	j.Flush()
	if len(out) != 1 {
		t.Fatalf("%d flows", len(out))
	}
	return out[0]
}

// TestAttributionCacheHashCollision: an entry filed under a key's hash
// but kept for another key is a miss for it, never its answer. No two
// keys are known to collide, so the other key's entry is filed by hand.
func TestAttributionCacheHashCollision(t *testing.T) {
	c := newAttributionCache()
	pkt := rules.Packet{Proto: rules.ProtoTCP, Src: netip.MustParseAddrPort("10.0.0.1:4000"), Dst: netip.MustParseAddrPort("10.96.0.10:80")}
	act := rules.KernelAction{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: netip.MustParseAddrPort("10.244.1.5:8080")}
	mine, other := &trace.Rule{Text: "mine"}, &trace.Rule{Text: "other"}
	walks := 0
	eval := func(rules.Packet) (*trace.Rule, bool) { walks++; return mine, true }

	k := keyOf(pkt, act, attrShape{})
	otherKey := k
	otherKey.pkt.Dst = netip.MustParseAddrPort("10.96.0.11:80")
	c.shapes[c.hash(&k)] = shapeEntry{key: otherKey, shape: attrShape{answer: attrAnswer{rule: other, known: true}}}
	if r, _ := c.attributeCached(pkt, act, eval); r != mine || walks != 1 {
		t.Fatalf("got rule %q after %d walks, want %q from one walk", r.Text, walks, mine.Text)
	}
	if r, _ := c.attributeCached(pkt, act, eval); r != mine || walks != 1 {
		t.Fatalf("asked again: rule %q after %d walks, want %q from the cache", r.Text, walks, mine.Text)
	}
}
