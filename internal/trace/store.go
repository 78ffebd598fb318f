package trace

import (
	"strings"
	"sync"
	"unsafe"
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
	keys     [][]AddrKeys // parallel to chunks
	n        int
	nEvents  int
	verdicts map[string]int
	strs     map[string]string
	tuples   map[Tuple]*Tuple
	pods     map[PodRef]*PodRef
	services map[ServiceRef]*ServiceRef
	rules    map[ruleKey]*Rule
	cts      map[ctKey]*Conntrack
	lists    map[string][]string
	addrs    map[string]string // addresses, bounded apart from strs

	// Arenas for what is unique to each flow: event arrays, tuples and
	// address strings are carved from shared slabs, so consecutive flows
	// sit next to each other in memory. A filter scan over a million flows
	// then streams through memory instead of chasing a pointer per field,
	// and no flow pays for allocation headers and size-class rounding.
	eventArena []Event
	tupleArena []Tuple
	byteArena  []byte
}

// ruleKey and ctKey identify equal rules and conntrack entries: a busy
// node's flows are decided by a handful of rules.
type ruleKey struct {
	table, chain, entry, path, text, uncertain string
	ownerID, ownerNS, ownerName                string
}

type ctKey struct {
	state, status string
	mark          uint32
	replied       bool
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		verdicts: map[string]int{},
		strs:     map[string]string{},
		tuples:   map[Tuple]*Tuple{},
		pods:     map[PodRef]*PodRef{},
		services: map[ServiceRef]*ServiceRef{},
		rules:    map[ruleKey]*Rule{},
		cts:      map[ctKey]*Conntrack{},
		lists:    map[string][]string{},
		addrs:    map[string]string{},
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
		s.keys = append(s.keys, make([]AddrKeys, storeChunk))
	}
	i := s.n
	dst := &s.chunks[i/storeChunk][i%storeChunk]
	s.copyFlow(dst, f)
	s.keys[i/storeChunk][i%storeChunk] = KeysOf(dst)
	s.n++
	s.nEvents += len(f.Events)
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
	return StoreView{chunks: append([][]Flow(nil), s.chunks...), keys: append([][]AddrKeys(nil), s.keys...), n: s.n}
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
	return s.nEvents, verdicts
}

// StoreView is a fixed prefix of a Store.
type StoreView struct {
	chunks [][]Flow
	keys   [][]AddrKeys
	n      int
}

// Len returns the number of flows in the view.
func (v StoreView) Len() int { return v.n }

// At returns flow i of the view.
func (v StoreView) At(i int) *Flow { return &v.chunks[i/storeChunk][i%storeChunk] }

// Keys returns the address keys of flow i of the view.
func (v StoreView) Keys(i int) *AddrKeys { return &v.keys[i/storeChunk][i%storeChunk] }

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

// strSlice returns a shared copy of xs (conntrack status lists repeat).
func (s *Store) strSlice(xs []string) []string {
	if xs == nil {
		return nil
	}
	key := strings.Join(xs, "\x00")
	if out, ok := s.lists[key]; ok && len(out) == len(xs) {
		return out
	}
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = s.str(x)
	}
	if len(s.lists) < internLimit {
		s.lists[key] = out
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
	p := s.newTuple(Tuple{Src: s.addr(t.Src), Dst: s.addr(t.Dst)})
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
		Orig:        Tuple{Src: s.addr(f.Orig.Src), Dst: s.addr(f.Orig.Dst)},
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
		dst.Conntrack = s.conntrack(f.Conntrack)
	}
	if len(f.Events) > 0 {
		dst.Events = s.newEvents(len(f.Events))
		for i := range f.Events {
			s.copyEvent(&dst.Events[i], &f.Events[i], dst)
		}
	}
}

func (s *Store) rule(r *Rule) *Rule {
	key := ruleKey{table: r.Table, chain: r.Chain, entry: r.EntryChain, path: strings.Join(r.Path, "\x00"), text: r.Text, uncertain: r.Uncertain}
	if r.Owner != nil {
		key.ownerID = r.Owner.ContainerID
		if r.Owner.Pod != nil {
			key.ownerNS, key.ownerName = r.Owner.Pod.Namespace, r.Owner.Pod.Name
		} else {
			key.ownerNS = "\x00" // an owner without a pod differs from none
		}
	}
	if out, ok := s.rules[key]; ok && (out.Owner != nil) == (r.Owner != nil) && len(out.Path) == len(r.Path) {
		return out
	}
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
	if len(s.rules) < internLimit {
		s.rules[key] = out
	}
	return out
}

func (s *Store) conntrack(ct *Conntrack) *Conntrack {
	key := ctKey{state: ct.State, status: strings.Join(ct.Status, "\x00"), mark: ct.Mark, replied: ct.Replied}
	if out, ok := s.cts[key]; ok && (out.Status == nil) == (ct.Status == nil) {
		return out
	}
	out := &Conntrack{State: s.str(ct.State), Status: s.strSlice(ct.Status), Mark: ct.Mark, Replied: ct.Replied}
	if len(s.cts) < internLimit {
		s.cts[key] = out
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
	dst.To = s.addr(e.To)
	dst.Virtual = s.addr(e.Virtual)
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

const (
	eventSlab = 1 << 13
	tupleSlab = 1 << 12
	byteSlab  = 1 << 16
)

// newEvents returns n zeroed events from the event slab.
func (s *Store) newEvents(n int) []Event {
	if n > eventSlab/4 {
		return make([]Event, n)
	}
	if len(s.eventArena)+n > cap(s.eventArena) {
		s.eventArena = make([]Event, 0, eventSlab)
	}
	start := len(s.eventArena)
	s.eventArena = s.eventArena[:start+n]
	return s.eventArena[start : start+n : start+n]
}

func (s *Store) newTuple(t Tuple) *Tuple {
	if len(s.tupleArena) == cap(s.tupleArena) {
		s.tupleArena = make([]Tuple, 0, tupleSlab)
	}
	s.tupleArena = append(s.tupleArena, t)
	return &s.tupleArena[len(s.tupleArena)-1]
}

// addr interns an address; once the table is full (a busy node's client
// addresses are unique), it copies the address into the byte slab.
func (s *Store) addr(x string) string {
	if x == "" {
		return ""
	}
	if y, ok := s.addrs[x]; ok {
		return y
	}
	if len(s.addrs) < internLimit {
		y := s.copyString(x)
		s.addrs[y] = y
		return y
	}
	return s.copyString(x)
}

func (s *Store) copyString(x string) string {
	if len(x) > byteSlab/16 {
		return strings.Clone(x)
	}
	if len(s.byteArena)+len(x) > cap(s.byteArena) {
		s.byteArena = make([]byte, 0, byteSlab)
	}
	start := len(s.byteArena)
	s.byteArena = append(s.byteArena, x...)
	return unsafe.String(&s.byteArena[start], len(x))
}
