package enrich

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/tests/vm/guest"
)

// uncachedEnv hides a NodeEnv's caches: only Env's methods are promoted.
type uncachedEnv struct{ Env }

// sourceRules pick the rule by the source's prefix: nested, negated,
// overlapping and single-address ones, at each NAT hook and in filter.
const sourceRules = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:SVC - [0:0]
-A PREROUTING -s 127.0.0.1/32 -j RETURN
-A PREROUTING -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j SVC
-A OUTPUT -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j SVC
-A SVC -s 10.1.2.128/25 -j DNAT --to-destination 10.0.0.3:80
-A SVC ! -s 10.1.0.0/16 -j DNAT --to-destination 10.0.0.2:80
-A SVC -s 10.1.2.0/24 -j DNAT --to-destination 10.0.0.4:80
-A SVC -s 10.1.2.77/32 -j DNAT --to-destination 10.0.0.5:80
-A SVC -j DNAT --to-destination 10.0.0.1:80
-A POSTROUTING -s 10.1.3.0/24 -j MASQUERADE
-A POSTROUTING -s 10.1.0.0/16 ! -d 10.1.0.0/16 -j SNAT --to-source 192.168.0.2
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -s 10.1.4.0/23 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A FORWARD -s 10.1.5.7/32 -j DROP
-A FORWARD -s 10.1.0.0/22 -j DROP
-A INPUT ! -s 10.0.0.0/8 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
`

// sourceRules6 is sourceRules in IPv6, the prefixes on byte and
// non-byte boundaries.
const sourceRules6 = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:SVC - [0:0]
-A PREROUTING -s ::1/128 -j RETURN
-A PREROUTING -d fd00:96::1/128 -p tcp -m tcp --dport 80 -j SVC
-A OUTPUT -d fd00:96::1/128 -p tcp -m tcp --dport 80 -j SVC
-A SVC -s fd00:1:2::80/121 -j DNAT --to-destination [fd00::3]:80
-A SVC ! -s fd00:1::/32 -j DNAT --to-destination [fd00::2]:80
-A SVC -s fd00:1:2::/63 -j DNAT --to-destination [fd00::4]:80
-A SVC -s fd00:1:2::77/128 -j DNAT --to-destination [fd00::5]:80
-A SVC -j DNAT --to-destination [fd00::1]:80
-A POSTROUTING -s fd00:1:3::/48 -j MASQUERADE
-A POSTROUTING -s fd00:1::/32 ! -d fd00:1::/32 -j SNAT --to-source fd00:192::2
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -s fd00:1:4::/47 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp6-port-unreachable
-A FORWARD -s fd00:1:5::7/128 -j DROP
-A FORWARD -s fd00:1::/46 -j DROP
COMMIT
`

// sourceRulesNFT is a native table whose DNAT and masquerade depend on
// the source's prefix (sourceRulesNFTListing is nft's listing of it).
const sourceRulesNFT = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "t", "handle": 1}},
{"chain": {"family": "ip", "table": "t", "name": "pre", "handle": 1, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"chain": {"family": "ip", "table": "t", "name": "post", "handle": 2, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
{"rule": {"family": "ip", "table": "t", "chain": "pre", "handle": 3, "expr": [
 {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.1.2.128", "len": 25}}}},
 {"dnat": {"addr": "10.0.0.3", "port": 80}}]}},
{"rule": {"family": "ip", "table": "t", "chain": "pre", "handle": 4, "expr": [
 {"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.1.0.0", "len": 16}}}},
 {"dnat": {"addr": "10.0.0.2", "port": 80}}]}},
{"rule": {"family": "ip", "table": "t", "chain": "pre", "handle": 5, "expr": [
 {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.1.2.77"}},
 {"dnat": {"addr": "10.0.0.5", "port": 80}}]}},
{"rule": {"family": "ip", "table": "t", "chain": "pre", "handle": 6, "expr": [
 {"dnat": {"addr": "10.0.0.1", "port": 80}}]}},
{"rule": {"family": "ip", "table": "t", "chain": "post", "handle": 7, "expr": [
 {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.1.3.0", "len": 24}}}},
 {"masquerade": null}]}}]}`

const sourceRulesNFTListing = `table ip t { # handle 1
	chain pre { # handle 1
		type nat hook prerouting priority dstnat; policy accept;
		ip saddr 10.1.2.128/25 dnat to 10.0.0.3:80 # handle 3
		ip saddr != 10.1.0.0/16 dnat to 10.0.0.2:80 # handle 4
		ip saddr 10.1.2.77 dnat to 10.0.0.5:80 # handle 5
		dnat to 10.0.0.1:80 # handle 6
	}
	chain post { # handle 2
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.1.3.0/24 masquerade # handle 7
	}
}
`

// TestAttributionCacheSourcesMatchWalk: the cache keeps an answer for
// every source that shares what the walk read of it, so a source that
// shares those bits but meets some test differently would get a wrong
// rule. Connections from sources at and around every prefix and address
// the rules name (the first and last address of each, the addresses just
// inside and just outside, loopback, IPv4-mapped) to the addresses and
// ports the rules name are attributed with the cache and by a walk each,
// on kube-proxy's IPVS mode with portmap and its ipsets, its iptables
// filter rules, its nftables mode, portmap's nftables backend, and rules
// where the source's prefix picks the rule (iptables and ip6tables, and
// nftables). The rules must come out the same.
func TestAttributionCacheSourcesMatchWalk(t *testing.T) {
	guest.SkipKernelIndependent(t)
	read := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	ipvs := &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "172.18.0.2/16", Up: true},
			{Interface: "kube-ipvs0", Address: "10.96.0.10/32"}, {Interface: "kube-ipvs0", Address: "10.96.0.20/32"}},
		Rules:  map[string]string{"all": read("../rules/testdata/appended.save")},
		Ipsets: read("../rules/testdata/ipsets.save"),
	}
	kubeNFT, _ := kubeProxyNFTNode(t, "kube-proxy-v1.37.2.json", "kube-proxy-v1.37.2.nft")
	nodes := map[string]*trace.Snapshot{
		"source prefixes decide": {Addresses: []trace.Address{{Interface: "eth0", Address: "192.168.0.2/24", Up: true},
			{Interface: "eth0", Address: "fd00:192::2/64", Up: true}},
			Rules: map[string]string{"all": sourceRules, "ip6/all": sourceRules6}},
		"source prefixes decide (nftables)": {Addresses: []trace.Address{{Interface: "eth0", Address: "192.168.0.2/24", Up: true}},
			NFTables: &trace.NFTRuleset{JSON: []byte(sourceRulesNFT), Listing: sourceRulesNFTListing}},
		"kube-proxy IPVS and portmap (iptables, ipsets)": ipvs,
		"kube-proxy iptables filter":                     kubeProxyNode(t),
		"kube-proxy nftables":                            kubeNFT,
		"portmap nftables dual-stack":                    portmapNode(t, "v1.10.0-dualstack"),
		"portmap nftables v1.8":                          portmapNode(t, "v1.8.0"),
	}
	for name, snap := range nodes {
		t.Run(name, func(t *testing.T) {
			env, err := NewNodeEnv("node-1", snap, NewSnapshotMetadata(snap.Pods, snap.Services))
			if err != nil {
				t.Fatal(err)
			}
			text := snapshotRuleText(snap)
			sources, dsts, targets := sourcesAround(text), destinationsIn(text, snap), natTargetsIn(text)
			rng := rand.New(rand.NewPCG(1, 2))
			decisions := make([]event.Event, 0, 120)
			for range cap(decisions) {
				decisions = append(decisions, randomDecision(rng, dsts, targets))
			}
			evs := make([]event.Event, 0, 6000)
			for i := range cap(evs) {
				evs = append(evs, fromSource(decisions[rng.IntN(len(decisions))], sources, rng, uint16(1024+i)))
			}
			cached := joinWith(t, env, evs)
			walked := joinWith(t, uncachedEnv{env}, evs)
			attributed := 0
			for i := range cached {
				c, w := ruleJSON(t, cached[i]), ruleJSON(t, walked[i])
				if c != w {
					t.Fatalf("flow %d %s -> %s (%s):\ncached %s\nwalked %s", i, cached[i].Orig.Src, cached[i].Orig.Dst,
						cached[i].Events[0].Kind, c, w)
				}
				if cached[i].Rule != nil && cached[i].Rule.Uncertain == "" {
					attributed++
				}
			}
			hits, misses := env.AttributionCacheStats()
			t.Logf("%d flows of %d decisions from %d sources, %d attributed to a rule: %d hits, %d walks", len(cached), len(decisions), len(sources), attributed, hits, misses)
			if hits < misses || attributed < 100 {
				t.Errorf("%d hits, %d walks, %d attributed: too few to tell the cache's answers from the walks'", hits, misses, attributed)
			}
		})
	}
}

// snapshotRuleText is every rule and set member a snapshot holds, as text.
func snapshotRuleText(s *trace.Snapshot) string {
	text := s.Ipsets
	for _, r := range s.Rules {
		text += r
	}
	if s.NFTables != nil {
		text += s.NFTables.Listing
	}
	return text
}

var (
	ipv4Prefix = regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}(/\d{1,2})?\b`)
	ipv6Prefix = regexp.MustCompile(`\b[0-9a-f]{1,4}(:[0-9a-f]{0,4}){2,7}(/\d{1,3})?`)
	// linePort is a port a rule line matches: --dport 80, dport 80, or a
	// set element's ". tcp . 80".
	linePort  = regexp.MustCompile(`(?:dport|\. (?:tcp|udp) \.)\s+(\d{1,5})\b`)
	natTarget = regexp.MustCompile(`(?:to-destination|to-source|dnat (?:ip6? )?to|snat (?:ip6? )?to)\s+(\[[0-9a-f:]+\]:\d+|[0-9.]+:\d+|[0-9a-f.:]+)`)
)

// prefixesIn is every address and prefix text names.
func prefixesIn(text string) []netip.Prefix {
	var out []netip.Prefix
	for _, m := range append(ipv4Prefix.FindAllString(text, -1), ipv6Prefix.FindAllString(text, -1)...) {
		p, err := netip.ParsePrefix(m)
		if err != nil {
			a, err := netip.ParseAddr(m)
			if err != nil {
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out
}

// sourcesAround is, for every address and prefix in text, its first and
// last address, the addresses just outside it and those just inside, with
// loopback, IPv4-mapped and some addresses the rules do not name.
func sourcesAround(text string) []netip.Addr {
	seen := map[netip.Addr]bool{}
	add := func(a netip.Addr) {
		if a.IsValid() {
			seen[a] = true
		}
	}
	for _, s := range []string{"127.0.0.1", "127.0.0.5", "127.1.0.1", "10.0.0.2", "10.88.0.9", "10.244.1.77",
		"203.0.113.5", "172.18.0.9", "::1", "fd00::9", "2001:db8::5", "::ffff:10.88.0.9", "::ffff:127.0.0.1"} {
		add(netip.MustParseAddr(s))
	}
	for _, p := range prefixesIn(text) {
		first, last := p.Addr(), lastOf(p)
		add(first)
		add(last)
		add(first.Prev())
		add(last.Next())
		if p.Bits() < p.Addr().BitLen() {
			add(first.Next())
			add(last.Prev())
		}
	}
	return slices.SortedFunc(maps.Keys(seen), netip.Addr.Compare)
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// destinationsIn is every address a line of text names with every port
// the same line matches, and the node's addresses with every port.
func destinationsIn(text string, snap *trace.Snapshot) []netip.AddrPort {
	seen := map[netip.AddrPort]bool{}
	var ports []uint16
	var nodeAddrs []netip.Addr
	for _, a := range snap.Addresses {
		if p, err := netip.ParsePrefix(a.Address); err == nil {
			nodeAddrs = append(nodeAddrs, p.Addr())
		}
	}
	for line := range strings.Lines(text) {
		var linePorts []uint16
		for _, m := range linePort.FindAllStringSubmatch(line, -1) {
			if n, err := strconv.ParseUint(m[1], 10, 16); err == nil {
				linePorts = append(linePorts, uint16(n))
			}
		}
		ports = append(ports, linePorts...)
		for _, p := range prefixesIn(line) {
			for _, port := range append(linePorts, 80) {
				seen[netip.AddrPortFrom(p.Addr(), port)] = true
			}
		}
	}
	for _, a := range nodeAddrs {
		for _, port := range append(ports, 22, 80) {
			seen[netip.AddrPortFrom(a, port)] = true
		}
	}
	return slices.SortedFunc(maps.Keys(seen), netip.AddrPort.Compare)
}

// natTargetsIn is every NAT target text names.
func natTargetsIn(text string) []netip.AddrPort {
	seen := map[netip.AddrPort]bool{}
	for _, m := range natTarget.FindAllStringSubmatch(text, -1) {
		if ap, err := netip.ParseAddrPort(m[1]); err == nil {
			seen[ap] = true
		} else if a, err := netip.ParseAddr(m[1]); err == nil {
			seen[netip.AddrPortFrom(a, 0)] = true
		}
	}
	return slices.SortedFunc(maps.Keys(seen), netip.AddrPort.Compare)
}

// randomDecision is one decision of the kernel on a connection, its source
// left to fromSource: a DNAT at PREROUTING or OUTPUT to one of the rules'
// targets, a SNAT at POSTROUTING, a REJECT or a netfilter drop.
func randomDecision(rng *rand.Rand, dsts, targets []netip.AddrPort) event.Event {
	dst := dsts[rng.IntN(len(dsts))]
	proto := uint8(6)
	if rng.IntN(4) == 0 {
		proto = 17
	}
	orig := event.Tuple{Dst: dst.Addr(), DstPort: dst.Port(), Proto: proto}
	to := dst // when the rules name no target of its family
	family := slices.DeleteFunc(slices.Clone(targets), func(t netip.AddrPort) bool { return t.Addr().Is4() != dst.Addr().Is4() })
	if len(family) > 0 {
		to = family[rng.IntN(len(family))]
	}
	switch rng.IntN(5) {
	case 0, 1:
		hook := uint8(0)
		if rng.IntN(3) == 0 {
			hook = 3
		}
		return event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, NFHook: hook, Orig: orig,
			Reply: event.Tuple{Src: to.Addr(), SrcPort: to.Port(), Proto: proto},
			To:    event.Range{MinAddr: to.Addr(), MaxAddr: to.Addr(), MinPort: to.Port(), MaxPort: to.Port()}}
	case 2:
		return event.Event{Kind: event.KindSNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, NFHook: 4, Orig: orig,
			Reply: event.Tuple{Src: dst.Addr(), Dst: to.Addr(), SrcPort: dst.Port(), Proto: proto},
			To:    event.Range{MinAddr: to.Addr(), MaxAddr: to.Addr()}}
	case 3:
		return event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
			Packet: orig, ICMPType: 3, ICMPCode: 3}
	}
	return event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet: orig, HasReason: true}
}

// fromSource is decision d made on a connection from a random source of
// the destination's family, from port sport.
func fromSource(d event.Event, sources []netip.Addr, rng *rand.Rand, sport uint16) event.Event {
	dst := d.Orig.Dst
	if !dst.IsValid() {
		dst = d.Packet.Dst
	}
	src := sources[rng.IntN(len(sources))]
	for src.Unmap().Is4() != dst.Is4() {
		src = sources[rng.IntN(len(sources))]
	}
	for _, t := range []*event.Tuple{&d.Orig, &d.Packet} {
		if t.Dst.IsValid() {
			t.Src, t.SrcPort = src, sport
		}
	}
	if d.Kind == event.KindDNAT {
		d.Reply.Dst, d.Reply.DstPort = src, sport
	}
	if d.Kind == event.KindSNAT {
		d.Reply.DstPort = sport
	}
	return d
}

// joinWith joins evs, one connection each, in env, a millisecond apart.
func joinWith(t *testing.T, env Env, evs []event.Event) []*trace.Flow {
	t.Helper()
	var out []*trace.Flow
	j := NewStages(&join.Joiner{Names: netfilterDrop{}}, &Enricher{Env: func(time.Time) Env { return env }, Emit: func(f *trace.Flow) { out = append(out, f) }})
	now := time.Unix(1700000000, 0)
	for _, e := range evs {
		now = now.Add(time.Millisecond)
		e.Time = now
		j.Add(e, now)
	}
	j.Flush()
	if len(out) != len(evs) {
		t.Fatalf("%d connections gave %d flows", len(evs), len(out))
	}
	slices.SortStableFunc(out, func(a, b *trace.Flow) int { return a.Time.Compare(b.Time) })
	return out
}

func ruleJSON(t *testing.T, f *trace.Flow) string {
	t.Helper()
	b, err := json.Marshal(f.Rule)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
