package enrich

import (
	"net/netip"
	"sync"

	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// attributionCache remembers the rule attributed to a packet and kernel
// action for one immutable NodeEnv: the rules cannot change under it, so
// nothing is ever invalidated, and a node change brings a new env with an
// empty cache. Most connections differ from earlier ones only in their
// source, which rules read little of: a source port few rules look at,
// and a source address mostly tested against prefixes. The evaluators
// report how much of the source a walk read (rules.Reads), and its answer
// is kept for every source that shares that much. The walk is
// deterministic, so a packet whose tests all come out the same takes the
// same path and gets the same answer.
type attributionCache struct {
	mu sync.Mutex
	// shapes is keyed by the packet without its source (its address
	// reduced to its family, no port): how much of the source the walks
	// for that key read, and the answer itself when they read none.
	// answers is keyed with as much of the source as its key's shape says.
	shapes  map[attrKey]attrShape
	answers map[attrKey]attrAnswer
	hits    uint64
	misses  uint64
}

// attrCacheSize bounds each map; a full map starts over, which costs a
// walk per key again, never a wrong answer. An entry takes about 500 bytes
// (its key is the whole packet and action, and the rule it names), so a
// full cache is about 4 MiB.
const attrCacheSize = 4096

type attrKey struct {
	pkt rules.Packet
	act rules.KernelAction
}

type attrAnswer struct {
	rule  *trace.Rule
	known bool
}

// attrShape is what the walks of one sourceless key read of the source:
// the most leading bits of its address any of them needed, and whether
// any read its port. A shape that read none of it holds the answer.
type attrShape struct {
	srcBits  int
	portRead bool
	answer   attrAnswer
}

func (s attrShape) readsSource() bool { return s.srcBits > 0 || s.portRead }

func newAttributionCache() *attributionCache {
	return &attributionCache{shapes: map[attrKey]attrShape{}, answers: map[attrKey]attrAnswer{}}
}

// keyOf is pkt and act keyed with as much of the source as s read.
func keyOf(pkt rules.Packet, act rules.KernelAction, s attrShape) attrKey {
	pkt.Reads = nil
	a, port := pkt.Src.Addr(), pkt.Src.Port()
	if s.srcBits < a.BitLen() {
		a = netip.PrefixFrom(a, s.srcBits).Masked().Addr()
	}
	if !s.portRead {
		port = 0
	}
	pkt.Src = netip.AddrPortFrom(a, port)
	return attrKey{pkt: pkt, act: act}
}

// attributeCached answers from the cache or by eval, which is given the
// packet with a Reads to fill. The rule returned is shared with the cache
// and every flow it answered: it is never changed (names copies it to set
// its owner's pod).
func (c *attributionCache) attributeCached(pkt rules.Packet, act rules.KernelAction, eval func(rules.Packet) (*trace.Rule, bool)) (*trace.Rule, bool) {
	sourceless := keyOf(pkt, act, attrShape{})
	c.mu.Lock()
	s, ok := c.shapes[sourceless]
	a := s.answer
	if ok && s.readsSource() {
		a, ok = c.answers[keyOf(pkt, act, s)]
	}
	if ok {
		c.hits++
		c.mu.Unlock()
		return a.rule, a.known
	}
	c.misses++
	c.mu.Unlock()

	var reads rules.Reads
	pkt.Reads = &reads
	r, known := eval(pkt)
	a = attrAnswer{rule: r, known: known}

	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.shapes) >= attrCacheSize {
		clear(c.shapes)
		clear(c.answers)
	}
	// The shape only widens: an answer kept under a narrower one stays
	// right, it is just no longer asked for.
	s = c.shapes[sourceless]
	s = attrShape{srcBits: max(s.srcBits, reads.SrcBits), portRead: s.portRead || reads.SrcPort}
	if !s.readsSource() {
		s.answer = a
		c.shapes[sourceless] = s
		return r, known
	}
	c.shapes[sourceless] = s
	if len(c.answers) >= attrCacheSize {
		clear(c.answers)
	}
	c.answers[keyOf(pkt, act, s)] = a
	return r, known
}

// stats is the cache's hits and misses so far.
func (c *attributionCache) stats() (hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}
