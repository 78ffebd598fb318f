package trace

import (
	"maps"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// storeChunk is how many flows one chunk of a Store holds. Chunks never
// move once allocated and are never reused once evicted, so a StoreView
// stays readable while the store grows and evicts, and readers iterate
// without holding the lock.
const storeChunk = 1 << 12

// internLimit bounds each intern table. Low-cardinality strings (verdicts,
// hooks, pods, rule text, service addresses) fill it first; once full,
// new strings are stored as they come, so a flood of unique client
// addresses cannot grow the table without bound.
const internLimit = 1 << 16

// Caps bound what a Store retains; zero means unbounded. Beyond either
// cap the oldest flows are evicted: the count cap evicts flow by flow,
// the memory cap whole chunks (only a dropped chunk frees memory).
type Caps struct {
	// Flows is the most flows retained.
	Flows int
	// Memory is the most bytes the store may hold by its own estimate
	// (see Store.Memory). The chunk being filled is never evicted, so a
	// budget below MinMemory cannot be kept.
	Memory int64
}

// MinMemory is the smallest memory cap a Store can keep: the chunk being
// filled (its flow, key and time arrays, and its flows stored whole at up
// to 2 KiB each) plus the intern tables' quarter of the budget.
const MinMemory = 16 << 20

// Store holds flows in memory for the UI and the live pipeline: the
// pipeline appends, the UI reads. A flow once stored never changes; the
// oldest flows are evicted beyond the store's caps, and the counts keep
// every flow ever appended. Flows share their shapes (shape.go) and
// their repeated strings and tuples, which is what keeps a million flows
// under 200 MiB.
type Store struct {
	mu       sync.RWMutex
	caps     Caps
	chunks   []chunk
	base     int // store index of chunks[0].flows[0]
	first    int // oldest retained flow; those before are evicted
	n        int
	nEvents  int
	verdicts map[string]int
	cause    string // the cap that evicted last: "flows" or "memory"

	// chunkBytes is the sum of the chunks' cost, tableBytes what the
	// intern tables and the objects only they keep alive are estimated to
	// take.
	chunkBytes int64
	tableBytes int64
	flowBytes  int64 // charged so far by the flow being copied

	strs     map[string]string
	tuples   map[Tuple]*Tuple
	pods     map[PodRef]*PodRef
	services map[ServiceRef]*ServiceRef
	rules    map[ruleKey]*Rule
	cts      map[ctKey]*Conntrack
	lists    map[string][]string
	addrs    map[string]string // addresses, bounded apart from strs
	shapes   map[string]*shape
	keyBuf   []byte
	// fixedZones holds one unnamed fixed zone per offset (Store.location).
	fixedZones map[int]*time.Location

	// Arenas for what is unique to each flow stored whole: event arrays,
	// tuples and strings are carved from shared slabs, so that no flow
	// pays for allocation headers and size-class rounding. Each chunk has
	// slabs of its own (flowArena starts afresh with every chunk), and
	// what the intern tables keep has its own (tableArena): an event
	// points into its chunk, so a slab shared by two chunks would chain
	// every chunk to the next and none would ever be freed, and an
	// interned address would pin a slab of evicted flows' strings.
	flowArena  arena
	tableArena arena
}

// chunk is storeChunk flows and their events' times. A view copies the chunk, so that times may grow under it: the
// flows it sees index only what its copy holds.
type chunk struct {
	flows []storedFlow
	times []int64
	cost  int64 // bytes charged to the chunk
}

// arena hands out objects from slabs and charges each slab, when it is
// allocated, to where charged points: the flow being copied, or the
// intern tables.
type arena struct {
	events  []Event
	tuples  []Tuple
	bytes   []byte
	charged *int64
}

// ruleKey and ctKey identify equal rules and conntrack entries: a busy
// node's flows are decided by a handful of rules.
type ruleKey struct {
	backend, family                            string
	handle                                     uint64
	elemMap, elemKey, elemComment              string
	table, chain, entry, path, text, uncertain string
	ownerID, ownerNS, ownerName                string
	hasElem                                    bool
}

type ctKey struct {
	state, status string
	mark          uint32
	replied       bool
	unconfirmed   bool
}

// NewStore returns an empty store without caps.
func NewStore() *Store { return NewCappedStore(Caps{}) }

// NewCappedStore returns an empty store that evicts its oldest flows
// beyond caps.
func NewCappedStore(caps Caps) *Store {
	s := &Store{
		caps:     caps,
		verdicts: map[string]int{},
		strs:     map[string]string{},
		tuples:   map[Tuple]*Tuple{},
		pods:     map[PodRef]*PodRef{},
		services: map[ServiceRef]*ServiceRef{},
		rules:    map[ruleKey]*Rule{},
		cts:      map[ctKey]*Conntrack{},
		lists:    map[string][]string{},
		addrs:    map[string]string{},
		shapes:   map[string]*shape{},

		fixedZones: map[int]*time.Location{},
	}
	s.flowArena.charged, s.tableArena.charged = &s.flowBytes, &s.tableBytes
	return s
}

// Append copies f into the store and returns its index. f itself is not
// retained; its Events, Rule, pods and Service are copied with shared
// strings. Beyond the caps the oldest flows are evicted.
func (s *Store) Append(f *Flow) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == s.base+len(s.chunks)*storeChunk {
		s.addChunk()
	}
	i := s.n
	c := &s.chunks[(i-s.base)/storeChunk]
	j := (i - s.base) % storeChunk
	s.flowBytes = 0
	timesCap := cap(c.times)
	rec := &c.flows[j]
	if !s.shaped(f, rec, c) {
		sh := &shape{own: true, keys: KeysOf(f)}
		s.flowBytes += sizeShape
		s.copyFlow(&sh.flow, f, &s.flowArena)
		*rec = storedFlow{shape: sh}
	}
	s.flowBytes += int64(cap(c.times)-timesCap) * 8
	c.cost += s.flowBytes
	s.chunkBytes += s.flowBytes
	s.n++
	s.nEvents += len(f.Events)
	s.verdicts[rec.shape.flow.Verdict]++
	s.evict()
	return i
}

// chunkArrays is what a chunk's flow, key and times arrays take.
const chunkArrays = storeChunk * (int64(unsafe.Sizeof(storedFlow{})) + 8*timesPerFlow)

// timesPerFlow is how many event times a chunk makes room for per flow
// at first: most flows have one or two events.
const timesPerFlow = 2

func (s *Store) addChunk() {
	s.flowArena = arena{charged: &s.flowBytes}
	s.chunks = append(s.chunks, chunk{flows: make([]storedFlow, storeChunk),
		times: make([]int64, 0, storeChunk*timesPerFlow), cost: chunkArrays})
	s.chunkBytes += chunkArrays
}

// evict moves the oldest retained flow past the count cap, then drops
// the oldest chunks while the estimate is over the memory cap. The chunk
// being filled stays.
func (s *Store) evict() {
	if s.caps.Flows > 0 && s.n-s.first > s.caps.Flows {
		s.first, s.cause = s.n-s.caps.Flows, "flows"
	}
	for len(s.chunks) > 1 && s.first >= s.base+storeChunk {
		s.dropChunk()
	}
	for s.caps.Memory > 0 && s.memory() > s.caps.Memory && len(s.chunks) > 1 {
		s.dropChunk()
		s.first, s.cause = max(s.first, s.base), "memory"
	}
}

// dropChunk forgets the oldest chunk. Its memory is not touched: views
// taken earlier still read it, and the garbage collector frees it after
// them.
func (s *Store) dropChunk() {
	s.chunkBytes -= s.chunks[0].cost
	s.chunks[0] = chunk{}
	s.chunks = s.chunks[1:]
	s.base += storeChunk
}

// memory is the store's estimate of the bytes it holds.
func (s *Store) memory() int64 { return s.chunkBytes + s.tableBytes }

// Memory returns the estimate of the bytes the store holds, which the
// memory cap bounds: every retained chunk's flow and key arrays, the
// slabs its flows' events, tuples and strings are carved from (charged
// whole when allocated), and what else its flows own (rules, pods and
// string lists the tables could not take); and the intern tables, at a
// fixed cost per map entry, with the slabs of what they keep. Tests hold
// it within 1.25x of the heap it grows.
func (s *Store) Memory() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.memory()
}

// Len returns the number of flows ever appended: the store's indexes are
// [Evicted(), Len()).
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.n
}

// Retained returns how many flows the store holds.
func (s *Store) Retained() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.n - s.first
}

// Eviction says how many of the oldest flows were evicted and which cap
// evicted last ("flows" or "memory"; "" before any eviction).
type Eviction struct {
	Evicted int
	Cause   string
	Caps    Caps
}

// Eviction returns how many flows were evicted, and why.
func (s *Store) Eviction() Eviction {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return Eviction{Evicted: s.first, Cause: s.cause, Caps: s.caps}
}

// At returns flow i, or nil when i was evicted. The flow must not be
// modified.
func (s *Store) At(i int) *Flow {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if i < s.first {
		return nil
	}
	c, j := s.locate(i)
	return c.flow(j)
}

func (s *Store) locate(i int) (*chunk, int) { return locate(s.chunks, s.base, i) }

// locate is the chunk that holds store index i, and i's place in it.
func locate(chunks []chunk, base, i int) (*chunk, int) {
	return &chunks[(i-base)/storeChunk], (i - base) % storeChunk
}

// flow reads flow j of the chunk into a flow of its own.
func (c *chunk) flow(j int) *Flow {
	out := new(Flow)
	c.load(j, out, &scratch{}, true, true)
	return out
}

// Oldest is the time of the oldest flow the store holds, false when it
// holds none.
func (s *Store) Oldest() (time.Time, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.first == s.n {
		return time.Time{}, false
	}
	c, j := s.locate(s.first)
	return c.flows[j].time(), true
}

// Snapshot returns a read-only view of the flows retained so far. It
// needs no lock to read: stored flows never change, and chunks never move
// and are never reused.
func (s *Store) Snapshot() StoreView {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return StoreView{chunks: append([]chunk(nil), s.chunks...), base: s.base, first: s.first, n: s.n, verdicts: maps.Clone(s.verdicts)}
}

// Counts returns the number of events and a copy of the flows per verdict
// ("" counts flows without a verdict) of every flow ever appended,
// evicted ones included.
func (s *Store) Counts() (events int, verdicts map[string]int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.nEvents, maps.Clone(s.verdicts)
}

// StoreView is the flows a Store retained at one moment: indexes
// [First(), Len()).
type StoreView struct {
	chunks []chunk
	base   int
	first  int
	n      int
	// verdicts counts every flow before n by verdict.
	verdicts map[string]int
}

// Len returns the index after the view's newest flow.
func (v StoreView) Len() int { return v.n }

// First returns the index of the view's oldest flow; the flows before it
// were evicted.
func (v StoreView) First() int { return v.first }

// At returns flow i of the view (First() <= i < Len()), in a flow of its
// own: a scan over many flows reads them with Load instead.
func (v StoreView) At(i int) *Flow {
	c, j := v.locate(i)
	return c.flow(j)
}

func (v StoreView) locate(i int) (*chunk, int) { return locate(v.chunks, v.base, i) }

// From returns the view without the flows before first, and without the
// chunks only they used, so that a paused table takes in the store's
// evictions and frees their memory.
func (v StoreView) From(first int) StoreView {
	if first <= v.first {
		return v
	}
	v.first = min(first, v.n)
	k := (v.first - v.base) / storeChunk
	v.chunks = append([]chunk(nil), v.chunks[k:]...)
	v.base += k * storeChunk
	return v
}

// Verdicts returns the flows per verdict of every flow before Len(),
// evicted ones included. It must not be modified.
func (v StoreView) Verdicts() map[string]int { return v.verdicts }

// Estimated costs of what the store allocates. A map entry costs its key
// and value twice over: Go's maps keep a slack of up to half their slots
// when they grow, plus a control byte.
const (
	sizeTuple   = int64(unsafe.Sizeof(Tuple{}))
	sizeEvent   = int64(unsafe.Sizeof(Event{}))
	sizePod     = int64(unsafe.Sizeof(PodRef{}))
	sizeService = int64(unsafe.Sizeof(ServiceRef{}))
	sizeRule    = int64(unsafe.Sizeof(Rule{}))
	sizeOwner   = int64(unsafe.Sizeof(Owner{}))
	sizeElement = int64(unsafe.Sizeof(RuleElement{}))
	sizeCT      = int64(unsafe.Sizeof(Conntrack{}))
	sizeString  = int64(unsafe.Sizeof(""))
	sizePointer = int64(unsafe.Sizeof((*int)(nil)))
	sizeShape   = int64(unsafe.Sizeof(shape{}))
)

func mapEntry(key, value int64) int64 { return 2*(key+value) + 1 }

// intern reports whether a table of n entries may take one more, and
// charges it when so.
func (s *Store) intern(n int, cost int64) bool {
	if n >= internLimit || (s.caps.Memory > 0 && s.tableBytes+cost > s.caps.Memory/4) {
		return false
	}
	s.tableBytes += cost
	return true
}

// str returns a shared copy of x, or a copy in a when the table is full.
// A string kept as it came would pin a small block among the caller's
// garbage, so evicting its flow would fragment the heap rather than
// shrink it.
func (s *Store) str(x string, a *arena) string {
	if x == "" {
		return ""
	}
	if y, ok := s.strs[x]; ok {
		return y
	}
	if s.intern(len(s.strs), mapEntry(sizeString, sizeString)) {
		y := s.tableArena.copyString(x)
		s.strs[y] = y
		return y
	}
	return a.copyString(x)
}

// strSlice returns a shared copy of xs (conntrack status lists repeat).
func (s *Store) strSlice(xs []string, a *arena) []string {
	if xs == nil {
		return nil
	}
	key := strings.Join(xs, "\x00")
	if out, ok := s.lists[key]; ok && len(out) == len(xs) {
		return out
	}
	size := sizeString * int64(len(xs))
	if s.intern(len(s.lists), mapEntry(sizeString, sizeString+2*sizePointer)+int64(len(key))+size) {
		out := s.newStrSlice(xs, &s.tableArena)
		s.lists[key] = out
		return out
	}
	*a.charged += size
	return s.newStrSlice(xs, a)
}

func (s *Store) newStrSlice(xs []string, a *arena) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = s.str(x, a)
	}
	return out
}

// tuple returns a shared copy of t: the flow's own tuples when equal
// (events usually repeat them), else an interned one, else one in the
// flow's arena.
func (s *Store) tuple(t *Tuple, flow *Flow, a *arena) *Tuple {
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
	if s.intern(len(s.tuples), mapEntry(sizeTuple, sizePointer)) {
		a := &s.tableArena
		p := a.tuple(Tuple{Src: s.addr(t.Src, a), Dst: s.addr(t.Dst, a)})
		s.tuples[*p] = p
		return p
	}
	return a.tuple(Tuple{Src: s.addr(t.Src, a), Dst: s.addr(t.Dst, a)})
}

func (s *Store) podRef(p *PodRef, a *arena) *PodRef {
	if p == nil {
		return nil
	}
	if q, ok := s.pods[*p]; ok {
		return q
	}
	if s.intern(len(s.pods), mapEntry(sizePod, sizePointer)+sizePod) {
		q := &PodRef{Namespace: s.str(p.Namespace, &s.tableArena), Name: s.str(p.Name, &s.tableArena)}
		s.pods[*q] = q
		return q
	}
	*a.charged += sizePod
	return &PodRef{Namespace: s.str(p.Namespace, a), Name: s.str(p.Name, a)}
}

func (s *Store) serviceRef(r *ServiceRef, a *arena) *ServiceRef {
	if r == nil {
		return nil
	}
	if q, ok := s.services[*r]; ok {
		return q
	}
	if s.intern(len(s.services), mapEntry(sizeService, sizePointer)+sizeService) {
		q := s.newService(r, &s.tableArena)
		s.services[*q] = q
		return q
	}
	*a.charged += sizeService
	return s.newService(r, a)
}

func (s *Store) newService(r *ServiceRef, a *arena) *ServiceRef {
	return &ServiceRef{Namespace: s.str(r.Namespace, a), Name: s.str(r.Name, a), Port: s.str(r.Port, a)}
}

func (s *Store) copyFlow(dst, f *Flow, a *arena) {
	*dst = Flow{
		Type:        TypeFlow,
		Node:        s.str(f.Node, a),
		Nodes:       s.strSlice(f.Nodes, a),
		Time:        f.Time,
		Proto:       s.str(f.Proto, a),
		Orig:        Tuple{Src: s.addr(f.Orig.Src, a), Dst: s.addr(f.Orig.Dst, a)},
		Verdict:     s.str(f.Verdict, a),
		Explanation: s.str(f.Explanation, a),
		SrcPod:      s.podRef(f.SrcPod, a),
		DstPod:      s.podRef(f.DstPod, a),
	}
	if f.Reply != nil {
		dst.Reply = s.tuple(f.Reply, dst, a)
	}
	dst.Service = s.serviceRef(f.Service, a)
	if f.Rule != nil {
		dst.Rule = s.rule(f.Rule, a)
	}
	if f.Conntrack != nil {
		dst.Conntrack = s.conntrack(f.Conntrack, a)
	}
	if len(f.Events) > 0 {
		dst.Events = a.newEvents(len(f.Events))
		for i := range f.Events {
			s.copyEvent(&dst.Events[i], &f.Events[i], dst, a)
		}
	}
}

func ruleKeyOf(r *Rule) ruleKey {
	key := ruleKey{backend: r.Backend, family: r.Family, handle: r.Handle,
		table: r.Table, chain: r.Chain, entry: r.EntryChain, path: strings.Join(r.Path, "\x00"), text: r.Text, uncertain: r.Uncertain}
	if e := r.Element; e != nil {
		key.hasElem, key.elemMap, key.elemKey, key.elemComment = true, e.Map, e.Key, e.Comment
	}
	if r.Owner != nil {
		key.ownerID = r.Owner.ContainerID
		if r.Owner.Pod != nil {
			key.ownerNS, key.ownerName = r.Owner.Pod.Namespace, r.Owner.Pod.Name
		} else {
			key.ownerNS = "\x00" // an owner without a pod differs from none
		}
	}
	return key
}

// rule returns a shared copy of r. The table's key is made from the copy,
// so that it holds none of the caller's strings.
func (s *Store) rule(r *Rule, a *arena) *Rule {
	key := ruleKeyOf(r)
	if out, ok := s.rules[key]; ok && (out.Owner != nil) == (r.Owner != nil) && len(out.Path) == len(r.Path) {
		return out
	}
	size := sizeRule
	if r.Element != nil {
		size += sizeElement
	}
	if r.Owner != nil {
		size += sizeOwner
	}
	if s.intern(len(s.rules), mapEntry(int64(unsafe.Sizeof(key)), sizePointer)+size+int64(len(key.path))) {
		out := s.newRule(r, &s.tableArena)
		s.rules[ruleKeyOf(out)] = out
		return out
	}
	*a.charged += size
	return s.newRule(r, a)
}

func (s *Store) newRule(r *Rule, a *arena) *Rule {
	out := &Rule{
		Backend:    s.str(r.Backend, a),
		Family:     s.str(r.Family, a),
		Handle:     r.Handle,
		Table:      s.str(r.Table, a),
		Chain:      s.str(r.Chain, a),
		EntryChain: s.str(r.EntryChain, a),
		Path:       s.strSlice(r.Path, a),
		Text:       s.str(r.Text, a),
		Uncertain:  s.str(r.Uncertain, a),
	}
	if e := r.Element; e != nil {
		out.Element = &RuleElement{Map: s.str(e.Map, a), Key: s.str(e.Key, a), Comment: s.str(e.Comment, a)}
	}
	if r.Owner != nil {
		out.Owner = &Owner{ContainerID: s.str(r.Owner.ContainerID, a), Pod: s.podRef(r.Owner.Pod, a)}
	}
	return out
}

func (s *Store) conntrack(ct *Conntrack, a *arena) *Conntrack {
	key := ctKey{state: ct.State, status: strings.Join(ct.Status, "\x00"), mark: ct.Mark, replied: ct.Replied, unconfirmed: ct.Unconfirmed}
	if out, ok := s.cts[key]; ok && (out.Status == nil) == (ct.Status == nil) {
		return out
	}
	if s.intern(len(s.cts), mapEntry(int64(unsafe.Sizeof(key)), sizePointer)+sizeCT+int64(len(key.status))) {
		out := s.copyConntrack(ct, &s.tableArena)
		key.state = out.State
		s.cts[key] = out
		return out
	}
	*a.charged += sizeCT
	return s.copyConntrack(ct, a)
}

// copyConntrack is ct with its strings in a.
func (s *Store) copyConntrack(ct *Conntrack, a *arena) *Conntrack {
	out := *ct
	out.State, out.Status = s.str(ct.State, a), s.strSlice(ct.Status, a)
	return &out
}

func (s *Store) copyEvent(dst, e *Event, flow *Flow, a *arena) {
	*dst = *e
	dst.Type = ""
	dst.Node = s.str(e.Node, a)
	dst.Kind = s.str(e.Kind, a)
	dst.Hook = s.str(e.Hook, a)
	dst.Via = s.str(e.Via, a)
	dst.Proto = s.str(e.Proto, a)
	dst.Packet = s.tuple(e.Packet, flow, a)
	dst.Orig = s.tuple(e.Orig, flow, a)
	dst.Reply = s.tuple(e.Reply, flow, a)
	dst.To = s.addr(e.To, a)
	dst.Virtual = s.addr(e.Virtual, a)
	dst.Forward = s.str(e.Forward, a)
	dst.NFHook = s.str(e.NFHook, a)
	dst.Reason = s.str(e.Reason, a)
	dst.CTStatus = s.strSlice(e.CTStatus, a)
	dst.By = s.str(e.By, a)
	// One-byte allocations share 16-byte tiny blocks.
	if e.ICMPType != nil {
		v := *e.ICMPType
		dst.ICMPType = &v
		*a.charged += 8
	}
	if e.ICMPCode != nil {
		v := *e.ICMPCode
		dst.ICMPCode = &v
		*a.charged += 8
	}
}

// Slab sizes: a chunk's last slabs are partly empty, at most one of each
// kind per chunk of 4096 flows.
const (
	eventSlab = 1 << 10
	tupleSlab = 1 << 10
	byteSlab  = 1 << 14
)

// newEvents returns n zeroed events from the event slab.
func (a *arena) newEvents(n int) []Event {
	if n > eventSlab/4 {
		*a.charged += int64(n) * sizeEvent
		return make([]Event, n)
	}
	if len(a.events)+n > cap(a.events) {
		a.events = make([]Event, 0, eventSlab)
		*a.charged += eventSlab * sizeEvent
	}
	start := len(a.events)
	a.events = a.events[:start+n]
	return a.events[start : start+n : start+n]
}

func (a *arena) tuple(t Tuple) *Tuple {
	if len(a.tuples) == cap(a.tuples) {
		a.tuples = make([]Tuple, 0, tupleSlab)
		*a.charged += tupleSlab * sizeTuple
	}
	a.tuples = append(a.tuples, t)
	return &a.tuples[len(a.tuples)-1]
}

func (a *arena) copyString(x string) string {
	if len(x) > byteSlab/16 {
		*a.charged += int64(len(x))
		return strings.Clone(x)
	}
	if len(a.bytes)+len(x) > cap(a.bytes) {
		a.bytes = make([]byte, 0, byteSlab)
		*a.charged += byteSlab
	}
	start := len(a.bytes)
	a.bytes = append(a.bytes, x...)
	return unsafe.String(&a.bytes[start], len(x))
}

// addr interns an address; once the table is full (a busy node's client
// addresses are unique), it copies the address into a's byte slab.
func (s *Store) addr(x string, a *arena) string {
	if x == "" {
		return ""
	}
	if y, ok := s.addrs[x]; ok {
		return y
	}
	if s.intern(len(s.addrs), mapEntry(sizeString, sizeString)) {
		y := s.tableArena.copyString(x)
		s.addrs[y] = y
		return y
	}
	return a.copyString(x)
}

// DefaultCaps suit a node. The mix's flows, joined and diagnosed as the
// live pipeline makes them, take about 90 bytes each by the store's
// estimate (nodebench's one-hour feed: 85 MiB for 1,000,000 flows, 88 MiB
// of heap), because flows through one Service and rule share a shape;
// the mix's flows stored whole (no shape to share, or the shape table
// full) take about 1,220 bytes of heap each. So the count cap binds first
// on a node whose traffic repeats itself, holding the last 200 seconds at
// 5,000 connections/s and nearly three hours at 100/s, and the memory cap
// of 256 MiB first on one whose flows are all unlike (about 200,000 of
// them).
var DefaultCaps = Caps{Flows: 1_000_000, Memory: 256 << 20}
