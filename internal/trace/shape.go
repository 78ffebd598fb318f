package trace

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"time"
	"unsafe"
)

// A busy node's flows repeat a few decisions: what differs from one
// connection to the next through the same Service and rule is the
// client's address and port and the times. The Store keeps each distinct
// rest once, as a shape, and per flow only what is its own: the shape,
// the client's endpoints as bytes, the times and the client's pod. A
// shape holds placeholders where its flows name their client, in tuples
// and in the explanation, and reading a flow puts the client back.

// Placeholders for the client's endpoints: slotClient for the original
// source, slotSeen for the reply's destination when it differs (the
// client as the server saw it, after a SNAT). Neither can be an endpoint,
// and a flow whose text holds either byte is stored whole.
const (
	slotClient = "\x00"
	slotSeen   = "\x01"
)

// shapeLimit bounds the shape table: past it, new flows are stored whole.
// A shape costs its key and its flow, a few kilobytes with a long
// explanation.
const shapeLimit = 1 << 14

// shape is what flows share. A flow stored whole (own) has a shape of
// its own holding the flow exactly as it came.
type shape struct {
	flow Flow
	own  bool
	// loc is the location of the flows' times.
	loc *time.Location
	// text: the explanation holds placeholders.
	text bool
	// keys are the address keys of the shape's addresses; a flow's add
	// its client's (StoredFlow.Keys).
	keys AddrKeys
}

// storedFlow is one flow as the Store keeps it.
type storedFlow struct {
	shape  *shape
	srcPod *PodRef
	// unix is the flow's time in Unix nanoseconds; times is where its
	// events' times, as offsets from it, start in the chunk's times.
	unix         int64
	times        int32
	client, seen endpoint
}

// endpoint is an "IP:PORT", "[IPv6]:PORT" or bare "IP" in 19 bytes.
type endpoint struct {
	ip   [16]byte
	port uint16
	form uint8
}

const (
	formIPv4 uint8 = 1 + iota
	formIPv6
	formIPv4Bare
	formIPv6Bare
)

// parseEndpoint reads s, and reports whether printing it again gives s:
// only then is the endpoint stored as bytes.
func parseEndpoint(s string) (endpoint, bool) {
	ap := ParseEndpoint(s)
	a := ap.Addr()
	if !a.IsValid() || a.Zone() != "" {
		return endpoint{}, false
	}
	e := endpoint{ip: a.As16(), port: ap.Port(), form: formIPv6}
	if a.Is4() {
		e.form = formIPv4
	}
	if strings.IndexByte(s, ':') < 0 || a.Is6() && !strings.HasPrefix(s, "[") {
		e.form += formIPv4Bare - formIPv4
	}
	var buf [64]byte
	return e, string(e.appendTo(buf[:0])) == s
}

func (e *endpoint) addr() netip.Addr {
	if e.form == formIPv4 || e.form == formIPv4Bare {
		return netip.AddrFrom4([4]byte(e.ip[12:]))
	}
	return netip.AddrFrom16(e.ip)
}

func (e *endpoint) appendTo(b []byte) []byte {
	if e.form == formIPv4Bare || e.form == formIPv6Bare {
		return e.addr().AppendTo(b)
	}
	return netip.AddrPortFrom(e.addr(), e.port).AppendTo(b)
}

// unixRange bounds the times UnixNano can hold (years 1678 to 2262), in
// seconds; a flow with a time outside it is stored whole.
const unixRange = 9_000_000_000

func inUnixRange(t time.Time) bool {
	u := t.Unix()
	return u > -unixRange && u < unixRange
}

// inLocation reports whether t is in range and in loc, a location as
// Store.location gives it.
func (s *Store) inLocation(t time.Time, loc *time.Location) bool {
	l := t.Location()
	return inUnixRange(t) && (l == loc || s.location(l) == loc)
}

// location is loc, or the first location the store saw with loc's fixed
// offset when loc is an unnamed fixed zone: time.Parse makes a new one
// for every time whose offset is not whole hours nor Local's, and flows
// that differ in that pointer alone (a replay from India) still share a
// shape. The two locations print every time alike.
func (s *Store) location(loc *time.Location) *time.Location {
	if loc == time.UTC || loc == time.Local || loc.String() != "" {
		return loc
	}
	name, off := time.Unix(0, 0).In(loc).Zone()
	if name2, off2 := time.Unix(unixRange, 0).In(loc).Zone(); name != "" || name2 != "" || off2 != off {
		return loc // not fixed
	}
	if c, ok := s.fixedZones[off]; ok {
		return c
	}
	if len(s.fixedZones) < 1<<10 {
		s.fixedZones[off] = loc
	}
	return loc
}

// shaped stores f in rec with a shared shape, and reports false when it
// cannot: then f is stored whole.
func (s *Store) shaped(f *Flow, rec *storedFlow, c *chunk) bool {
	client, ok := parseEndpoint(f.Orig.Src)
	if !ok {
		return false
	}
	var seen endpoint
	seenText := ""
	if f.Reply != nil && f.Reply.Dst != f.Orig.Src {
		if seen, ok = parseEndpoint(f.Reply.Dst); !ok {
			return false
		}
		seenText = f.Reply.Dst
	}
	loc := s.location(f.Time.Location())
	if !inUnixRange(f.Time) || strings.ContainsAny(f.Explanation, slotClient+slotSeen) {
		return false
	}
	for i := range f.Events {
		if !s.inLocation(f.Events[i].Time, loc) {
			return false
		}
	}
	sub := substitution{client: f.Orig.Src, seen: seenText}
	sub.explanation = sub.template(f.Explanation)
	key, ok := s.shapeKey(f, sub, loc)
	if !ok {
		return false
	}
	sh := s.shapes[string(key)]
	if sh == nil {
		cost := mapEntry(sizeString, sizePointer) + int64(len(key)) + sizeShape
		if len(s.shapes) >= shapeLimit || !s.intern(len(s.shapes), cost) {
			return false
		}
		sh = s.newShape(f, sub, loc)
		s.shapes[string(key)] = sh
	}
	unix := f.Time.UnixNano()
	*rec = storedFlow{shape: sh, srcPod: s.podRef(f.SrcPod, &s.flowArena), unix: unix,
		times: int32(len(c.times)), client: client, seen: seen}
	for i := range f.Events {
		c.times = append(c.times, f.Events[i].Time.UnixNano()-unix)
	}
	return true
}

// substitution is a flow's client endpoints, which its shape holds as
// placeholders, and its explanation as the shape holds it.
type substitution struct{ client, seen, explanation string }

func (u substitution) of(x string) string {
	switch {
	case x == "":
		return ""
	case x == u.client:
		return slotClient
	case u.seen != "" && x == u.seen:
		return slotSeen
	}
	return x
}

func (u substitution) tuple(t *Tuple) *Tuple {
	if t == nil {
		return nil
	}
	return &Tuple{Src: u.of(t.Src), Dst: u.of(t.Dst)}
}

// template is the explanation with the client's endpoints replaced by
// placeholders: first the client, then the other endpoint, so that
// putting them back in the reverse order gives the text again whatever
// one's text holds of the other.
func (u substitution) template(x string) string {
	x = strings.ReplaceAll(x, u.client, slotClient)
	if u.seen != "" {
		x = strings.ReplaceAll(x, u.seen, slotSeen)
	}
	return x
}

// newShape copies f, less what is each flow's own, into the shape table.
func (s *Store) newShape(f *Flow, u substitution, loc *time.Location) *shape {
	sub := *f
	sub.Time, sub.SrcPod = time.Time{}, nil
	sub.Orig = *u.tuple(&f.Orig)
	sub.Reply = u.tuple(f.Reply)
	sub.Explanation = u.explanation
	sub.Events = make([]Event, len(f.Events))
	for i := range f.Events {
		e := f.Events[i]
		e.Time = time.Time{}
		e.Packet, e.Orig, e.Reply = u.tuple(e.Packet), u.tuple(e.Orig), u.tuple(e.Reply)
		sub.Events[i] = e
	}
	sh := &shape{loc: loc, text: sub.Explanation != f.Explanation}
	s.copyFlow(&sh.flow, &sub, &s.tableArena)
	sh.keys = KeysOf(&sh.flow)
	return sh
}

// shapeKey writes what a flow shares with others of its shape into the
// store's key buffer: every field of the flow but its time and source
// pod, its events' times and its client's endpoints. It reports false
// when a string of the flow already holds a placeholder.
func (s *Store) shapeKey(f *Flow, u substitution, loc *time.Location) ([]byte, bool) {
	w := keyWriter{b: s.keyBuf[:0]}
	w.pointer(unsafe.Pointer(loc))
	w.str(f.Node)
	w.strs(f.Nodes)
	w.str(f.Proto)
	w.tuple(&f.Orig, u)
	w.tuple(f.Reply, u)
	w.str(f.Verdict)
	w.str(u.explanation)
	w.pointer(unsafe.Pointer(s.podRef(f.DstPod, &s.flowArena)))
	w.pointer(unsafe.Pointer(s.serviceRef(f.Service, &s.flowArena)))
	if f.Rule != nil {
		w.pointer(unsafe.Pointer(s.rule(f.Rule, &s.flowArena)))
	} else {
		w.pointer(nil)
	}
	if f.Conntrack != nil {
		w.pointer(unsafe.Pointer(s.conntrack(f.Conntrack, &s.flowArena)))
	} else {
		w.pointer(nil)
	}
	w.uint(uint64(len(f.Events)))
	for i := range f.Events {
		w.event(&f.Events[i], u)
	}
	s.keyBuf = w.b
	return w.b, !w.bad
}

// keyWriter writes a shape's key: each field in turn, strings with their
// length first, so that no two different flows write the same bytes.
type keyWriter struct {
	b   []byte
	bad bool
}

func (w *keyWriter) uint(x uint64) { w.b = binary.AppendUvarint(w.b, x) }

func (w *keyWriter) pointer(p unsafe.Pointer) { w.uint(uint64(uintptr(p))) }

func (w *keyWriter) flag(ok bool) {
	if ok {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}

func (w *keyWriter) str(x string) {
	w.uint(uint64(len(x)))
	w.b = append(w.b, x...)
}

func (w *keyWriter) strs(xs []string) {
	w.flag(xs != nil)
	w.uint(uint64(len(xs)))
	for _, x := range xs {
		w.str(x)
	}
}

// endpoint writes x as its shape holds it.
func (w *keyWriter) endpoint(x string, u substitution) {
	if x == slotClient || x == slotSeen {
		w.bad = true
	}
	w.str(u.of(x))
}

func (w *keyWriter) tuple(t *Tuple, u substitution) {
	w.flag(t != nil)
	if t != nil {
		w.endpoint(t.Src, u)
		w.endpoint(t.Dst, u)
	}
}

func (w *keyWriter) byteRef(p *uint8) {
	w.flag(p != nil)
	if p != nil {
		w.b = append(w.b, *p)
	}
}

func (w *keyWriter) event(e *Event, u substitution) {
	for _, x := range [...]string{e.Type, e.Node, e.Kind, e.Hook, e.Via, e.Proto, e.To, e.Virtual, e.Forward, e.NFHook, e.Reason, e.By} {
		w.str(x)
	}
	for _, x := range [...]uint64{uint64(e.Netns), uint64(e.CTMark), uint64(e.CTZone)} {
		w.uint(x)
	}
	w.tuple(e.Packet, u)
	w.tuple(e.Orig, u)
	w.tuple(e.Reply, u)
	w.byteRef(e.ICMPType)
	w.byteRef(e.ICMPCode)
	w.strs(e.CTStatus)
	w.flag(e.NoConntrack)
	w.flag(e.ConntrackTable != nil)
	if t := e.ConntrackTable; t != nil {
		for _, x := range [...]uint64{uint64(t.Entries), uint64(t.Max), t.Drops, t.InsertFailed} {
			w.uint(x)
		}
	}
}

// scratch is where reading a stored flow builds what is the flow's own.
// Each read overwrites what the one before built; At reads into a new
// scratch, so that its flow stays valid for good.
type scratch struct {
	buf    []byte
	tuples []Tuple
	events []Event
}

func (sc *scratch) reset() {
	sc.buf, sc.tuples, sc.events = sc.buf[:0], sc.tuples[:0], sc.events[:0]
}

func (sc *scratch) string(write func([]byte) []byte) string {
	start := len(sc.buf)
	sc.buf = write(sc.buf)
	if len(sc.buf) == start {
		return ""
	}
	return unsafe.String(&sc.buf[start], len(sc.buf)-start)
}

func (sc *scratch) tuple(t Tuple) *Tuple {
	if len(sc.tuples) == cap(sc.tuples) {
		sc.tuples = make([]Tuple, 0, max(4, 2*cap(sc.tuples)))
	}
	sc.tuples = append(sc.tuples, t)
	return &sc.tuples[len(sc.tuples)-1]
}

// filled is the shape's string x with the flow's endpoints put back.
type filled struct{ client, seen string }

func (f filled) of(x string) string {
	switch x {
	case slotClient:
		return f.client
	case slotSeen:
		return f.seen
	}
	return x
}

// tuple returns t with the endpoints put back: the flow's own tuples for
// the shape's, t itself when it has no placeholder.
func (f filled) tuple(t *Tuple, sh *shape, out *Flow, sc *scratch) *Tuple {
	switch {
	case t == nil:
		return nil
	case t == &sh.flow.Orig:
		return &out.Orig
	case t == sh.flow.Reply:
		return out.Reply
	case len(t.Src) != 1 && len(t.Dst) != 1:
		return t
	}
	return sc.tuple(Tuple{Src: f.of(t.Src), Dst: f.of(t.Dst)})
}

// unixTime is the time n in loc.
func unixTime(n int64, loc *time.Location) time.Time {
	t := time.Unix(0, n)
	if loc == time.UTC {
		return t.UTC()
	}
	return t.In(loc)
}

// load reads flow j of the chunk into out, building what is its own in
// sc. events says whether to build its events; text whether to build
// its explanation (else out.Explanation is the shape's).
func (c *chunk) load(j int, out *Flow, sc *scratch, events, text bool) {
	rec := &c.flows[j]
	sh := rec.shape
	*out = sh.flow
	if sh.own {
		return
	}
	sc.reset()
	client := sc.string(rec.client.appendTo)
	seen := client
	if rec.seen.form != 0 {
		seen = sc.string(rec.seen.appendTo)
	}
	fill := filled{client: client, seen: seen}
	out.Time = unixTime(rec.unix, sh.loc)
	out.SrcPod = rec.srcPod
	out.Orig = Tuple{Src: fill.of(sh.flow.Orig.Src), Dst: fill.of(sh.flow.Orig.Dst)}
	if r := sh.flow.Reply; r != nil {
		out.Reply = sc.tuple(Tuple{Src: fill.of(r.Src), Dst: fill.of(r.Dst)})
	}
	if events {
		c.loadEvents(rec, out, sc, fill)
	} else {
		out.Events = nil
	}
	if text && sh.text {
		out.Explanation = sc.string(func(b []byte) []byte { return fill.text(b, sh.flow.Explanation) })
	}
}

func (c *chunk) loadEvents(rec *storedFlow, out *Flow, sc *scratch, fill filled) {
	sh := rec.shape
	n := len(sh.flow.Events)
	if n == 0 {
		return
	}
	if cap(sc.events)-len(sc.events) < n {
		sc.events = make([]Event, 0, max(n, 2*cap(sc.events)))
	}
	evs := sc.events[len(sc.events) : len(sc.events)+n : len(sc.events)+n]
	sc.events = sc.events[:len(sc.events)+n]
	copy(evs, sh.flow.Events)
	for k := range evs {
		e := &evs[k]
		e.Time = unixTime(rec.unix+c.times[int(rec.times)+k], sh.loc)
		e.Packet = fill.tuple(e.Packet, sh, out, sc)
		e.Orig = fill.tuple(e.Orig, sh, out, sc)
		e.Reply = fill.tuple(e.Reply, sh, out, sc)
	}
	out.Events = evs
}

// text appends the template x with the endpoints put back.
func (f filled) text(b []byte, x string) []byte {
	for {
		i := strings.IndexAny(x, slotClient+slotSeen)
		if i < 0 {
			return append(b, x...)
		}
		b = append(b, x[:i]...)
		b = append(b, f.of(x[i:i+1])...)
		x = x[i+1:]
	}
}

// time is the stored flow's time.
func (rec *storedFlow) time() time.Time {
	if rec.shape.own {
		return rec.shape.flow.Time
	}
	return unixTime(rec.unix, rec.shape.loc)
}

// StoredFlow reads the flows of a StoreView one after another, for a scan
// over many: what it returns stays valid until its next Load, and it
// builds only what the caller asks for.
type StoredFlow struct {
	c        *chunk
	j        int
	flow     Flow
	head     bool // flow holds the flow but its events and own explanation
	full     bool // flow holds the whole flow
	refs     Flow
	keys     AddrKeys
	haveKeys bool
	sc       scratch
}

// Load makes sf read flow i of v (v.First() <= i < v.Len()).
func (v StoreView) Load(i int, sf *StoredFlow) {
	c, j := v.locate(i)
	sf.c, sf.j, sf.head, sf.full, sf.haveKeys = c, j, false, false, false
}

// Time returns the flow's time.
func (sf *StoredFlow) Time() time.Time { return sf.c.flows[sf.j].time() }

// Keys returns the flow's address keys: its shape's, and its client's.
// They hold the same addresses and ports as KeysOf the flow, so a filter
// term matches them alike; only their order may differ.
func (sf *StoredFlow) Keys() *AddrKeys {
	if !sf.haveKeys {
		rec := &sf.c.flows[sf.j]
		sf.keys = rec.shape.keys
		if !rec.shape.own {
			sf.keys.addEndpoint(&rec.client)
			if rec.seen.form != 0 {
				sf.keys.addEndpoint(&rec.seen)
			}
		}
		sf.haveKeys = true
	}
	return &sf.keys
}

// Head returns the flow without its events (nil), and with the
// explanation its shape shares (see SharedExplanation) in place of its
// own: what matching its fields needs.
func (sf *StoredFlow) Head() *Flow {
	if !sf.head && !sf.full {
		sf.c.load(sf.j, &sf.flow, &sf.sc, false, false)
		sf.head = true
	}
	return &sf.flow
}

// Refs returns the flow's fields that are strings or references shared
// with the Store (node, proto, verdict, pods, Service, rule, conntrack)
// without building anything: its tuples, time and events are not the
// flow's and must not be read, and its explanation is the shared one.
func (sf *StoredFlow) Refs() *Flow {
	if sf.head || sf.full {
		return &sf.flow
	}
	rec := &sf.c.flows[sf.j]
	if rec.shape.own {
		return &rec.shape.flow
	}
	sf.refs = rec.shape.flow
	sf.refs.SrcPod = rec.srcPod
	return &sf.refs
}

// Flow returns the whole flow.
func (sf *StoredFlow) Flow() *Flow {
	if !sf.full {
		sf.c.load(sf.j, &sf.flow, &sf.sc, true, true)
		sf.full, sf.head = true, false
	}
	return &sf.flow
}

// SharedExplanation returns the text that many stored flows share and
// that stays at one address while the store lives, so that a search of
// it may be remembered by address; exact says whether it is the flow's
// explanation. When not, it is a template whose every substring without
// a zero or one byte is a substring of the explanation too, and the
// explanation holds neither byte.
func (sf *StoredFlow) SharedExplanation() (text string, exact bool) {
	sh := sf.c.flows[sf.j].shape
	return sh.flow.Explanation, !sh.text
}

// AroundEndpoints calls has on each stretch of the explanation around a
// place where it names the flow's client, reaching n-1 bytes to either
// side; it reports whether has held for any. A substring of n bytes of
// the explanation is in one of these stretches or in the shared template
// (SharedExplanation), so the two searches together are a search of the
// explanation without building it.
func (sf *StoredFlow) AroundEndpoints(n int, has func(string) bool) bool {
	rec := &sf.c.flows[sf.j]
	sh := rec.shape
	if !sh.text {
		return false
	}
	f := sf.Head()
	fill := filled{client: f.Orig.Src, seen: f.Orig.Src}
	if rec.seen.form != 0 {
		fill.seen = f.Reply.Dst
	}
	x, n := sh.flow.Explanation, max(n, 1)
	for p := 0; ; {
		i := strings.IndexAny(x[p:], slotClient+slotSeen)
		if i < 0 {
			return false
		}
		i += p
		lo, hi := max(0, i-(n-1)), min(len(x), i+n)
		if has(sf.sc.string(func(b []byte) []byte { return fill.text(b, x[lo:hi]) })) {
			return true
		}
		p = i + 1
	}
}
