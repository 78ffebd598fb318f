package enrich

import (
	"encoding/binary"
	"hash/maphash"
	"net/netip"
	"sync"

	"github.com/tracer-dev/tracer/internal/hashmix"
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
	// Both are filed under a hash of their key (hashing the key itself,
	// strings and all, was the cache's largest cost), each entry with its
	// key to check: a key whose hash another holds is a miss, and the
	// later of the two takes the place.
	shapes  map[uint64]shapeEntry
	answers map[uint64]answerEntry
	seed    maphash.Seed
	hits    uint64
	misses  uint64
}

type shapeEntry struct {
	key   attrKey
	shape attrShape
}

type answerEntry struct {
	key    attrKey
	answer attrAnswer
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
	return &attributionCache{shapes: map[uint64]shapeEntry{}, answers: map[uint64]answerEntry{}, seed: maphash.MakeSeed()}
}

// hash is k's hash: its fixed-size fields in two words, mixed, and its
// strings through maphash.
func (c *attributionCache) hash(k *attrKey) uint64 {
	p, a := &k.pkt, &k.act
	h := mixAddrPort(uint64(p.Proto)|uint64(p.ICMPType)<<8|uint64(p.ICMPCode)<<16|uint64(boolBit(p.ICMPKnown))<<24|
		uint64(p.State)<<32|uint64(p.NATed)<<40|uint64(boolBit(p.KnowNAT))<<48, p.Src)
	h = mixAddrPort(h^uint64(p.Mark), p.Dst)
	h = mixAddrPort(h^(uint64(a.ICMPType)|uint64(a.ICMPCode)<<8), a.To)
	h = mixAddrPort(h, netip.AddrPortFrom(p.OrigDst, 0))
	for _, s := range [...]string{p.InIface, p.OutIface, string(a.Kind), a.Hook} {
		h = hashmix.Mix(h, maphash.String(c.seed, s))
	}
	return h
}

func mixAddrPort(h uint64, ap netip.AddrPort) uint64 {
	b := ap.Addr().As16()
	return hashmix.Mix(h^binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])^uint64(ap.Port())<<1^uint64(ap.Addr().BitLen()))
}

func boolBit(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func (c *attributionCache) shape(k *attrKey) (uint64, attrShape, bool) {
	h := c.hash(k)
	e, ok := c.shapes[h]
	return h, e.shape, ok && e.key == *k
}

func (c *attributionCache) answer(k *attrKey) (attrAnswer, bool) {
	e, ok := c.answers[c.hash(k)]
	return e.answer, ok && e.key == *k
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
	_, s, ok := c.shape(&sourceless)
	a := s.answer
	if ok && s.readsSource() {
		k := keyOf(pkt, act, s)
		a, ok = c.answer(&k)
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
	sh, s, ok := c.shape(&sourceless)
	if !ok {
		s = attrShape{}
	}
	s = attrShape{srcBits: max(s.srcBits, reads.SrcBits), portRead: s.portRead || reads.SrcPort}
	if !s.readsSource() {
		s.answer = a
		c.shapes[sh] = shapeEntry{key: sourceless, shape: s}
		return r, known
	}
	c.shapes[sh] = shapeEntry{key: sourceless, shape: s}
	if len(c.answers) >= attrCacheSize {
		clear(c.answers)
	}
	k := keyOf(pkt, act, s)
	c.answers[c.hash(&k)] = answerEntry{key: k, answer: a}
	return r, known
}

// stats is the cache's hits and misses so far.
func (c *attributionCache) stats() (hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}
