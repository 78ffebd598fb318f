package nft

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// ErrNoJSON is returned for input that is not `nft -j list ruleset` output.
var ErrNoJSON = errors.New(`not nft JSON: expected {"nftables": [...]}`)

type jDoc struct {
	Nftables []jItem `json:"nftables"`
}

type jItem struct {
	Table *jTable `json:"table"`
	Chain *jChain `json:"chain"`
	Rule  *jRule  `json:"rule"`
	Set   *jSet   `json:"set"`
	Map   *jSet   `json:"map"`
}

type jTable struct {
	Family string `json:"family"`
	Name   string `json:"name"`
	Handle uint64 `json:"handle"`
}

type jChain struct {
	Family string `json:"family"`
	Table  string `json:"table"`
	Name   string `json:"name"`
	Handle uint64 `json:"handle"`
	Type   string `json:"type"`
	Hook   string `json:"hook"`
	Prio   *int   `json:"prio"`
	Policy string `json:"policy"`
}

// jRule and jSet keep their expressions and elements as decoded JSON
// values: the document is decoded once, never re-scanned part by part.
type jRule struct {
	Family  string `json:"family"`
	Table   string `json:"table"`
	Chain   string `json:"chain"`
	Handle  uint64 `json:"handle"`
	Comment string `json:"comment"`
	Expr    []any  `json:"expr"`
}

type jSet struct {
	Family string `json:"family"`
	Table  string `json:"table"`
	Name   string `json:"name"`
	Type   any    `json:"type"`
	Map    any    `json:"map"`
	Flags  any    `json:"flags"`
	Elem   []any  `json:"elem"`
}

// Parse reads `nft -j list ruleset` output and, when listing is not nil,
// takes each rule's text from `nft -a list ruleset` output by handle.
// skip leaves out tables by "family name" (iptables-nft's own, which the
// iptables source reads). Parts it cannot read become Warnings and make
// the rules that hold them undecidable; only input that is not nft JSON at
// all is an error.
func Parse(data, listing []byte, skip func(family, name string) bool) (*Ruleset, error) {
	var doc jDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("read nft json: %w", err)
	}
	if doc.Nftables == nil {
		return nil, ErrNoJSON
	}
	p := &parser{rs: &Ruleset{}, tables: map[string]*Table{}}
	texts := map[textKey]string{}
	if listing != nil {
		texts = ruleTexts(listing)
	}
	// Sets and chains first: rules refer to both, and the listing order is
	// not something to rely on.
	for _, it := range doc.Nftables {
		switch {
		case it.Table != nil:
			if t := p.table(it.Table.Family, it.Table.Name, skip); t != nil {
				t.Handle = it.Table.Handle
			}
		case it.Set != nil:
			p.set(it.Set, skip)
		case it.Map != nil:
			p.set(it.Map, skip)
		case it.Chain != nil:
			p.chain(it.Chain, skip)
		}
	}
	for _, it := range doc.Nftables {
		if it.Rule == nil {
			continue
		}
		p.rule(it.Rule, texts)
	}
	p.rs.index()
	return p.rs, nil
}

type parser struct {
	rs     *Ruleset
	tables map[string]*Table
}

func (p *parser) warn(format string, args ...any) {
	if len(p.rs.Warnings) < 50 {
		p.rs.Warnings = append(p.rs.Warnings, fmt.Sprintf(format, args...))
	}
}

func (p *parser) table(family, name string, skip func(string, string) bool) *Table {
	id := family + " " + name
	if t, ok := p.tables[id]; ok {
		return t
	}
	if skip != nil && skip(family, name) {
		return nil
	}
	t := &Table{Family: family, Name: name, Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
	p.tables[id] = t
	p.rs.Tables = append(p.rs.Tables, t)
	return t
}

func (p *parser) chain(j *jChain, skip func(string, string) bool) {
	t := p.table(j.Family, j.Table, skip)
	if t == nil {
		return
	}
	c := &Chain{Table: t, Name: j.Name, Handle: j.Handle, Type: j.Type, Hook: j.Hook, Policy: j.Policy}
	if j.Prio != nil {
		c.Prio = *j.Prio
	}
	if c.Hook != "" && c.Policy == "" {
		c.Policy = "accept"
	}
	t.Chains[c.Name] = c
	t.Order = append(t.Order, c)
}

func (p *parser) set(j *jSet, skip func(string, string) bool) {
	t := p.table(j.Family, j.Table, skip)
	if t == nil {
		return
	}
	s := &Set{Table: t, Name: j.Name}
	switch ty := j.Type.(type) {
	case string:
		s.KeyTypes = []string{ty}
	case []any:
		for _, x := range ty {
			n, _ := x.(string)
			s.KeyTypes = append(s.KeyTypes, n)
		}
	default:
		p.warn("set %s %s: type %s not read", t.ID(), j.Name, clip(j.Type))
	}
	switch m := j.Map.(type) {
	case nil:
	case string:
		s.DataType = m
	default:
		s.DataType = "concat"
	}
	s.Dynamic = hasFlag(j.Flags, "dynamic")
	types := make([]vtype, len(s.KeyTypes))
	for i, n := range s.KeyTypes {
		types[i] = typeByName[n]
	}
	s.Elems = make([]*Elem, 0, len(j.Elem))
	for _, raw := range j.Elem {
		e, err := p.elem(raw, types, s.DataType)
		if err != nil {
			p.warn("set %s %s: element %s: %v", t.ID(), j.Name, clip(raw), err)
			continue
		}
		s.Elems = append(s.Elems, e)
	}
	t.Sets[s.Name] = s
}

// elem reads one element: a key, {"elem": {"val": key, "comment": ...}},
// or for a map [key, value].
func (p *parser) elem(raw any, types []vtype, dataType string) (*Elem, error) {
	e := &Elem{}
	key := raw
	var value any
	if dataType != "" {
		pair, ok := raw.([]any)
		if !ok || len(pair) != 2 {
			return nil, errors.New("a map element is not a [key, value] pair")
		}
		key, value = pair[0], pair[1]
	}
	if m, ok := key.(map[string]any); ok {
		if w, ok := m["elem"].(map[string]any); ok {
			key = w["val"]
			e.Comment, _ = w["comment"].(string)
		}
	}
	parts, err := concatConst(key, types)
	if err != nil {
		return nil, err
	}
	e.Key = parts
	switch {
	case dataType == "verdict":
		v, err := readVerdict(value)
		if err != nil {
			return nil, err
		}
		e.Verdict = v
	case dataType != "":
		dt := []vtype{tInt}
		if t, ok := typeByName[dataType]; ok {
			dt = []vtype{t}
		}
		d, err := concatConst(value, dt)
		if err != nil {
			return nil, fmt.Errorf("map value: %w", err)
		}
		e.Data = d
	}
	return e, nil
}

func hasFlag(flags any, name string) bool {
	switch f := flags.(type) {
	case string:
		return f == name
	case []any:
		for _, x := range f {
			if x == name {
				return true
			}
		}
	}
	return false
}

// concatConst reads a key of len(types) fields: a single constant or
// {"concat": [...]}.
func concatConst(raw any, types []vtype) ([]keyPart, error) {
	if m, ok := raw.(map[string]any); ok {
		if c, ok := m["concat"].([]any); ok {
			if len(c) != len(types) {
				return nil, fmt.Errorf("key has %d fields, the type %d", len(c), len(types))
			}
			parts := make([]keyPart, len(types))
			for i, f := range c {
				kp, err := constPart(f, types[i])
				if err != nil {
					return nil, err
				}
				parts[i] = kp
			}
			return parts, nil
		}
	}
	if len(types) != 1 {
		return nil, fmt.Errorf("key is one field, the type %d", len(types))
	}
	kp, err := constPart(raw, types[0])
	if err != nil {
		return nil, err
	}
	return []keyPart{kp}, nil
}

var verdictNames = map[string]verdictKind{"accept": vAccept, "drop": vDrop, "continue": vContinue,
	"return": vReturn, "jump": vJump, "goto": vGoto, "queue": vQueue}

// readVerdict reads {"accept": null}, {"jump": {"target": "x"}}, ...
func readVerdict(raw any) (*verdict, error) {
	o, ok := raw.(map[string]any)
	if !ok || len(o) != 1 {
		return nil, fmt.Errorf("verdict %s not read", clip(raw))
	}
	for k, v := range o {
		kind, ok := verdictNames[k]
		if !ok {
			return nil, fmt.Errorf("verdict %q not read", k)
		}
		vd := &verdict{kind: kind}
		if kind == vJump || kind == vGoto {
			t, _ := v.(map[string]any)
			vd.target, _ = t["target"].(string)
			if vd.target == "" {
				return nil, fmt.Errorf("%s without a target", k)
			}
		}
		return vd, nil
	}
	return nil, errors.New("empty verdict")
}

func (p *parser) rule(j *jRule, texts map[textKey]string) {
	t := p.tables[j.Family+" "+j.Table]
	if t == nil {
		return
	}
	c := t.Chains[j.Chain]
	if c == nil {
		p.warn("rule handle %d: chain %s %s not in the ruleset", j.Handle, t.ID(), j.Chain)
		return
	}
	r := &Rule{Chain: c, Handle: j.Handle, Comment: j.Comment, Text: texts[textKey{t.Family, t.Name, c.Name, j.Handle}]}
	r.stmts = make([]stmt, 0, len(j.Expr))
	for _, raw := range j.Expr {
		s, err := p.stmt(raw, t)
		if err != nil {
			p.warn("%s: %v", r.ID(), err)
			s = stmt{kind: sUnknown, why: err.Error()}
		}
		r.stmts = append(r.stmts, s)
	}
	c.Rules = append(c.Rules, r)
}

// ListedRules is how many rules a `nft -a list ruleset` listing shows, to
// check it against a JSON listing taken apart from it without parsing
// either.
func ListedRules(listing []byte) int { return len(ruleTexts(listing)) }

// JSONRules is how many rule objects `nft -j list ruleset` output holds.
func JSONRules(js []byte) int { return len(jsonRuleRe.FindAllIndex(js, -1)) }

var jsonRuleRe = regexp.MustCompile(`\{"rule":\s*\{`)

// textKey names a rule in the text listing.
type textKey struct {
	family, table, chain string
	handle               uint64
}

// ruleTexts cuts `nft -a list ruleset` into rule lines by handle. Lines
// inside set and map blocks, and chain headers, are not rules.
func ruleTexts(listing []byte) map[textKey]string {
	out := map[textKey]string{}
	var family, table, chain string
	inSet := false
	for _, line := range strings.Split(string(listing), "\n") {
		l := strings.TrimSpace(line)
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "table":
			family, table, chain, inSet = f[1], unquote(f[2]), "", false
			continue
		case len(f) >= 2 && f[0] == "chain" && strings.HasSuffix(strings.TrimSpace(stripHandle(l)), "{"):
			chain, inSet = unquote(f[1]), false
			continue
		case len(f) >= 2 && (f[0] == "set" || f[0] == "map" || f[0] == "flowtable" || f[0] == "counter" || f[0] == "quota" || f[0] == "ct"):
			if strings.HasSuffix(strings.TrimSpace(stripHandle(l)), "{") {
				inSet = true
				continue
			}
		case l == "}":
			if inSet {
				inSet = false
			} else if chain != "" {
				chain = ""
			}
			continue
		}
		if chain == "" || inSet {
			continue
		}
		i := strings.LastIndex(l, " # handle ")
		if i < 0 {
			continue
		}
		var h uint64
		if _, err := fmt.Sscan(l[i+len(" # handle "):], &h); err != nil {
			continue
		}
		out[textKey{family, table, chain, h}] = l[:i]
	}
	return out
}

func stripHandle(l string) string {
	if i := strings.LastIndex(l, " # handle "); i >= 0 {
		return l[:i]
	}
	return l
}

func unquote(s string) string { return strings.Trim(s, `"`) }
