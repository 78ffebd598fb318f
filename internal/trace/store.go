package trace

import (
	"sync"
)

// storeChunk is how many flows one chunk of a Store holds. Chunks never
// move once allocated, so a *Flow from At stays valid while the store
// grows, and readers iterate without holding the lock.
const storeChunk = 1 << 12

// internLimit bounds the intern table. Low-cardinality strings (verdicts,
// hooks, pods, rule text, service addresses) fill it first; once full,
// new strings are stored as they come, so a flood of unique client
// addresses cannot grow the table without bound.
const internLimit = 1 << 16

// Store holds flows in memory for the UI and the live pipeline: the
// pipeline appends, the UI reads. It is append-only; a flow once stored
// never changes. Flows share their repeated strings and tuples, which is
// what keeps a million flows well under a gigabyte.
type Store struct {
	mu       sync.RWMutex
	chunks   [][]Flow
	n        int
	events   int
	verdicts map[string]int
	strs     map[string]string
	tuples   map[Tuple]*Tuple
	pods     map[PodRef]*PodRef
	services map[ServiceRef]*ServiceRef
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		verdicts: map[string]int{},
		strs:     map[string]string{},
		tuples:   map[Tuple]*Tuple{},
		pods:     map[PodRef]*PodRef{},
		services: map[ServiceRef]*ServiceRef{},
	}
}

// Append copies f into the store and returns its index. f itself is not
// retained; its Events, Rule, pods and Service are copied with shared
// strings.
func (s *Store) Append(f *Flow) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == len(s.chunks)*storeChunk {
		s.chunks = append(s.chunks, make([]Flow, storeChunk))
	}
	i := s.n
	dst := &s.chunks[i/storeChunk][i%storeChunk]
	s.copyFlow(dst, f)
	s.n++
	s.events += len(f.Events)
	s.verdicts[dst.Verdict]++
	return i
}

// Len returns how many flows are stored.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.n
}

// At returns flow i (0 <= i < Len). The flow must not be modified.
func (s *Store) At(i int) *Flow {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return &s.chunks[i/storeChunk][i%storeChunk]
}

// Snapshot returns a read-only view of the flows stored so far. It needs no
// lock to read: stored flows never change and chunks never move.
func (s *Store) Snapshot() StoreView {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return StoreView{chunks: append([][]Flow(nil), s.chunks...), n: s.n}
}

// Counts returns the number of events and a copy of the flows per verdict
// ("" counts flows without a verdict).
func (s *Store) Counts() (events int, verdicts map[string]int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	verdicts = make(map[string]int, len(s.verdicts))
	for k, v := range s.verdicts {
		verdicts[k] = v
	}
	return s.events, verdicts
}

// StoreView is a fixed prefix of a Store.
type StoreView struct {
	chunks [][]Flow
	n      int
}

// Len returns the number of flows in the view.
func (v StoreView) Len() int { return v.n }

// At returns flow i of the view.
func (v StoreView) At(i int) *Flow { return &v.chunks[i/storeChunk][i%storeChunk] }

func (s *Store) str(x string) string {
	if x == "" {
		return ""
	}
	if y, ok := s.strs[x]; ok {
		return y
	}
	if len(s.strs) < internLimit {
		s.strs[x] = x
	}
	return x
}

func (s *Store) strSlice(xs []string) []string {
	if xs == nil {
		return nil
	}
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = s.str(x)
	}
	return out
}

// tuple returns a shared copy of t: the flow's own tuples when equal
// (events usually repeat them), else an interned one.
func (s *Store) tuple(t *Tuple, flow *Flow) *Tuple {
	if t == nil {
		return nil
	}
	if *t == flow.Orig {
		return &flow.Orig
	}
	if flow.Reply != nil && *t == *flow.Reply {
		return flow.Reply
	}
	if p, ok := s.tuples[*t]; ok {
		return p
	}
	p := &Tuple{Src: s.str(t.Src), Dst: s.str(t.Dst)}
	if len(s.tuples) < internLimit {
		s.tuples[*p] = p
	}
	return p
}

func (s *Store) podRef(p *PodRef) *PodRef {
	if p == nil {
		return nil
	}
	if q, ok := s.pods[*p]; ok {
		return q
	}
	q := &PodRef{Namespace: s.str(p.Namespace), Name: s.str(p.Name)}
	if len(s.pods) < internLimit {
		s.pods[*q] = q
	}
	return q
}

func (s *Store) serviceRef(r *ServiceRef) *ServiceRef {
	if r == nil {
		return nil
	}
	if q, ok := s.services[*r]; ok {
		return q
	}
	q := &ServiceRef{Namespace: s.str(r.Namespace), Name: s.str(r.Name), Port: s.str(r.Port)}
	if len(s.services) < internLimit {
		s.services[*q] = q
	}
	return q
}

func (s *Store) copyFlow(dst, f *Flow) {
	*dst = Flow{
		Type:        TypeFlow,
		Time:        f.Time,
		Proto:       s.str(f.Proto),
		Orig:        Tuple{Src: s.str(f.Orig.Src), Dst: s.str(f.Orig.Dst)},
		Verdict:     s.str(f.Verdict),
		Explanation: s.str(f.Explanation),
		SrcPod:      s.podRef(f.SrcPod),
		DstPod:      s.podRef(f.DstPod),
	}
	if f.Reply != nil {
		dst.Reply = s.tuple(f.Reply, dst)
	}
	dst.Service = s.serviceRef(f.Service)
	if f.Rule != nil {
		dst.Rule = s.rule(f.Rule)
	}
	if f.Conntrack != nil {
		ct := *f.Conntrack
		ct.State = s.str(ct.State)
		ct.Status = s.strSlice(ct.Status)
		dst.Conntrack = &ct
	}
	if len(f.Events) > 0 {
		dst.Events = make([]Event, len(f.Events))
		for i := range f.Events {
			s.copyEvent(&dst.Events[i], &f.Events[i], dst)
		}
	}
}

func (s *Store) rule(r *Rule) *Rule {
	out := &Rule{
		Table:      s.str(r.Table),
		Chain:      s.str(r.Chain),
		EntryChain: s.str(r.EntryChain),
		Path:       s.strSlice(r.Path),
		Text:       s.str(r.Text),
		Uncertain:  s.str(r.Uncertain),
	}
	if r.Owner != nil {
		out.Owner = &Owner{ContainerID: s.str(r.Owner.ContainerID), Pod: s.podRef(r.Owner.Pod)}
	}
	return out
}

func (s *Store) copyEvent(dst, e *Event, flow *Flow) {
	*dst = *e
	dst.Type = ""
	dst.Kind = s.str(e.Kind)
	dst.Hook = s.str(e.Hook)
	dst.Via = s.str(e.Via)
	dst.Proto = s.str(e.Proto)
	dst.Packet = s.tuple(e.Packet, flow)
	dst.Orig = s.tuple(e.Orig, flow)
	dst.Reply = s.tuple(e.Reply, flow)
	dst.To = s.str(e.To)
	dst.Virtual = s.str(e.Virtual)
	dst.Forward = s.str(e.Forward)
	dst.NFHook = s.str(e.NFHook)
	dst.Reason = s.str(e.Reason)
	dst.CTStatus = s.strSlice(e.CTStatus)
	dst.By = s.str(e.By)
	if e.ICMPType != nil {
		v := *e.ICMPType
		dst.ICMPType = &v
	}
	if e.ICMPCode != nil {
		v := *e.ICMPCode
		dst.ICMPCode = &v
	}
}
