// Package nftgen writes kube-proxy nftables-mode tables of any size for
// the tests and benchmarks: the `nft -f` script, and the JSON and listing
// nft would print for it (internal/nft's TestGeneratedMatchesNFT loads
// the script into the real nft and compares).
package nftgen

import (
	"encoding/json"
	"fmt"
	"strings"
)

// genTable writes a kube-proxy nftables-mode table (the 1.34+
// layout, as the real kube-proxy v1.37.2 writes it: internal/nft/testdata)
// of n ClusterIP Services with eps endpoints each, three ways: the `nft -f`
// script, the `nft -j list ruleset` JSON and the `nft -a list ruleset`
// listing nft would print for it. Service i has ClusterIP 172.30.X.Y (i
// from 1) port 80 and endpoints 10.180.E.F:8080.
type genTable struct {
	script, listing strings.Builder
	items           []map[string]any
	handle          int
}

func (g *genTable) next() int { g.handle++; return g.handle }

// SvcIP is Service i's ClusterIP.
func SvcIP(i int) string { return fmt.Sprintf("172.30.%d.%d", i/250, i%250+1) }

// EpIP is the address of endpoint e of Service i.
func EpIP(i, e int) string {
	n := i*8 + e
	return fmt.Sprintf("10.180.%d.%d", n/250, n%250+1)
}

// KubeProxy is a table of n Services (1 to n) with eps endpoints each.
func KubeProxy(n, eps int) (script string, js, listing []byte) {
	g := &genTable{}
	g.items = append(g.items, map[string]any{"metainfo": map[string]any{"version": "1.0.6", "json_schema_version": 1}})
	g.items = append(g.items, map[string]any{"table": map[string]any{"family": "ip", "name": "kube-proxy", "handle": 1}})
	g.script.WriteString("table ip kube-proxy {\n")
	g.listing.WriteString("table ip kube-proxy { # handle 1\n")

	// Sets and maps.
	var clusterIPs []any
	var serviceIPs []any
	var ipsText, vmapText []string
	for i := 1; i <= n; i++ {
		clusterIPs = append(clusterIPs, SvcIP(i))
		ipsText = append(ipsText, SvcIP(i))
		chain := SvcChain(i)
		serviceIPs = append(serviceIPs, []any{map[string]any{"concat": []any{SvcIP(i), "tcp", 80}}, map[string]any{"goto": map[string]any{"target": chain}}})
		vmapText = append(vmapText, fmt.Sprintf("%s . tcp . 80 : goto %s", SvcIP(i), chain))
	}
	h := g.next()
	g.items = append(g.items, map[string]any{"set": map[string]any{"family": "ip", "name": "cluster-ips", "table": "kube-proxy", "type": "ipv4_addr", "handle": h, "elem": clusterIPs}})
	fmt.Fprintf(&g.script, "\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\telements = { %s }\n\t}\n", strings.Join(ipsText, ", "))
	fmt.Fprintf(&g.listing, "\tset cluster-ips { # handle %d\n\t\ttype ipv4_addr\n\t\telements = { %s }\n\t}\n", h, strings.Join(ipsText, ", "))
	h = g.next()
	g.items = append(g.items, map[string]any{"map": map[string]any{"family": "ip", "name": "service-ips", "table": "kube-proxy",
		"type": []any{"ipv4_addr", "inet_proto", "inet_service"}, "handle": h, "map": "verdict", "elem": serviceIPs}})
	fmt.Fprintf(&g.script, "\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = { %s }\n\t}\n", strings.Join(vmapText, ", "))
	fmt.Fprintf(&g.listing, "\tmap service-ips { # handle %d\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = { %s }\n\t}\n", h, strings.Join(vmapText, ", "))

	g.chain("mark-for-masquerade", "", rule{"meta mark set meta mark | 0x00004000", []any{
		map[string]any{"mangle": map[string]any{"key": meta("mark"), "value": map[string]any{"|": []any{meta("mark"), 16384}}}}}})
	g.chain("nat-prerouting", "type nat hook prerouting priority dstnat; policy accept;", rule{"jump services", []any{jump("services")}})
	g.chain("nat-output", "type nat hook output priority -100; policy accept;", rule{"jump services", []any{jump("services")}})
	g.chain("filter-output", "type filter hook output priority filter; policy accept;", rule{"ct state new jump cluster-ips-check",
		[]any{match("in", map[string]any{"ct": map[string]any{"key": "state"}}, "new"), jump("cluster-ips-check")}})
	g.chain("cluster-ips-check", "", rule{`ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`,
		[]any{match("==", payload("ip", "daddr"), "@cluster-ips"), map[string]any{"reject": map[string]any{"type": "icmp", "expr": "port-unreachable"}}}})
	g.chain("services", "", rule{"ip daddr . meta l4proto . th dport vmap @service-ips", []any{map[string]any{"vmap": map[string]any{
		"key":  map[string]any{"concat": []any{payload("ip", "daddr"), meta("l4proto"), payload("th", "dport")}},
		"data": "@service-ips"}}}})
	for i := 1; i <= n; i++ {
		var elems []any
		var texts []string
		for e := 0; e < eps; e++ {
			ep := EpChain(i, e)
			elems = append(elems, []any{e, map[string]any{"goto": map[string]any{"target": ep}}})
			texts = append(texts, fmt.Sprintf("%d : goto %s", e, ep))
			g.chain(ep, "",
				rule{fmt.Sprintf("ip saddr %s jump mark-for-masquerade", EpIP(i, e)), []any{match("==", payload("ip", "saddr"), EpIP(i, e)), jump("mark-for-masquerade")}},
				rule{fmt.Sprintf("meta l4proto tcp dnat to %s:8080", EpIP(i, e)), []any{match("==", meta("l4proto"), "tcp"), map[string]any{"dnat": map[string]any{"addr": EpIP(i, e), "port": 8080}}}})
		}
		g.chain(SvcChain(i), "",
			rule{fmt.Sprintf("ip daddr %s ip saddr != 10.180.0.0/16 jump mark-for-masquerade", SvcIP(i)), []any{
				match("==", payload("ip", "daddr"), SvcIP(i)),
				match("!=", payload("ip", "saddr"), map[string]any{"prefix": map[string]any{"addr": "10.180.0.0", "len": 16}}),
				jump("mark-for-masquerade")}},
			rule{fmt.Sprintf("numgen random mod %d vmap { %s }", eps, strings.Join(texts, ", ")), []any{map[string]any{"vmap": map[string]any{
				"key": map[string]any{"numgen": map[string]any{"mode": "random", "mod": eps, "offset": 0}}, "data": map[string]any{"set": elems}}}}})
	}
	g.script.WriteString("}\n")
	g.listing.WriteString("}\n")
	b, err := json.Marshal(map[string]any{"nftables": g.items})
	if err != nil {
		panic(err)
	}
	return g.script.String(), b, []byte(g.listing.String())
}

type rule struct {
	text string
	expr []any
}

func (g *genTable) chain(name, base string, rules ...rule) {
	h := g.next()
	c := map[string]any{"family": "ip", "table": "kube-proxy", "name": name, "handle": h}
	fmt.Fprintf(&g.script, "\tchain %s {\n", name)
	fmt.Fprintf(&g.listing, "\tchain %s { # handle %d\n", name, h)
	if base != "" {
		f := strings.Fields(base)
		c["type"], c["hook"], c["policy"] = f[1], f[3], "accept"
		c["prio"] = map[string]int{"dstnat": -100, "-100": -100, "filter": 0}[strings.TrimSuffix(f[5], ";")]
		fmt.Fprintf(&g.script, "\t\t%s\n", base)
		fmt.Fprintf(&g.listing, "\t\t%s\n", base)
	}
	g.items = append(g.items, map[string]any{"chain": c})
	for _, r := range rules {
		rh := g.next()
		g.items = append(g.items, map[string]any{"rule": map[string]any{"family": "ip", "table": "kube-proxy", "chain": name, "handle": rh, "expr": r.expr}})
		fmt.Fprintf(&g.script, "\t\t%s\n", r.text)
		fmt.Fprintf(&g.listing, "\t\t%s # handle %d\n", r.text, rh)
	}
	g.script.WriteString("\t}\n")
	g.listing.WriteString("\t}\n")
}

// SvcChain is Service i's chain.
func SvcChain(i int) string { return fmt.Sprintf("service-%08X-ns%d/svc%d/tcp/p80", i, i, i) }

// EpChain is the chain of endpoint e of Service i.
func EpChain(i, e int) string {
	return fmt.Sprintf("endpoint-%08X-ns%d/svc%d/tcp/p80__%s/8080", i*8+e, i, i, EpIP(i, e))
}

func meta(k string) map[string]any { return map[string]any{"meta": map[string]any{"key": k}} }
func payload(p, f string) map[string]any {
	return map[string]any{"payload": map[string]any{"protocol": p, "field": f}}
}
func jump(c string) map[string]any { return map[string]any{"jump": map[string]any{"target": c}} }
func match(op string, l, r any) map[string]any {
	return map[string]any{"match": map[string]any{"op": op, "left": l, "right": r}}
}
