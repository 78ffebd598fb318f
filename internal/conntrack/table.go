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
// is not safe for concurrent use; the Tracker guards it.
type table struct {
	byTuple map[event.Tuple]*node
	ends    list

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
	n := t.byTuple[tu]
	// An entry past its retention may not have been pruned yet (pruning
	// runs on a timer); it must not be joined any more.
	if n == nil || now.Sub(n.e.Seen) > t.retention {
		return Entry{}, false
	}
	return n.e, true
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

// ended records the end of a connection. An entry already held for its
// original tuple is an earlier connection's (the client reused its
// source port), kept as its history.
func (t *table) ended(e Entry) Entry {
	e.Replied = e.Replied || e.Status&StatusSeenReply != 0
	e.Destroyed = true
	n := &node{e: e}
	if prev := t.byTuple[e.Orig]; prev != nil && prev.e.Orig == e.Orig {
		n.earlier = prev
	}
	t.index(n)
	t.ends.pushFront(n)
	for t.ends.n > t.maxEntries {
		t.drop(t.ends.tail)
		t.evicted++
	}
	return n.e
}

// drop takes n out of the table and ends the history chains through it,
// so that it is neither returned nor kept alive by a newer entry.
func (t *table) drop(n *node) {
	t.ends.remove(n)
	t.unindex(n)
	n.gone = true
	n.earlier = nil
}

// prune forgets entries older than the retention. The list is ordered by
// end, so it stops at the first young one.
func (t *table) prune(now time.Time) int {
	pruned := 0
	for n := t.ends.tail; n != nil && now.Sub(n.e.Seen) > t.retention; n = t.ends.tail {
		t.drop(n)
		pruned++
	}
	return pruned
}

// appendDestroyed appends the ended entries whose original tuple is tu
// to dst, newest first, within the retention: the one lookup finds, then
// the ones it replaced.
func (t *table) appendDestroyed(dst []Entry, tu event.Tuple, now time.Time) []Entry {
	for n := t.byTuple[tu]; n != nil && !n.gone && n.e.Orig == tu; n = n.earlier {
		if now.Sub(n.e.Seen) > t.retention {
			break
		}
		dst = append(dst, n.e)
	}
	return dst
}

func (t *table) len() int { return t.ends.n }

// bySource lists the ended entries within the retention whose original
// tuple leaves from src. It walks the whole table: it serves the rare
// question "which of my connections does this stray packet answer?",
// never the per-event path.
func (t *table) bySource(proto uint8, src netip.AddrPort, now time.Time) []Entry {
	var out []Entry
	for n := t.ends.head; n != nil; n = n.next {
		if n.e.Orig.Proto == proto && n.e.Orig.SrcAddrPort() == src && now.Sub(n.e.Seen) <= t.retention {
			out = append(out, n.e)
		}
	}
	return out
}
