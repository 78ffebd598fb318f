package kubeproxy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/tracer-dev/tracer/internal/nft"
	"github.com/tracer-dev/tracer/internal/rules"
)

// IPTablesView says which part of an iptables-save dump a model holds.
type IPTablesView struct {
	// Chain selects whole chains: every rule, in order.
	Chain func(table, chain string) bool
	// Jump selects single rules of the other chains, keyed by the chain
	// they jump to and their comment rather than their position:
	// kube-proxy writes KUBE-SERVICES' per-Service jumps in Go map order.
	Jump func(r *rules.Rule) bool
}

// IPTablesModel reads an iptables-save dump with the tracer's own parser
// (internal/rules) and models what view selects: per chain its policy and
// its rules as iptables-save prints them, hash-named chains replaced by
// their identities (id).
func IPTablesModel(save string, id *Idents, view IPTablesView) (*Model, error) {
	rs, err := rules.ParseSaveString(save, rules.IPv4)
	if err != nil {
		return nil, fmt.Errorf("model iptables-save: %w", err)
	}
	m := newModel()
	for _, tname := range sortedKeys(rs.Tables) {
		t := rs.Tables[tname]
		for _, cname := range t.Order {
			c := t.Chains[cname]
			key := tname + " " + id.IPTables(cname)
			if view.Chain(tname, cname) {
				m.Facts["iptables chain "+key] = "policy " + orDash(c.Policy)
				m.Chains[key] = ruleTexts(c, id)
				continue
			}
			addJumps(m, key, c, id, view)
		}
	}
	return m, nil
}

func addJumps(m *Model, key string, c *rules.Chain, id *Idents, view IPTablesView) {
	seen := map[string]int{}
	for _, r := range c.Rules {
		if view.Jump == nil || !view.Jump(r) {
			continue
		}
		k := fmt.Sprintf("iptables rule %s -j %s %q", key, id.IPTables(r.Target.Name), r.Comment)
		seen[k]++
		if seen[k] > 1 {
			k += " #" + strconv.Itoa(seen[k])
		}
		m.Facts[k] = ruleText(r, id)
	}
}

func ruleTexts(c *rules.Chain, id *Idents) []string {
	out := make([]string, len(c.Rules))
	for i, r := range c.Rules {
		out[i] = ruleText(r, id)
	}
	return out
}

// ruleText is the rule as iptables-save printed it, without "-A CHAIN".
func ruleText(r *rules.Rule, id *Idents) string {
	return id.IPTables(strings.TrimPrefix(r.Text, "-A "+r.Chain+" "))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// NFTablesModel reads `nft -j list ruleset` and `nft -a list ruleset`
// with the tracer's own parser (internal/nft) and models every table:
// base chains' type, hook, priority and policy; each chain's rules in
// order as nft prints them; each set's and map's key and value types;
// each element's key, comment and verdict. Handles and listing order are
// left out: kube-proxy writes its per-Service chains in Go map order.
func NFTablesModel(js, listing []byte) (*Model, error) {
	rs, err := nft.Parse(js, listing, nil)
	if err != nil {
		return nil, fmt.Errorf("model nft ruleset: %w", err)
	}
	m := newModel()
	for i, w := range rs.Warnings {
		m.Facts[fmt.Sprintf("nft parse warning %d", i+1)] = NFTIdent(w)
	}
	for _, t := range rs.Tables {
		m.Facts["nft table "+t.ID()] = "present"
		for _, c := range t.Chains {
			nftChain(m, t, c)
		}
		for _, s := range t.Sets {
			nftSet(m, t, s)
		}
	}
	return m, nil
}

func nftChain(m *Model, t *nft.Table, c *nft.Chain) {
	key := t.ID() + " " + NFTIdent(c.Name)
	kind := "regular"
	if c.Base() {
		kind = fmt.Sprintf("type %s hook %s priority %d policy %s", c.Type, c.Hook, c.Prio, c.Policy)
	}
	m.Facts["nft chain "+key] = kind
	rules := make([]string, len(c.Rules))
	for i, r := range c.Rules {
		rules[i] = NFTIdent(r.Display())
	}
	m.Chains[key] = rules
}

func nftSet(m *Model, t *nft.Table, s *nft.Set) {
	key := t.ID() + " " + s.Name
	kind := "set " + strings.Join(s.KeyTypes, " . ")
	if s.DataType != "" {
		kind = "map " + strings.Join(s.KeyTypes, " . ") + " : " + s.DataType
	}
	if s.Dynamic {
		kind += " dynamic"
	}
	m.Facts["nft set "+key] = kind
	for _, e := range s.Elems {
		v := "comment " + strconv.Quote(e.Comment)
		if e.Verdict != nil {
			v += " : " + NFTIdent(e.Verdict.String())
		}
		m.Facts["nft element "+key+" { "+e.KeyText()+" }"] = v
	}
}

// IPVSModel adds IPVS mode's other state to m: every ipset (`ipset save`:
// its type and options but the hash seed, each entry), every IPVS virtual and real server
// (`ipvsadm -Sn`: scheduler, forwarding method, weight) and kube-ipvs0
// (`ip -d -o link show` and `ip -4 -o addr show` of it: kind, state,
// addresses).
func IPVSModel(m *Model, ipsetSave, ipvsadmSave, link, addrs string) {
	for _, l := range strings.Split(ipsetSave, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "create":
			m.Facts["ipset "+f[1]] = strings.Join(withoutInitval(f[2:]), " ")
		case len(f) >= 3 && f[0] == "add":
			m.Facts["ipset "+f[1]+" entry "+f[2]] = strings.Join(append([]string{"present"}, f[3:]...), " ")
		}
	}
	for _, l := range strings.Split(ipvsadmSave, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "-A":
			m.Facts["ipvs virtual server "+f[1]+" "+f[2]] = strings.Join(f[3:], " ")
		case len(f) >= 5 && f[0] == "-a" && f[3] == "-r":
			m.Facts["ipvs virtual server "+f[1]+" "+f[2]+" real server "+f[4]] = strings.Join(f[5:], " ")
		}
	}
	m.Facts["kube-ipvs0 link"] = linkShape(link)
	for _, l := range strings.Split(addrs, "\n") {
		f := strings.Fields(l)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" {
				m.Facts["kube-ipvs0 address "+f[i+1]] = "present"
			}
		}
	}
}

// withoutInitval drops a hash set's "initval 0x…": the random seed the
// kernel picks for its hash, not anything kube-proxy chose.
func withoutInitval(opts []string) []string {
	var out []string
	for i := 0; i < len(opts); i++ {
		if opts[i] == "initval" {
			i++
			continue
		}
		out = append(out, opts[i])
	}
	return out
}

// linkShape is the kind and state words of `ip -d -o link show`: "dummy
// DOWN", "bridge DOWN", or "absent".
func linkShape(link string) string {
	f := strings.Fields(link)
	if len(f) == 0 {
		return "absent"
	}
	var kind, state string
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "state" {
			state = f[i+1]
		}
		if f[i] == "dummy" || f[i] == "bridge" {
			kind = f[i]
		}
	}
	return strings.TrimSpace(kind + " " + state)
}
