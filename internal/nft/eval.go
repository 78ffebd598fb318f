package nft

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tracer-dev/tracer/internal/rules"
)

// Step is one chain on the way from the base chain to the deciding rule.
type Step struct {
	Chain *Chain
	// Via is the rule that jumped or went to Chain; nil for the base chain.
	Via *Rule
	// Elem is the verdict map element that sent the packet to Chain, when
	// a map did (kube-proxy's service-ips, numgen's endpoint choice).
	Elem *Elem
	Goto bool
}

// Outcome is where one way through a base chain ended.
type Outcome struct {
	Verdict rules.Verdict
	// Rule decided; nil when the base chain's policy did.
	Rule *Rule
	Path []Step
	// Elem is the verdict map element whose verdict decided, when the
	// deciding rule's verdict came from a map (a `drop` element).
	Elem   *Elem
	NAT    natSpec
	Reject rejectSpec
	// Mark is the packet mark when the walk ended.
	Mark uint32
	// Doubts are the undecidable matches this way assumed.
	Doubts []string
}

// Chains is the path as chain names.
func (o *Outcome) Chains() []string {
	out := make([]string, len(o.Path))
	for i, s := range o.Path {
		out[i] = s.Chain.Name
	}
	return out
}

// Element is the map element most telling of why the packet went where it
// did: the verdict's own element (with the deciding rule's map: a `drop`
// element of kube-proxy's no-endpoint-nodeports is told by its map), else
// the last named map's element on the path, else the last anonymous one
// (numgen's choice).
func (o *Outcome) Element() (*Elem, *Set) {
	if o.Elem != nil {
		if o.Rule != nil {
			return o.Elem, o.Rule.namedMap()
		}
		return o.Elem, nil
	}
	var anon *Elem
	for i := len(o.Path) - 1; i >= 0; i-- {
		if e := o.Path[i].Elem; e != nil {
			if via := o.Path[i].Via; via != nil && via.namedMap() != nil {
				return e, via.namedMap()
			}
			if anon == nil {
				anon = e
			}
		}
	}
	return anon, nil
}

func (r *Rule) namedMap() *Set {
	for _, s := range r.stmts {
		if s.kind == sVmap && s.set != nil && s.set.Table != nil {
			return s.set
		}
	}
	return nil
}

func (o *Outcome) String() string {
	if o.Rule == nil {
		return fmt.Sprintf("%s (policy of %s)", o.Verdict, o.Path[0].Chain.Name)
	}
	return fmt.Sprintf("%s by %s: %s", o.Verdict, o.Rule.ID(), o.Rule.Display())
}

// Result is a walk of one base chain: every way the packet could have
// gone through it.
type Result struct {
	Chain    *Chain
	Outcomes []Outcome
	// Incomplete says the walk was cut short (too many branches, too deep).
	Incomplete string
}

// maxBranches bounds the ways one walk explores; kube-proxy's numgen maps
// fork once per endpoint, so this is far above any real Service.
const maxBranches = 4096

// maxDepth is nft's own jump stack (NFT_JUMP_STACK_SIZE is 16 since 5.x;
// older kernels allowed more, so leave room).
const maxDepth = 32

type branch struct {
	mark   uint32
	path   []Step
	doubts []string
}

func (b branch) with(s Step) branch {
	b.path = append(b.path[:len(b.path):len(b.path)], s)
	return b
}

func (b branch) doubt(why string) branch {
	b.doubts = append(b.doubts[:len(b.doubts):len(b.doubts)], why)
	return b
}

type walker struct {
	env      pktEnv
	outs     []Outcome
	branches int
	cut      string
}

// Evaluate walks base chain c for pkt, as c's hook sees it.
func (rs *Ruleset) Evaluate(c *Chain, pkt rules.Packet, node rules.NodeState) *Result {
	fam := "ip"
	if pkt.Dst.Addr().Unmap().Is6() {
		fam = "ip6"
	}
	w := &walker{env: pktEnv{pkt: &pkt, family: fam, node: node, mark: pkt.Mark}}
	start := branch{mark: pkt.Mark, path: []Step{{Chain: c}}}
	for _, b := range w.chain(c, start, 0) {
		v := rules.VerdictAccept
		if c.Policy == "drop" {
			v = rules.VerdictDrop
		}
		w.end(v, nil, b, nil)
	}
	return &Result{Chain: c, Outcomes: w.outs, Incomplete: w.cut}
}

func (w *walker) end(v rules.Verdict, r *Rule, b branch, el *Elem) *Outcome {
	w.outs = append(w.outs, Outcome{Verdict: v, Rule: r, Path: b.path, Elem: el, Mark: b.mark, Doubts: b.doubts})
	return &w.outs[len(w.outs)-1]
}

// chain runs c's rules; it returns the ways that leave c back to its
// caller (by falling off its end or by return).
func (w *walker) chain(c *Chain, b branch, depth int) []branch {
	if depth > maxDepth {
		w.cut = fmt.Sprintf("chain %s nests deeper than %d jumps", c.Name, maxDepth)
		w.end(rules.VerdictUnknown, nil, b.doubt(w.cut), nil)
		return nil
	}
	live := []branch{b}
	var back []branch
	for _, r := range c.Rules {
		var next []branch
		for _, br := range live {
			cont, ret := w.rule(r, br, depth)
			next = append(next, cont...)
			back = append(back, ret...)
		}
		live = next
		if len(live) == 0 {
			break
		}
	}
	return append(back, live...)
}

// rule runs one rule: cont are the ways that go on to the next rule, ret
// those that leave the chain.
func (w *walker) rule(r *Rule, b branch, depth int) (cont, ret []branch) {
	active := []branch{b}
	for i := range r.stmts {
		s := &r.stmts[i]
		var next []branch
		for _, a := range active {
			if w.branches++; w.branches > maxBranches {
				w.cut = fmt.Sprintf("more than %d ways through the rules", maxBranches)
				w.end(rules.VerdictUnknown, r, a.doubt(w.cut), nil)
				continue
			}
			switch s.kind {
			case sNop:
				next = append(next, a)
			case sMatch:
				ok, why := w.match(s, a)
				switch {
				case why != "":
					next = append(next, a.doubt(why+" (assumed to match)"))
					cont = append(cont, a.doubt(why+" (assumed not to match)"))
				case ok:
					next = append(next, a)
				default:
					cont = append(cont, a)
				}
			case sMark:
				w.env.mark = a.mark
				v, k, why := s.left.eval(&w.env)
				if k == isKnown {
					a.mark = uint32(v.n)
				} else {
					a = a.doubt("mark set from " + why)
				}
				next = append(next, a)
			case sVerdict:
				c2, r2 := w.verdict(r, s.verdict, nil, a, depth)
				cont, ret = append(cont, c2...), append(ret, r2...)
			case sVmap:
				c2, r2 := w.vmap(r, s, a, depth)
				cont, ret = append(cont, c2...), append(ret, r2...)
			case sReject:
				w.end(rules.VerdictReject, r, a, nil).Reject = s.reject
			case sNAT:
				if f := s.nat.family; (f == "ip" || f == "ip6") && f != w.env.family {
					// nft_nat_inet_eval leaves the packet alone and the
					// rule's next statement runs.
					next = append(next, a)
					break
				}
				o := w.end(natVerdict[s.nat.kind], r, a, nil)
				o.NAT = s.nat
			default:
				w.end(rules.VerdictUnknown, r, a.doubt(s.why), nil)
				cont = append(cont, a.doubt(s.why+" (assumed not to end the walk)"))
			}
		}
		active = next
		if len(active) == 0 {
			break
		}
	}
	return append(cont, active...), ret
}

var natVerdict = map[string]rules.Verdict{"dnat": rules.VerdictDNAT, "snat": rules.VerdictSNAT,
	"masquerade": rules.VerdictMasquerade, "redirect": rules.VerdictRedirect}

func (w *walker) verdict(r *Rule, v *verdict, el *Elem, a branch, depth int) (cont, ret []branch) {
	switch v.kind {
	case vAccept:
		w.end(rules.VerdictAccept, r, a, el)
	case vDrop:
		w.end(rules.VerdictDrop, r, a, el)
	case vQueue:
		w.end(rules.VerdictQueue, r, a, el)
	case vContinue:
		cont = append(cont, a)
	case vReturn:
		ret = append(ret, a)
	case vJump, vGoto:
		target := r.Chain.Table.Chains[v.target]
		if target == nil {
			w.end(rules.VerdictUnknown, r, a.doubt("chain "+v.target+" is not in the ruleset"), el)
			return nil, nil
		}
		back := w.chain(target, a.with(Step{Chain: target, Via: r, Elem: el, Goto: v.kind == vGoto}), depth+1)
		for i := range back {
			// The ways back carry the callee's path; the caller's rules
			// are reached from the caller's own.
			back[i].path = a.path
		}
		if v.kind == vGoto {
			return nil, back
		}
		return back, nil
	}
	return cont, ret
}

// vmap looks the key up in a verdict map and follows the element's
// verdict; no element matching ends the rule, and the walk goes on.
func (w *walker) vmap(r *Rule, s *stmt, a branch, depth int) (cont, ret []branch) {
	w.env.mark = a.mark
	vals, kn, why := evalKey(s.left, &w.env)
	sure, maybe := lookup(s.set, vals, kn)
	if sure != nil {
		return w.verdict(r, sure.Verdict, sure, a, depth)
	}
	for _, el := range maybe {
		c2, r2 := w.verdict(r, el.Verdict, el, a.doubt(why), depth)
		cont, ret = append(cont, c2...), append(ret, r2...)
	}
	if len(maybe) == 0 || !covers(s.left, s.set) {
		if len(maybe) > 0 {
			a = a.doubt(why + " (assumed to match no element)")
		}
		cont = append(cont, a)
	}
	return cont, ret
}

// covers reports whether a numgen key always finds an element: numgen
// mod N with elements 0 to N-1, as kube-proxy writes them.
func covers(key *expr, set *Set) bool {
	if key.kind != eNumgen {
		return false
	}
	mod := key.y.n
	if mod == 0 || mod > 1<<16 {
		return false
	}
	seen := make([]bool, mod)
	for _, e := range set.Elems {
		if len(e.Key) == 1 && e.Key[0].lo.n < mod {
			for n := e.Key[0].lo.n; n <= e.Key[0].hi.n && n < mod; n++ {
				seen[n] = true
			}
		}
	}
	for _, ok := range seen {
		if !ok {
			return false
		}
	}
	return true
}

// evalKey reads a key's fields.
func evalKey(e *expr, env *pktEnv) ([]val, []known, string) {
	parts := []*expr{e}
	if e.kind == eConcat {
		parts = e.parts
	}
	vals := make([]val, len(parts))
	kn := make([]known, len(parts))
	var whys []string
	for i, p := range parts {
		var why string
		vals[i], kn[i], why = p.eval(env)
		if kn[i] == isUnknown {
			whys = append(whys, why)
		}
	}
	return vals, kn, strings.Join(whys, ", ")
}

// lookup finds the element of set that the key certainly matches, or the
// ones it may match when a field is unknown. A field the packet does not
// have matches nothing.
func lookup(set *Set, vals []val, kn []known) (sure *Elem, maybe []*Elem) {
	for _, k := range kn {
		if k == isAbsent {
			return nil, nil
		}
	}
	if set.Dynamic {
		return nil, set.Elems
	}
	if set.exact != nil && !slices.Contains(kn, isUnknown) {
		var buf [64]byte
		b := buf[:0]
		for _, v := range vals {
			b = appendVal(b, v)
		}
		return set.exact[string(b)], nil
	}
	for _, el := range set.Elems {
		if len(el.Key) != len(vals) {
			continue
		}
		match, unsure := true, false
		for i, kp := range el.Key {
			if kn[i] == isUnknown {
				unsure = true
				continue
			}
			if !kp.contains(vals[i]) {
				match = false
				break
			}
		}
		switch {
		case !match:
		case unsure:
			maybe = append(maybe, el)
		default:
			return el, nil
		}
	}
	return nil, maybe
}

// match decides one comparison; why is set when it cannot be decided.
func (w *walker) match(s *stmt, a branch) (bool, string) {
	w.env.mark = a.mark
	vals, kn, why := evalKey(s.left, &w.env)
	if s.set != nil {
		sure, maybe := lookup(s.set, vals, kn)
		in := sure != nil
		if !in && len(maybe) > 0 {
			if s.set.Dynamic {
				why = "membership of the dynamic set @" + s.set.Name
			}
			return false, why
		}
		if s.op == "!=" {
			return !in, ""
		}
		return in, ""
	}
	for _, k := range kn {
		if k == isAbsent {
			return false, ""
		}
	}
	if why != "" {
		return false, why
	}
	if len(vals) != len(s.right) {
		return false, "a comparison of " + fmt.Sprint(len(vals)) + " fields with " + fmt.Sprint(len(s.right))
	}
	eq := true
	for i, kp := range s.right {
		if !kp.contains(vals[i]) {
			eq = false
		}
	}
	switch s.op {
	case "==":
		return eq, ""
	case "!=":
		return !eq, ""
	case "in":
		if len(vals) == 1 && s.right[0].lo == s.right[0].hi && !vals[0].isAddr() {
			return vals[0].n&s.right[0].lo.n != 0, ""
		}
		return eq, ""
	}
	if len(vals) != 1 {
		return false, "operator " + s.op + " on a concatenation"
	}
	c := vals[0].cmp(s.right[0].lo)
	switch s.op {
	case "<":
		return c < 0, ""
	case ">":
		return c > 0, ""
	case "<=":
		return c <= 0, ""
	case ">=":
		return c >= 0, ""
	}
	return false, "operator " + s.op
}
