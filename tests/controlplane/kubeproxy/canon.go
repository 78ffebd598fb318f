package kubeproxy

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Canonical turns `nft -j list ruleset` output into lines that compare
// equal for two rulesets of the same structure: what kube-proxy v1.37
// writes differs between runs only in what is dropped or sorted here.
//
//   - Handles are dropped. Setup chains, sets and their rules are created
//     in a fixed order, but the per-Service chains are written in Go map
//     order (the proxier ranges over its service map), so their handles,
//     and the position of those chains in the listing, change from run to
//     run.
//   - Tables, chains, sets and maps are sorted by family, table and name;
//     each rule is listed under its chain, in the chain's order (rule order
//     matters).
//   - Set and map elements are sorted.
//   - The metainfo object (the nft version that listed the ruleset, not
//     anything kube-proxy wrote) is dropped.
//
// Names, including the hashes in per-Service chain names, are kept: they
// are a function of namespace, name, protocol and port.
func Canonical(rulesetJSON []byte) ([]string, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(rulesetJSON, &doc); err != nil {
		return nil, fmt.Errorf("parse nft json: %w", err)
	}
	type entry struct {
		key  string
		line string
	}
	var objs []entry
	rules := map[string][]string{}
	for _, o := range doc.Nftables {
		for kind, raw := range o {
			if kind == "metainfo" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal(raw, &m); err != nil {
				return nil, fmt.Errorf("parse nft json %s: %w", kind, err)
			}
			delete(m, "handle")
			if elems, ok := m["elem"].([]any); ok {
				sort.Slice(elems, func(i, j int) bool { return jsonString(elems[i]) < jsonString(elems[j]) })
			}
			family, _ := m["family"].(string)
			table, _ := m["table"].(string)
			name, _ := m["name"].(string)
			switch kind {
			case "rule":
				chain, _ := m["chain"].(string)
				k := family + " " + table + " " + chain
				rules[k] = append(rules[k], fmt.Sprintf("rule %s %d %s", k, len(rules[k]), jsonString(m)))
			case "table":
				objs = append(objs, entry{key: family + " " + name, line: "table " + jsonString(m)})
			default:
				objs = append(objs, entry{key: family + " " + table + " " + name, line: kind + " " + jsonString(m)})
			}
		}
	}
	sort.SliceStable(objs, func(i, j int) bool {
		if objs[i].key != objs[j].key {
			return objs[i].key < objs[j].key
		}
		return objs[i].line < objs[j].line
	})
	var out []string
	for _, e := range objs {
		out = append(out, e.line)
		if strings.HasPrefix(e.line, "chain ") {
			out = append(out, rules[e.key]...)
			delete(rules, e.key)
		}
	}
	if len(rules) > 0 {
		var orphans []string
		for k := range rules {
			orphans = append(orphans, k)
		}
		sort.Strings(orphans)
		return nil, fmt.Errorf("nft json: rules of chains not listed: %s", strings.Join(orphans, ", "))
	}
	return out, nil
}

// jsonString encodes v with sorted object keys.
func jsonString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(b)
}

// LineDiff lists the lines only in want ("-") or only in got ("+"), in
// order, counting duplicates.
func LineDiff(want, got []string) []string {
	count := map[string]int{}
	for _, l := range got {
		count[l]++
	}
	var d []string
	for _, l := range want {
		if count[l] > 0 {
			count[l]--
			continue
		}
		d = append(d, "- "+l)
	}
	seen := map[string]int{}
	for _, l := range want {
		seen[l]++
	}
	for _, l := range got {
		if seen[l] > 0 {
			seen[l]--
			continue
		}
		d = append(d, "+ "+l)
	}
	return d
}
