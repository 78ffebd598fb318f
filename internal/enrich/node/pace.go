package node

import (
	"context"
	"fmt"
	"time"
)

// readShare bounds the time the Watcher spends re-reading a part of the
// node (its commands and the parse): after a read that took d, the part
// is read again no sooner than readShare times d later. On kube-proxy's
// iptables mode for 10,000 Services, iptables-save alone takes 5 s of a
// CPU, and kube-proxy may commit every second or two: read at every
// commit, the tracer would take most of a core from the node it watches.
const readShare = 10

// pacedFrom is the shortest read that is paced: at any real poll
// interval a quicker one costs nothing worth putting off, and under
// emulation a test's fake reads take a few milliseconds.
const pacedFrom = 20 * time.Millisecond

// pace is when a part may be read again, and the interval the state's
// note says.
type pace struct {
	next  time.Time
	noted time.Duration
}

// pacedPart is a part read by a command whose cost grows with the node.
type pacedPart struct {
	name, what string // the note's key; what it reads
	read       func(context.Context, *State) bool
}

// pollPaced reads p into st unless its last read was too recent for the
// budget; it reports whether st changed.
func (w *Watcher) pollPaced(ctx context.Context, st *State, p pacedPart) bool {
	pc := w.paces[p.name]
	start := time.Now()
	if start.Before(pc.next) {
		w.deferred.Add(1)
		return false
	}
	changed := p.read(ctx, st)
	var every time.Duration // 0: read again at the next poll
	if took := time.Since(start); took >= w.pacedFrom {
		every = readShare * took
		pc.next = start.Add(every)
	}
	if w.notePace(st, p, &pc, every) {
		changed = true
	}
	w.paces[p.name] = pc
	return changed
}

// paceNoted is how many polls apart a part's reads must be for the
// state to say so: a read a little slower than the poll is no news, a
// change unseen for ten seconds and more is.
const paceNoted = 5

// notePace says in st's notes how often the part is read when that is
// paceNoted polls apart or more. The note changes only when the interval
// doubles or halves, so a read that takes a little longer than the last
// does not make a new state.
func (w *Watcher) notePace(st *State, p pacedPart, pc *pace, every time.Duration) bool {
	if every < paceNoted*w.opts.Poll {
		pc.noted = 0
		return w.setNote(st, "pace-"+p.name, "")
	}
	if pc.noted != 0 && every < 2*pc.noted && every > pc.noted/2 {
		return false
	}
	pc.noted = every
	return w.setNote(st, "pace-"+p.name, fmt.Sprintf("%s are read at most every %s: reading them takes %s here, and the tracer spends at most a tenth of its time reading the node (changes in between show at the next read)",
		p.what, every.Round(time.Second), (every/readShare).Round(10*time.Millisecond)))
}
