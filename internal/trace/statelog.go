package trace

import (
	"sync"
	"time"
)

// StateLog keeps a live trace's state changes for what is written from it
// later (the UI's export): the header's snapshot and each change, folding
// into the snapshot the changes no kept flow can need. Safe for
// concurrent use.
type StateLog struct {
	mu      sync.Mutex
	base    *Snapshot
	changes []*StateChange
}

// NewStateLog starts from the header's snapshot.
func NewStateLog(header *Snapshot) *StateLog { return &StateLog{base: header} }

// Add appends c, in the order recorded, and folds into the starting
// snapshot every change superseded by one from keepFrom or earlier: no
// flow decided from keepFrom on is diagnosed against them.
func (l *StateLog) Add(c *StateChange, keepFrom time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changes = append(l.changes, c)
	n := 0
	for n+1 < len(l.changes) && !l.changes[n+1].Time.After(keepFrom) {
		n++
	}
	if n == 0 {
		return
	}
	for _, old := range l.changes[:n] {
		l.base = old.Apply(l.base)
	}
	l.changes = append(l.changes[:0:0], l.changes[n:]...)
}

// From is what a trace of flows decided from t on starts with: the state
// in force at t, as its header's snapshot, and the changes after it.
func (l *StateLog) From(t time.Time) (*Snapshot, []*StateChange) {
	l.mu.Lock()
	defer l.mu.Unlock()
	base, rest := l.base, l.changes
	for len(rest) > 0 && !rest[0].Time.After(t) {
		base, rest = rest[0].Apply(base), rest[1:]
	}
	return base, rest
}
