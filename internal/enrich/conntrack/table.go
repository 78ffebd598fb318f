package conntrack

import (
	"net/netip"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
)

// node is one conntrack entry in the table. Live and destroyed nodes are in
// two separate recency lists so that destroyed entries, which only serve
// late joins, are evicted before any live one.
type node struct {
	e          Entry
	prev, next *node
	dead       bool
	// earlier is the destroyed entry this one took the original tuple
	// over from: a client that reuses a source port makes a new entry for
	// the same tuple, and a flow of the old connection still asks for its
	// own entry. gone marks a node no longer in the table, where such a
	// chain ends.
	earlier *node
	gone    bool
}

// list is an intrusive doubly linked list, most recent first. It is
// intrusive rather than container/list to save an allocation and two
// pointers per entry at a million entries.
type list struct {
	head, tail *node
	n          int
}

func (l *list) pushFront(n *node) {
	n.prev, n.next = nil, l.head
	if l.head != nil {
		l.head.prev = n
	}
	l.head = n
	if l.tail == nil {
		l.tail = n
	}
	l.n++
}

func (l *list) remove(n *node) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		l.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = nil, nil
	l.n--
}

// table indexes entries by both of their tuples. It is not safe for
// concurrent use; the Tracker guards it.
type table struct {
	byTuple map[event.Tuple]*node
	live    list
	dead    list

	maxEntries   int
	maxDestroyed int
	retention    time.Duration

	evicted uint64
}

func newTable(maxEntries, maxDestroyed int, retention time.Duration) *table {
	return &table{
		byTuple:      map[event.Tuple]*node{},
		maxEntries:   maxEntries,
		maxDestroyed: maxDestroyed,
		retention:    retention,
	}
}

func (t *table) lookup(tu event.Tuple, now time.Time) (Entry, bool) {
	n := t.byTuple[tu]
	if n == nil {
		return Entry{}, false
	}
	// A destroyed entry past its retention may not have been pruned yet
	// (pruning runs on a timer); it must not be joined any more.
	if n.dead && now.Sub(n.e.Seen) > t.retention {
		return Entry{}, false
	}
	return n.e, true
}

// find returns the node holding either tuple of e, preferring a live one:
// after a tuple is reused, the old destroyed entry may still hold the other
// key.
func (t *table) find(e *Entry) *node {
	a, b := t.byTuple[e.Orig], t.byTuple[e.Reply]
	switch {
	case a != nil && !a.dead:
		return a
	case b != nil && !b.dead:
		return b
	case a != nil:
		return a
	}
	return b
}

// index points both tuples at n.
func (t *table) index(n *node) {
	if n.e.Orig.Valid() {
		t.byTuple[n.e.Orig] = n
	}
	if n.e.Reply.Valid() {
		t.byTuple[n.e.Reply] = n
	}
}

// unindex removes n's keys, only where they still point at n: a newer entry
// for a reused tuple owns the key then.
func (t *table) unindex(n *node) {
	for _, k := range [2]event.Tuple{n.e.Orig, n.e.Reply} {
		if t.byTuple[k] == n {
			delete(t.byTuple, k)
		}
	}
}

// upsert records a NEW or UPDATE (or a dumped entry when full is set: a
// dump carries every attribute, an event only the changed ones). It returns
// the entry as stored and whether anything a consumer cares about changed.
func (t *table) upsert(e Entry, full bool) (Entry, bool) {
	n := t.find(&e)
	var earlier *node
	if n != nil && n.dead {
		// The kernel reuses a destroyed connection's tuple for a new
		// connection: that is a new entry; the destroyed one stays
		// resolvable by any key the new one does not take over, and
		// through the new one's history.
		if n.e.Orig == e.Orig {
			earlier = n
		}
		n = nil
	}
	if n == nil {
		e.Replied = e.Replied || e.Status&StatusSeenReply != 0
		n = &node{e: e, earlier: earlier}
		t.live.pushFront(n)
		t.index(n)
		t.evict()
		return n.e, true
	}
	old := n.e
	merged := e
	if !full && merged.State == "" {
		// TCP protoinfo is only in events that changed it.
		merged.State = old.State
	}
	merged.Replied = old.Replied || e.Replied || e.Status&StatusSeenReply != 0
	if old.Orig != merged.Orig || old.Reply != merged.Reply {
		t.unindex(n)
		n.e = merged
		t.index(n)
	} else {
		n.e = merged
	}
	t.live.remove(n)
	t.live.pushFront(n)
	changed := old.Status != merged.Status || old.State != merged.State || old.Mark != merged.Mark ||
		old.Replied != merged.Replied || old.Orig != merged.Orig || old.Reply != merged.Reply
	return n.e, changed
}

// destroy records a DESTROY. An entry the table never had (evicted, or
// created while the events were lost) is added as destroyed so a late
// kernel event can still be joined with it.
func (t *table) destroy(e Entry) Entry {
	n := t.find(&e)
	if n != nil && n.dead {
		n.e.Seen = e.Seen
		t.dead.remove(n)
		t.dead.pushFront(n)
		return n.e
	}
	if n == nil {
		e.Replied = e.Replied || e.Status&StatusSeenReply != 0
		n = &node{e: e}
		t.index(n)
	} else {
		t.live.remove(n)
		// The destroy event's status is the final one; keep what the
		// table learnt that the event may lack.
		state := n.e.State
		replied := n.e.Replied
		n.e = e
		if n.e.State == "" {
			n.e.State = state
		}
		n.e.Replied = replied || e.Replied || e.Status&StatusSeenReply != 0
	}
	n.e.Destroyed = true
	n.dead = true
	t.dead.pushFront(n)
	t.evict()
	return n.e
}

// ended records an entry and its end at once, as upsert then destroy
// would: the end of a connection a targeted table held no live entry of
// (every one but a dumped table's), made a destroyed entry without its
// round trip through the live list. A destroyed entry of the same
// original tuple is an earlier connection's, kept as its history.
func (t *table) ended(e Entry) Entry {
	n := t.find(&e)
	if n != nil && !n.dead {
		t.upsert(e, true)
		return t.destroy(e)
	}
	var earlier *node
	if n != nil && n.e.Orig == e.Orig {
		earlier = n
	}
	e.Replied = e.Replied || e.Status&StatusSeenReply != 0
	e.Destroyed = true
	n = &node{e: e, earlier: earlier, dead: true}
	t.index(n)
	t.dead.pushFront(n)
	t.evict()
	return n.e
}

// evict keeps the table within its bounds: destroyed entries beyond their
// own cap, then the least recently updated entries (destroyed ones first)
// beyond the total cap.
func (t *table) evict() {
	for t.dead.n > t.maxDestroyed {
		t.drop(t.dead.tail)
	}
	for t.live.n+t.dead.n > t.maxEntries {
		if t.dead.tail != nil {
			t.drop(t.dead.tail)
		} else {
			t.drop(t.live.tail)
		}
	}
}

func (t *table) drop(n *node) {
	if n.dead {
		t.dead.remove(n)
	} else {
		t.live.remove(n)
	}
	t.unindex(n)
	t.forget(n)
	t.evicted++
}

// forget ends the history chains through n, so a node that left the table
// is neither returned nor kept alive by a newer entry.
func (t *table) forget(n *node) {
	n.gone = true
	n.earlier = nil
}

// prune forgets destroyed entries older than the retention. The dead list
// is ordered by destroy time, so it stops at the first young one.
func (t *table) prune(now time.Time) int {
	pruned := 0
	for n := t.dead.tail; n != nil && now.Sub(n.e.Seen) > t.retention; n = t.dead.tail {
		t.dead.remove(n)
		t.unindex(n)
		t.forget(n)
		pruned++
	}
	return pruned
}

// replace makes the live entries exactly the dump's, after events were
// lost. Entries the dump no longer has were destroyed while the events were
// lost: they become destroyed entries (their DESTROY never arrived). It
// returns the entries that changed, for the Updates channel.
func (t *table) replace(dump []Entry, now time.Time) []Entry {
	seen := make(map[*node]bool, len(dump))
	var changed []Entry
	for _, e := range dump {
		st, ch := t.upsert(e, true)
		seen[t.byTuple[st.Orig]] = true
		if ch {
			changed = append(changed, st)
		}
	}
	var gone []*node
	for n := t.live.head; n != nil; n = n.next {
		if !seen[n] {
			gone = append(gone, n)
		}
	}
	for _, n := range gone {
		e := n.e
		e.Seen = now
		changed = append(changed, t.destroy(e))
	}
	return changed
}

// appendDestroyed appends the destroyed entries whose original tuple is
// tu to dst, newest first, within the retention: the one lookup finds when
// it is destroyed, then the destroyed ones it replaced.
func (t *table) appendDestroyed(dst []Entry, tu event.Tuple, now time.Time) []Entry {
	for n := t.byTuple[tu]; n != nil && !n.gone && n.e.Orig == tu; n = n.earlier {
		if n.dead && now.Sub(n.e.Seen) > t.retention {
			break
		}
		if n.e.Destroyed {
			dst = append(dst, n.e)
		}
	}
	return dst
}

func (t *table) len() (live, dead int) { return t.live.n, t.dead.n }

// bySource lists the entries, live and recently destroyed, whose original
// tuple leaves from src. It walks the whole table: it serves the rare
// question "which of my connections does this stray packet answer?", never
// the per-event path.
func (t *table) bySource(proto uint8, src netip.AddrPort, now time.Time) []Entry {
	var out []Entry
	for _, l := range []*list{&t.live, &t.dead} {
		for n := l.head; n != nil; n = n.next {
			if n.e.Orig.Proto != proto || n.e.Orig.SrcAddrPort() != src {
				continue
			}
			if n.dead && now.Sub(n.e.Seen) > t.retention {
				continue
			}
			out = append(out, n.e)
		}
	}
	return out
}
