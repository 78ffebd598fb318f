package live

import (
	"sync"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/enrich/node"
	"github.com/tracer-dev/tracer/internal/trace"
)

// statePoll is how often the node watcher re-reads the rules, ipsets,
// nftables, IPVS and listeners.
const statePoll = 2 * time.Second

// holdUncertain is how long a flow whose rule is uncertain waits for the
// first reading after its decision: a poll and the reading's own time.
const holdUncertain = statePoll + time.Second

// maxStates bounds the states kept for flows still lingering: each may
// hold a parsed rule set.
const maxStates = 16

// states are the node's recent states, each in force from its read time
// until the next one's: a flow is diagnosed against the rules in force
// when the kernel decided, not those of when its linger ended. It also
// hands each change on to the trace writers, once they exist.
type states struct {
	node string
	meta enrich.Metadata
	// keep is how long a superseded state may still be asked for: a
	// flow's linger, and the reader running late.
	keep time.Duration

	mu   sync.Mutex
	list []stateEnv // by read time
	none enrich.Env // without a watcher: no node state at all
	// sink writes a change to the trace; recorded is the state the trace
	// last wrote (the header's snapshot, then each change).
	sink     func(*trace.StateChange)
	recorded *node.State
	// metadata lists the pods and Services now (nil: no metadata);
	// recordedMeta is what the trace holds of them, and stopMeta ends the
	// watch of their changes when the sink goes.
	metadata     func() ([]trace.Pod, []trace.Service)
	recordedMeta recordedMetadata
	stopMeta     chan struct{}
	// metaWake, and under pendMu pending and recording, are the index's
	// changes not yet recorded, queued while a trace is recorded.
	metaWake  chan struct{}
	pendMu    sync.Mutex
	pending   []pendingMetadata
	recording bool
	// metaSince is when the pods and Services were read as recording
	// began: a queued change taken by then is in that reading.
	metaSince time.Time
}

type stateEnv struct {
	st  *node.State
	env enrich.Env // built when a flow first asks
}

// seed adds the watcher's first state, which it does not publish.
func (s *states) seed(st *node.State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append([]stateEnv{{st: st}}, s.list...)
}

// publish adds a state the watcher published (node.WatchOptions.OnPublish).
func (s *states) publish(st *node.State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, stateEnv{st: st})
	for len(s.list) > 1 && (len(s.list) > maxStates || s.list[1].st.Read().Before(st.Read().Add(-s.keep))) {
		s.list = s.list[1:]
	}
	s.record()
}

// latest is the newest state, nil without a watcher.
func (s *states) latest() *node.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.list) == 0 {
		return nil
	}
	return s.list[len(s.list)-1].st
}

// recordFrom makes snap, read from st (nil without a watcher), the state
// the trace starts from (the header's).
func (s *states) recordFrom(st *node.State, snap *trace.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recorded = st
	s.recordedMeta = newRecordedMetadata(snap.Pods, snap.Services)
}

// recordTo sets where changes are written (nil: nowhere from now on), and
// writes the change since the header's state if one came in between.
func (s *states) recordTo(sink func(*trace.StateChange)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writePendingLocked() // what the old sink was owed
	s.sink = sink
	if s.stopMeta != nil {
		close(s.stopMeta)
		s.stopMeta = nil
	}
	s.pendMu.Lock()
	s.recording, s.pending = sink != nil && s.metadata != nil, nil
	s.pendMu.Unlock()
	s.record()
	if sink != nil && s.metadata != nil {
		s.recordMetadataSince()
		s.stopMeta = make(chan struct{})
		go s.watchMetadata(s.stopMeta)
	}
}

// recordMetadataSince writes what changed in the pods and Services since
// the header's, from before changes were queued. The caller holds mu.
func (s *states) recordMetadataSince() {
	if s.recordedMeta.pods == nil {
		return
	}
	// A change the index took by now is in what it lists next: it holds
	// its lock from taking the time to applying the change.
	s.metaSince = time.Now()
	pods, services := s.metadata()
	if d := s.recordedMeta.since(pods, services); d != nil {
		s.sink(&trace.StateChange{Type: trace.TypeState, Time: s.metaSince.UTC(), Changed: []string{trace.PartMetadata}, Metadata: d})
	}
}

// record writes the change from the recorded state to the newest. The
// caller holds mu.
func (s *states) record() {
	if s.sink == nil || s.recorded == nil || len(s.list) == 0 {
		return
	}
	cur := s.list[len(s.list)-1].st
	if cur == s.recorded {
		return
	}
	if c := node.Change(s.recorded, cur); c != nil {
		s.sink(c)
	}
	s.recorded = cur
}

// envAt is the enrichment environment of the state in force at t: the
// last one read at or before it (the oldest kept, for a flow older than
// every state kept).
func (s *states) envAt(t time.Time) enrich.Env {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.list) == 0 {
		if s.none == nil {
			s.none, _ = enrich.NewNodeEnv(s.node, nil, s.meta)
		}
		return s.none
	}
	i := len(s.list) - 1
	for i > 0 && s.list[i].st.Read().After(t) {
		i--
	}
	if s.list[i].env == nil {
		s.list[i].env = s.build(i)
	}
	return s.list[i].env
}

// envAfter is the environment of the first state read after t, nil when
// none is yet.
func (s *states) envAfter(t time.Time) enrich.Env {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, se := range s.list {
		if se.st.Read().After(t) {
			if se.env == nil {
				s.list[i].env = s.build(i)
			}
			return s.list[i].env
		}
	}
	return nil
}

// build is state i's environment, made from the state as read.
func (s *states) build(i int) enrich.Env {
	return enrich.NewStateEnv(s.node, s.list[i].st, s.meta)
}
