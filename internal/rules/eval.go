package rules

import (
	"fmt"
	"strings"
)

// Verdict is what a table decided for a packet.
type Verdict string

const (
	VerdictAccept     Verdict = "ACCEPT"
	VerdictDrop       Verdict = "DROP"
	VerdictReject     Verdict = "REJECT"
	VerdictDNAT       Verdict = "DNAT"
	VerdictSNAT       Verdict = "SNAT"
	VerdictMasquerade Verdict = "MASQUERADE"
	VerdictRedirect   Verdict = "REDIRECT"
	VerdictQueue      Verdict = "QUEUE"
	// VerdictUnknown: a rule with a target this package does not model
	// ended the walk (on one explored branch), or the walk was cut short.
	VerdictUnknown Verdict = "UNKNOWN"
	// VerdictNotTraversed: the nat table only sees the first packet of a
	// connection; for any other packet it is not consulted at all.
	VerdictNotTraversed Verdict = "NOT-TRAVERSED"
)

// Step is one chain on the path from the base chain to the deciding rule.
type Step struct {
	Chain string
	// Via is the rule that jumped (or went) to Chain; nil for the base
	// chain. For a portmap chain it is the CNI-HOSTPORT-DNAT rule whose
	// comment carries the container id.
	Via  *Rule
	Goto bool
}

// Outcome is where one walk through a table ended.
type Outcome struct {
	Verdict Verdict
	// Rule is the rule that decided; nil when the base chain's policy did.
	Rule *Rule
	Path []Step
	// Mark is the packet mark when the walk ended (MARK targets applied).
	Mark uint32
}

// Chains is the path as chain names: PREROUTING, CNI-HOSTPORT-DNAT, CNI-DN-...
func (o *Outcome) Chains() []string {
	out := make([]string, len(o.Path))
	for i, s := range o.Path {
		out[i] = s.Chain
	}
	return out
}

// PathString renders the path as "PREROUTING → CNI-HOSTPORT-DNAT → CNI-DN-...".
func (o *Outcome) PathString() string { return strings.Join(o.Chains(), " → ") }

// ByPolicy reports whether the chain policy, not a rule, decided.
func (o *Outcome) ByPolicy() bool {
	return o.Rule == nil && (o.Verdict == VerdictAccept || o.Verdict == VerdictDrop)
}

func (o *Outcome) same(p *Outcome) bool {
	return o.Verdict == p.Verdict && o.Rule == p.Rule && o.Mark == p.Mark
}

func (o *Outcome) String() string {
	if o.Rule == nil {
		if o.ByPolicy() && len(o.Path) > 0 {
			return fmt.Sprintf("%s (policy of %s)", o.Verdict, o.Path[0].Chain)
		}
		return string(o.Verdict)
	}
	return fmt.Sprintf("%s by %s: %s", o.Verdict, o.Rule.ID(), o.Rule.Text)
}

// Doubt is a rule whose match (or target) could not be decided.
type Doubt struct {
	Rule   *Rule
	Reason string
}

func (d Doubt) String() string { return fmt.Sprintf("%s (%s): %s", d.Rule.ID(), d.Rule.Text, d.Reason) }

// Result is the verdict-deciding rule for a packet in one table and base
// chain, with everything that makes it less than certain.
type Result struct {
	Table, Chain string
	Outcome
	// Uncertain is set when an undecidable rule could have changed the
	// outcome (Alternatives then lists the other possible ones) or the
	// outcome itself is VerdictUnknown. Reasons say why.
	Uncertain    bool
	Reasons      []string
	Alternatives []Outcome
	// Doubts lists every rule met on the way whose match or target could
	// not be decided, including those that did not change the outcome.
	Doubts []Doubt
	// Incomplete: a limit stopped the walk from exploring every branch, so
	// Alternatives may not list every possible outcome.
	Incomplete bool
}

// Limits that keep a hostile or looping dump from running away.
const (
	maxDepth = 64      // jump stack depth (the kernel's is smaller in practice)
	maxSteps = 1 << 20 // rules looked at over all explored paths
	maxForks = 64      // undecidable rules explored both ways
)

// Evaluate walks the base chain (e.g. "nat", "PREROUTING") for pkt the way
// netfilter does and returns the verdict-deciding rule or policy. The
// start must be a built-in chain: only those have a policy to end with.
func (rs *Ruleset) Evaluate(table, chain string, pkt Packet, node NodeState) (*Result, error) {
	t := rs.Tables[table]
	if t == nil {
		return nil, fmt.Errorf("evaluate %s %s: no table %q", table, chain, table)
	}
	c := t.Chains[chain]
	if c == nil {
		return nil, fmt.Errorf("evaluate %s %s: no chain %q", table, chain, chain)
	}
	if !c.Builtin() {
		return nil, fmt.Errorf("evaluate %s %s: %q is a user chain, not a base chain", table, chain, chain)
	}
	// The result and what the walk works in are one allocation: an
	// attribution the cache missed walks a chain for each hook.
	b := &evaluation{res: Result{Table: table, Chain: chain}, pkt: pkt, start: [1]Step{{Chain: chain}}}
	res := &b.res
	if table == "nat" && pkt.State&(CTEstablished|CTInvalid|CTUntracked) != 0 {
		res.Outcome = Outcome{Verdict: VerdictNotTraversed, Path: b.start[:], Mark: pkt.Mark}
		return res, nil
	}
	b.w = walker{table: t, pkt: &b.pkt, node: node}
	w := &b.w
	b.st = state{frames: b.frames[:1], mark: pkt.Mark}
	st := &b.st
	st.frames[0] = frame{chain: c, steps: b.start[:]}
	outs := w.run(st)
	res.Outcome = outs[0]
	res.Alternatives = outs[1:]
	res.Doubts = w.doubts
	res.Reasons = w.mattered
	if w.exhausted {
		res.Incomplete = true
		res.Reasons = append(res.Reasons, fmt.Sprintf("more than %d undecidable rules: later ones were not explored both ways", maxForks))
	}
	for _, o := range outs {
		if o.Verdict == VerdictUnknown && o.Rule == nil {
			res.Incomplete = true
			res.Reasons = append(res.Reasons, "walk cut short: jump depth or rule count limit reached (a chain loop?)")
			break
		}
	}
	res.Uncertain = len(outs) > 1 || res.Incomplete || res.Verdict == VerdictUnknown
	if res.Uncertain && len(res.Reasons) == 0 {
		for _, d := range w.doubts {
			res.Reasons = append(res.Reasons, d.String())
		}
	}
	return res, nil
}

// evaluation is what Evaluate allocates: its result, and the packet,
// walker and first state of its walk.
type evaluation struct {
	res    Result
	pkt    Packet
	w      walker
	st     state
	frames [8]frame
	start  [1]Step
}

type frame struct {
	chain *Chain
	idx   int
	steps []Step // the chains this frame went through (gotos add to it)
}

type state struct {
	frames []frame
	mark   uint32
}

func (s *state) clone() *state {
	c := &state{frames: make([]frame, len(s.frames), cap(s.frames)), mark: s.mark}
	copy(c.frames, s.frames)
	return c
}

func (s *state) path() []Step {
	n := 0
	for _, f := range s.frames {
		n += len(f.steps)
	}
	out := make([]Step, 0, n)
	for _, f := range s.frames {
		out = append(out, f.steps...)
	}
	return out
}

type walker struct {
	table     *Table
	pkt       *Packet
	node      NodeState
	doubts    []Doubt
	mattered  []string
	forks     int
	steps     int
	exhausted bool
	lookups   [6]SetLookup
	stepChunk []Step // oneStep's
}

func (w *walker) doubt(r *Rule, reason string) {
	for _, d := range w.doubts {
		if d.Rule == r && d.Reason == reason {
			return
		}
	}
	w.doubts = append(w.doubts, Doubt{Rule: r, Reason: reason})
}

// matter records an undecidable rule whose two branches ended differently.
func (w *walker) matter(r *Rule, reason string) {
	m := fmt.Sprintf("%s (%s): %s", r.ID(), r.Text, reason)
	for _, have := range w.mattered {
		if have == m {
			return
		}
	}
	w.mattered = append(w.mattered, m)
}

// run walks from st until the table decides, forking at undecidable rules.
// It returns the distinct outcomes, the one that assumes every undecidable
// rule did not match first.
func (w *walker) run(st *state) []Outcome {
	for {
		if w.steps++; w.steps > maxSteps || len(st.frames) > maxDepth {
			return []Outcome{{Verdict: VerdictUnknown, Path: st.path(), Mark: st.mark}}
		}
		top := &st.frames[len(st.frames)-1]
		if top.idx >= len(top.chain.Rules) {
			if o, done := w.fallOff(st); done {
				return []Outcome{o}
			}
			continue
		}
		r := top.chain.Rules[top.idx]
		top.idx++
		m, reason := w.matchRule(r, st.mark)
		switch m {
		case no:
			continue
		case maybe:
			w.doubt(r, reason)
			if w.forks >= maxForks {
				w.exhausted = true
				continue
			}
			w.forks++
			alt := st.clone()
			matched := w.apply(alt, r)
			notMatched := w.run(st)
			if !sameOutcomes(matched, notMatched) {
				w.matter(r, reason)
			}
			return union(notMatched, matched)
		}
		if outs := w.applyOrStop(st, r); outs != nil {
			return outs
		}
	}
}

// apply runs r's target on st and then the rest of the walk.
func (w *walker) apply(st *state, r *Rule) []Outcome {
	if outs := w.applyOrStop(st, r); outs != nil {
		return outs
	}
	return w.run(st)
}

// applyOrStop performs a matched rule's target on st. It returns the
// outcomes when the walk is decided (or forked), nil to continue.
func (w *walker) applyOrStop(st *state, r *Rule) []Outcome {
	t := &r.Target
	switch t.Kind {
	case TargetNone, TargetContinue:
		return nil
	case TargetMark:
		st.mark = (st.mark &^ t.MarkMask) ^ t.MarkValue
		return nil
	case TargetReturn:
		if o, done := w.fallOff(st); done {
			return []Outcome{o}
		}
		return nil
	case TargetJump, TargetGoto:
		c := w.table.Chains[t.Chain]
		if c == nil {
			return w.unknownTarget(st, r, fmt.Sprintf("jump to chain %q that does not exist", t.Chain))
		}
		step := Step{Chain: c.Name, Via: r, Goto: t.Kind == TargetGoto}
		if t.Kind == TargetGoto {
			// A goto replaces the current frame: a RETURN from the
			// target goes back to this frame's caller.
			top := &st.frames[len(st.frames)-1]
			top.chain, top.idx = c, 0
			top.steps = append(top.steps[:len(top.steps):len(top.steps)], step)
			return nil
		}
		st.frames = append(st.frames, frame{chain: c, steps: w.oneStep(step)})
		return nil
	case TargetUnknown:
		return w.unknownTarget(st, r, fmt.Sprintf("target %s is not modelled: it may or may not end the walk", t.Name))
	}
	return []Outcome{{Verdict: targetVerdict(t.Kind), Rule: r, Path: st.path(), Mark: st.mark}}
}

// unknownTarget forks: the target either ended the walk with an unknown
// verdict or let it continue.
func (w *walker) unknownTarget(st *state, r *Rule, reason string) []Outcome {
	w.doubt(r, reason)
	stop := []Outcome{{Verdict: VerdictUnknown, Rule: r, Path: st.path(), Mark: st.mark}}
	if w.forks >= maxForks {
		w.exhausted = true
		return stop
	}
	w.forks++
	cont := w.run(st)
	w.matter(r, reason)
	return union(cont, stop)
}

// fallOff handles the end of a chain or a RETURN: back to the caller, or
// the policy when the base chain ends.
func (w *walker) fallOff(st *state) (Outcome, bool) {
	if len(st.frames) > 1 {
		st.frames = st.frames[:len(st.frames)-1]
		return Outcome{}, false
	}
	base := st.frames[0]
	// The policy belongs to the chain the walk started in, even when a
	// goto replaced the base frame's chain.
	start := w.table.Chains[base.steps[0].Chain]
	v := VerdictAccept
	if start.Policy == "DROP" {
		v = VerdictDrop
	}
	// A frame's steps are never written again (a goto appends to a copy).
	return Outcome{Verdict: v, Path: base.steps[:1:1], Mark: st.mark}, true
}

// oneStep is a frame's first step, from chunks the walk shares: a walk
// jumps into a chain for each rule that jumps. The slice is full, so a
// goto's append copies it rather than write into the chunk.
func (w *walker) oneStep(s Step) []Step {
	if len(w.stepChunk) == cap(w.stepChunk) {
		w.stepChunk = make([]Step, 0, 8)
	}
	w.stepChunk = append(w.stepChunk, s)
	n := len(w.stepChunk)
	return w.stepChunk[n-1 : n : n]
}

func targetVerdict(k TargetKind) Verdict {
	switch k {
	case TargetAccept:
		return VerdictAccept
	case TargetDrop:
		return VerdictDrop
	case TargetReject:
		return VerdictReject
	case TargetDNAT:
		return VerdictDNAT
	case TargetSNAT:
		return VerdictSNAT
	case TargetMasquerade:
		return VerdictMasquerade
	case TargetRedirect:
		return VerdictRedirect
	case TargetQueue:
		return VerdictQueue
	}
	return VerdictUnknown
}

func sameOutcomes(a, b []Outcome) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		found := false
		for j := range b {
			if a[i].same(&b[j]) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func union(a, b []Outcome) []Outcome {
	out := a
	for i := range b {
		dup := false
		for j := range out {
			if out[j].same(&b[i]) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, b[i])
		}
	}
	return out
}
