package filter

import (
	"strings"
	"unsafe"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Matcher matches many flows of one Store against a filter, remembering
// free-word results for the pods, Services, rules and explanations that
// the Store shares between flows: on a busy node a million flows carry a
// few hundred of each, so each text is searched once, not once per flow.
// A Matcher is for one goroutine and one Store (the memory is keyed by
// the address of what the Store shares).
type Matcher struct {
	f     Filter
	memos []memo // one per term
}

// memo is a small direct-mapped cache from an object's address to a
// result; a collision just costs a recomputation.
type memo struct {
	// inEndpoint: the word could be part of an "IP:PORT" (it has only
	// hex digits, dots, colons and brackets); else no tuple holds it.
	inEndpoint bool
	addr       [memoSize]uintptr
	n          [memoSize]int // string length, so a prefix sharing the address differs
	val        [memoSize]bool
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
	m := &Matcher{f: f, memos: make([]memo, len(f.terms))}
	for i, t := range f.terms {
		m.memos[i].inEndpoint = strings.Trim(t.text, "0123456789abcdef.:[]") == ""
	}
	return m
}

// Match reports whether the stored flow passes the filter. It reads only
// what its terms need: port and address terms the flow's keys (its
// events when the keys do not hold every address), the others its
// fields, and free words its explanation when its shared part misses.
func (m *Matcher) Match(sf *trace.StoredFlow) bool {
	for i := range m.f.terms {
		t := &m.f.terms[i]
		var ok bool
		switch t.kind {
		case kindWord:
			ok = t.matchWordStored(sf, &m.memos[i])
		case kindPort, kindIP:
			var keyed bool
			if ok, keyed = t.matchKeys(sf.Keys()); !keyed {
				ok = t.match(sf.Flow(), m.f.node)
			}
		default:
			ok = t.match(sf.Refs(), m.f.node) // verdict, proto, node, pods and namespaces
		}
		if ok == t.neg {
			return false
		}
	}
	return true
}

// matchWordStored is matchWord with the shared parts' results remembered.
func (t *term) matchWordStored(sf *trace.StoredFlow, mm *memo) bool {
	var f *trace.Flow
	if mm.inEndpoint {
		f = sf.Head()
		if t.contains(f.Orig.Src) || t.contains(f.Orig.Dst) || f.Reply != nil && (t.contains(f.Reply.Src) || t.contains(f.Reply.Dst)) {
			return true
		}
	} else {
		f = sf.Refs() // no tuple holds the word
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
	// A template's text between its placeholders is the explanation's
	// own, so a word found there is in the explanation; only a miss needs
	// the stretches around the client. A templated explanation holds no
	// placeholder byte, so a word with one is not in it.
	text, exact := sf.SharedExplanation()
	if !exact && strings.ContainsAny(t.text, "\x00\x01") {
		return false
	}
	if mm.lookup(unsafe.Pointer(unsafe.StringData(text)), len(text), func() bool { return t.contains(text) }) {
		return true
	}
	return !exact && sf.AroundEndpoints(len(t.text), t.contains)
}
