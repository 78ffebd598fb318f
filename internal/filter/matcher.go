package filter

import (
	"unsafe"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Matcher matches many flows of one Store against a filter, remembering
// free-word results for the pods, Services, rules and explanations that
// the Store shares between flows: on a busy node a million flows carry a
// few hundred of each, so each text is searched once, not once per flow.
// A Matcher is for one goroutine and for flows that stay alive while it
// is used (the memory is keyed by address).
type Matcher struct {
	f     Filter
	memos []memo // one per term
}

// memo is a small direct-mapped cache from an object's address to a
// result; a collision just costs a recomputation.
type memo struct {
	addr [memoSize]uintptr
	n    [memoSize]int // string length, so a prefix sharing the address differs
	val  [memoSize]bool
}

const memoSize = 512

func (m *memo) lookup(p unsafe.Pointer, n int, compute func() bool) bool {
	if p == nil {
		return compute()
	}
	a := uintptr(p)
	i := (a>>4 ^ a>>13) & (memoSize - 1)
	if m.addr[i] == a && m.n[i] == n {
		return m.val[i]
	}
	v := compute()
	m.addr[i], m.n[i], m.val[i] = a, n, v
	return v
}

// Matcher returns a Matcher for f.
func (f Filter) Matcher() *Matcher {
	return &Matcher{f: f, memos: make([]memo, len(f.terms))}
}

// Match reports whether fl, with its keys from the Store, passes the
// filter.
func (m *Matcher) Match(fl *trace.Flow, k *trace.AddrKeys) bool {
	return m.f.matchKeyed(fl, k, m.memos)
}

// matchWordMemo is matchWord with the shared parts' results remembered.
func (t *term) matchWordMemo(f *trace.Flow, mm *memo) bool {
	if t.contains(f.Orig.Src) || t.contains(f.Orig.Dst) {
		return true
	}
	if f.Reply != nil && (t.contains(f.Reply.Src) || t.contains(f.Reply.Dst)) {
		return true
	}
	shared := func(p unsafe.Pointer, compute func() bool) bool { return mm.lookup(p, 0, compute) }
	if mm.lookup(unsafe.Pointer(unsafe.StringData(f.Verdict)), len(f.Verdict), func() bool { return t.contains(f.Verdict) }) ||
		shared(unsafe.Pointer(f.SrcPod), func() bool { return t.podHas(f.SrcPod) }) ||
		shared(unsafe.Pointer(f.DstPod), func() bool { return t.podHas(f.DstPod) }) {
		return true
	}
	if s := f.Service; s != nil && shared(unsafe.Pointer(s), func() bool { return t.contains(s.Namespace) || t.contains(s.Name) }) {
		return true
	}
	if r := f.Rule; r != nil && shared(unsafe.Pointer(r), func() bool { return t.ruleHas(r) }) {
		return true
	}
	return mm.lookup(unsafe.Pointer(unsafe.StringData(f.Explanation)), len(f.Explanation), func() bool { return t.contains(f.Explanation) })
}
