package conntrack

import (
	"net/netip"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
)

// node is one ended conntrack entry in the table.
type node struct {
	e          Entry
	prev, next *node
	// earlier is the ended entry this one took the original tuple over
	// from: a client that reuses a source port makes a new entry for the
	// same tuple, and a flow of the old connection still asks for its
	// own entry. gone marks a node no longer in the table, where such a
	// chain ends.
	earlier *node
	gone    bool
}

// list is an intrusive doubly linked list, most recent first. It is
// intrusive rather than container/list to save an allocation and two
// pointers per entry.
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

// table holds the entries the kernel ended, indexed by both of their
// tuples, newest first: the live ones are always asked of the kernel. It
// is not safe for concurrent use, not even its questions, which index
// what came since the last; the Tracker guards it.
type table struct {
	byTuple map[event.Tuple]*node
	ends    list
	// unindexed are the ends that came since the table was last asked,
	// oldest first, all newer than those in ends: they are indexed when a
	// question comes (catchUp). Most ends are of connections nobody asks
	// about any more (a TCP entry ends two minutes after its connection's
	// flow was written, in TIME_WAIT): those leave past the retention, or
	// the cap, without being indexed.
	unindexed ring

	maxEntries int
	retention  time.Duration

	evicted uint64
}

func newTable(maxEntries int, retention time.Duration) *table {
	return &table{
		byTuple:    map[event.Tuple]*node{},
		maxEntries: maxEntries,
		retention:  retention,
	}
}

// lookup is the newest ended entry that has tu as either tuple, within
// the retention.
func (t *table) lookup(tu event.Tuple, now time.Time) (Entry, bool) {
	t.catchUp()
	n := t.byTuple[tu]
	// An entry past its retention may not have been pruned yet (pruning
	// runs on a timer); it must not be joined any more.
	if n == nil || now.Sub(n.e.Seen) > t.retention {
		return Entry{}, false
	}
	return n.e, true
}

// point points both tuples at n.
func (t *table) point(n *node) {
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

// ended records the end of a connection, to be indexed when the table is
// next asked; beyond maxEntries the oldest end goes.
func (t *table) ended(e Entry) Entry {
	e.Replied = e.Replied || e.Status&StatusSeenReply != 0
	e.Destroyed = true
	for t.len() > 0 && t.len() >= t.maxEntries {
		if t.ends.tail != nil {
			t.drop(t.ends.tail)
		} else {
			t.unindexed.pop()
		}
		t.evicted++
	}
	t.unindexed.push(e, t.maxEntries)
	return e
}

// catchUp indexes the unindexed ends, oldest first. An entry already held
// for an end's original tuple is an earlier connection's (the client
// reused its source port), kept as its history.
func (t *table) catchUp() {
	for t.unindexed.n > 0 {
		n := &node{e: *t.unindexed.front()}
		t.unindexed.pop()
		if prev := t.byTuple[n.e.Orig]; prev != nil && prev.e.Orig == n.e.Orig {
			n.earlier = prev
		}
		t.point(n)
		t.ends.pushFront(n)
	}
	if len(t.unindexed.buf) > maxScratch {
		t.unindexed = ring{}
	}
}

// ring is a queue of ends, oldest first, in an array it grows up to a
// limit.
type ring struct {
	buf     []Entry
	head, n int
}

// push appends e; the queue holds no more than limit.
func (r *ring) push(e Entry, limit int) {
	if r.n == len(r.buf) {
		grown := make([]Entry, min(max(2*len(r.buf), 64), max(limit, r.n+1)))
		for i := range r.n {
			grown[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = grown, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = e
	r.n++
}

func (r *ring) front() *Entry { return &r.buf[r.head] }

func (r *ring) pop() {
	r.buf[r.head] = Entry{}
	r.head = (r.head + 1) % len(r.buf)
	r.n--
}

// drop takes n out of the table and ends the history chains through it,
// so that it is neither returned nor kept alive by a newer entry.
func (t *table) drop(n *node) {
	t.ends.remove(n)
	t.unindex(n)
	n.gone = true
	n.earlier = nil
}

// prune forgets entries older than the retention. The ends are ordered
// by time, the indexed ones before the rest, so it stops at the first
// young one.
func (t *table) prune(now time.Time) int {
	pruned := 0
	for n := t.ends.tail; n != nil && now.Sub(n.e.Seen) > t.retention; n = t.ends.tail {
		t.drop(n)
		pruned++
	}
	if t.ends.n > 0 {
		return pruned
	}
	for t.unindexed.n > 0 && now.Sub(t.unindexed.front().Seen) > t.retention {
		t.unindexed.pop()
		pruned++
	}
	return pruned
}

// appendDestroyed appends the ended entries whose original tuple is tu
// to dst, newest first, within the retention: the one lookup finds, then
// the ones it replaced.
func (t *table) appendDestroyed(dst []Entry, tu event.Tuple, now time.Time) []Entry {
	t.catchUp()
	for n := t.byTuple[tu]; n != nil && !n.gone && n.e.Orig == tu; n = n.earlier {
		if now.Sub(n.e.Seen) > t.retention {
			break
		}
		dst = append(dst, n.e)
	}
	return dst
}

func (t *table) len() int { return t.ends.n + t.unindexed.n }

// bySource lists the ended entries within the retention whose original
// tuple leaves from src. It walks the whole table: it serves the rare
// question "which of my connections does this stray packet answer?",
// never the per-event path.
func (t *table) bySource(proto uint8, src netip.AddrPort, now time.Time) []Entry {
	t.catchUp()
	var out []Entry
	for n := t.ends.head; n != nil; n = n.next {
		if n.e.Orig.Proto == proto && n.e.Orig.SrcAddrPort() == src && now.Sub(n.e.Seen) <= t.retention {
			out = append(out, n.e)
		}
	}
	return out
}
