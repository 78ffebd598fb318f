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
// source port, which few rules read: the evaluators report whether the
// walk read it (rules.Reads), and an answer that did not is kept once for
// every source port. The walk is deterministic, so a packet that differs
// only in a field no rule read takes the same path and gets the same
// answer.
type attributionCache struct {
	mu sync.Mutex
	// anyPort is keyed without the source port; byPort, with it, holds the
	// answers of the keys whose walks read the source port.
	anyPort map[attrKey]attrAnswer
	byPort  map[attrKey]attrAnswer
	hits    uint64
	misses  uint64
}

// attrCacheSize bounds each map; a full map starts over, which costs a
// walk per key again, never a wrong answer. An entry takes about 500 bytes
// (its key is the whole packet and action, and the rule it names), so a
// full cache is about 2 MiB.
const attrCacheSize = 4096

type attrKey struct {
	pkt rules.Packet
	act rules.KernelAction
}

type attrAnswer struct {
	rule  *trace.Rule
	known bool
	// portRead: the walks for this key read the source port, so the
	// answer is in byPort.
	portRead bool
}

func newAttributionCache() *attributionCache {
	return &attributionCache{anyPort: map[attrKey]attrAnswer{}, byPort: map[attrKey]attrAnswer{}}
}

func keysOf(pkt rules.Packet, act rules.KernelAction) (anyPort, byPort attrKey) {
	pkt.Reads = nil
	byPort = attrKey{pkt: pkt, act: act}
	pkt.Src = netip.AddrPortFrom(pkt.Src.Addr(), 0)
	return attrKey{pkt: pkt, act: act}, byPort
}

// attributeCached answers from the cache or by eval, which is given the
// packet with a Reads to fill. The rule returned is shared with the cache
// and every flow it answered: it is never changed (names copies it to set
// its owner's pod).
func (c *attributionCache) attributeCached(pkt rules.Packet, act rules.KernelAction, eval func(rules.Packet) (*trace.Rule, bool)) (*trace.Rule, bool) {
	anyKey, portKey := keysOf(pkt, act)
	c.mu.Lock()
	a, ok := c.anyPort[anyKey]
	if ok && a.portRead {
		a, ok = c.byPort[portKey]
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
	if len(c.anyPort) >= attrCacheSize {
		clear(c.anyPort)
		clear(c.byPort)
	}
	if !reads.SrcPort {
		c.anyPort[anyKey] = a
		return r, known
	}
	if len(c.byPort) >= attrCacheSize {
		clear(c.byPort)
	}
	c.anyPort[anyKey] = attrAnswer{portRead: true}
	c.byPort[portKey] = a
	return r, known
}

// stats is the cache's hits and misses so far.
func (c *attributionCache) stats() (hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}
