package join

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/conntrack"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// historyCT is a conntrack table holding, per original tuple, its entries
// newest first: its live entry (Lookup's), then the destroyed ones
// (Destroyed's), as conntrack.Tracker keeps them.
type historyCT map[event.Tuple][]conntrack.Entry

func (h historyCT) Lookup(tu event.Tuple) (conntrack.Entry, bool) {
	if es := h[tu]; len(es) > 0 {
		return es[0], true
	}
	return conntrack.Entry{}, false
}

func (h historyCT) Destroyed(tu event.Tuple) []conntrack.Entry {
	var out []conntrack.Entry
	for _, e := range h[tu] {
		if e.Destroyed {
			out = append(out, e)
		}
	}
	return out
}

// reusedPortNAT is a connection's DNAT and masquerade from a client
// source port to a VIP, sent to backend, as the netfilter tier reports
// them (the reply tuple after each translation).
func reusedPortNAT(netns uint32, backend string) []event.Event {
	orig := tuple(6, "10.0.1.2:40000", "10.97.0.8:80")
	be := netip.MustParseAddrPort(backend)
	masqAddr := netip.MustParseAddr("10.0.2.1")
	return []event.Event{
		{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Netns: netns, NFHook: 0, Orig: orig,
			Reply: tuple(6, backend, "10.0.1.2:40000"),
			To:    event.Range{MinAddr: be.Addr(), MaxAddr: be.Addr(), MinPort: be.Port(), MaxPort: be.Port()}},
		{Kind: event.KindSNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Netns: netns, NFHook: 4, Orig: orig,
			Reply: tuple(6, backend, "10.0.2.1:40000"),
			To:    event.Range{MinAddr: masqAddr, MaxAddr: masqAddr}},
	}
}

// asKprobeTier is evs as the kprobe tier reports them: read on entry to
// nf_nat_setup_info, before NAT sets the reply tuple, which the program
// leaves out (bpf/tracer.c, on_nat).
func asKprobeTier(evs []event.Event) []event.Event {
	out := slices.Clone(evs)
	for i := range out {
		out[i].Reply = event.Tuple{}
		out[i].Via = event.ViaKprobe
	}
	return out
}

func joinAll(j *Joiner, evs []event.Event) []*trace.Flow {
	var out []*trace.Flow
	j.Emit = func(f *Flow) { out = append(out, f.Record) }
	now := time.Unix(1700000000, 0)
	for i, e := range evs {
		at := now.Add(time.Duration(i) * time.Millisecond)
		e.Time = at
		j.Add(e, at)
	}
	j.Expire(now.Add(time.Hour))
	return out
}

// TestJoinReusedSourcePort: a client reusing its source port within the
// linger makes a new conntrack entry and new NAT decisions for the same
// tuple each time; each connection is its own flow with its own events
// and its own entry of the tuple's history (the destroyed one with its
// reply tuple), not the newest one's.
func TestJoinReusedSourcePort(t *testing.T) {
	backends := []string{"10.0.2.2:8080", "10.0.2.3:8080", "10.0.2.2:8080"}
	var netfilterTier, kprobeTier []event.Event
	for _, be := range backends {
		netfilterTier = append(netfilterTier, reusedPortNAT(7, be)...)
		kprobeTier = append(kprobeTier, asKprobeTier(reusedPortNAT(7, be))...)
	}
	orig := netfilterTier[0].Orig
	states := []string{"CLOSE", "TIME_WAIT", "ESTABLISHED"} // oldest first
	ct := historyCT{}
	for i := len(backends) - 1; i >= 0; i-- {
		ct[orig] = append(ct[orig], conntrack.Entry{Orig: orig, Reply: tuple(6, backends[i], "10.0.2.1:40000"),
			State: states[i], Destroyed: i < len(backends)-1, Status: conntrack.StatusSeenReply})
	}
	for tier, evs := range map[string][]event.Event{"netfilter": netfilterTier, "kprobe": kprobeTier} {
		flows := joinAll(&Joiner{CT: ct}, evs)
		if len(flows) != len(backends) {
			t.Fatalf("%s: %d flows for %d connections", tier, len(flows), len(backends))
		}
		for i, f := range flows {
			if len(f.Events) != 2 || f.Events[0].Kind != trace.KindDNAT || f.Events[1].Kind != trace.KindSNAT {
				t.Errorf("%s flow %d: events %+v, want its own dnat and snat", tier, i, f.Events)
				continue
			}
			if got := f.Events[0].To; got != backends[i] {
				t.Errorf("%s flow %d: DNAT to %s, want %s", tier, i, got, backends[i])
			}
			if f.Conntrack == nil || f.Conntrack.State != states[i] {
				t.Errorf("%s flow %d: conntrack %+v, want its own entry (%s)", tier, i, f.Conntrack, states[i])
			}
			if want := tuple(6, backends[i], "10.0.2.1:40000"); f.Reply == nil || *f.Reply != *trace.TupleOf(want) {
				t.Errorf("%s flow %d: reply %+v, want its own entry's %v", tier, i, f.Reply, want)
			}
		}
	}
}

// TestJoinReusedPortWithoutItsEntry: when the tuple's history no longer
// holds a replaced connection's entry (pruned, its reply differs, not yet
// destroyed), or holds several that disagree, the flow carries no
// conntrack entry rather than another connection's.
func TestJoinReusedPortWithoutItsEntry(t *testing.T) {
	evs := append(reusedPortNAT(7, "10.0.2.2:8080"), reusedPortNAT(7, "10.0.2.3:8080")...)
	orig := evs[0].Orig
	newest := conntrack.Entry{Orig: orig, Reply: tuple(6, "10.0.2.3:8080", "10.0.2.1:40000"), State: "ESTABLISHED"}
	other := conntrack.Entry{Orig: orig, Reply: tuple(6, "10.0.2.9:8080", "10.0.2.1:40000"), State: "CLOSE", Destroyed: true}
	mine := func(state string, destroyed bool) conntrack.Entry {
		return conntrack.Entry{Orig: orig, Reply: tuple(6, "10.0.2.2:8080", "10.0.2.1:40000"), State: state, Destroyed: destroyed}
	}
	for name, ct := range map[string]historyCT{
		"pruned":            {orig: {newest}},
		"another's entry":   {orig: {newest, other}},
		"no history there":  {},
		"not destroyed yet": {orig: {mine("TIME_WAIT", false), newest}},
		"two that disagree": {orig: {newest, mine("CLOSE", true), mine("TIME_WAIT", true)}},
	} {
		flows := joinAll(&Joiner{CT: ct}, evs)
		if len(flows) != 2 {
			t.Fatalf("%s: %d flows", name, len(flows))
		}
		first := flows[0]
		if first.Conntrack != nil {
			t.Errorf("%s: the replaced connection got entry %+v", name, first.Conntrack)
		}
		if first.Reply == nil || first.Reply.Src != "10.0.2.2:8080" {
			t.Errorf("%s: the replaced connection's reply %+v, want its own decisions' reply", name, first.Reply)
		}
	}
}

// Near misses: the same decision in two namespaces (a connection NATed on
// two observed nodes), and a DNAT followed by a reset and a drop of the
// same connection, are one flow each.
func TestJoinOneConnectionStaysOneFlow(t *testing.T) {
	twoNetns := append(reusedPortNAT(7, "10.0.2.2:8080")[:1], reusedPortNAT(8, "10.0.2.2:8080")[:1]...)
	rst := event.Event{Kind: event.KindReset, Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet: tuple(6, "10.0.2.2:8080", "10.0.2.1:40000")}
	drop := event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet: tuple(6, "10.0.1.2:40000", "10.97.0.8:80")}
	withReset := append(reusedPortNAT(7, "10.0.2.2:8080"), rst, drop)
	for name, evs := range map[string][]event.Event{"two namespaces": twoNetns, "dnat, snat, reset, drop": withReset} {
		flows := joinAll(&Joiner{}, evs)
		if len(flows) != 1 || len(flows[0].Events) != len(evs) {
			t.Errorf("%s: %d flows, want one holding all %d events", name, len(flows), len(evs))
		}
	}
}

// TestJoinNewerConnectionNotReadYet: the tracker already holds a newer
// connection of the tuple (its decisions still in the ring buffer when
// the flow closes); the flow takes its own, destroyed entry, not the
// newer one the tuple now leads to.
func TestJoinNewerConnectionNotReadYet(t *testing.T) {
	evs := reusedPortNAT(7, "10.0.2.2:8080")
	orig := evs[0].Orig
	newer := conntrack.Entry{Orig: orig, Reply: tuple(6, "10.0.2.3:8080", "10.0.2.1:40000"), State: "ESTABLISHED"}
	own := conntrack.Entry{Orig: orig, Reply: tuple(6, "10.0.2.2:8080", "10.0.2.1:40000"), State: "CLOSE", Destroyed: true}
	flows := joinAll(&Joiner{CT: historyCT{orig: {newer, own}}}, evs)
	if len(flows) != 1 || flows[0].Conntrack == nil || flows[0].Conntrack.State != "CLOSE" {
		t.Fatalf("flows %+v: want one with its own entry (CLOSE)", flows)
	}
}

// batchHistoryCT is historyCT read as conntrack.Tracker is in batches: its
// LookupAll reads the DESTROYs, so the flows finished after it take their
// history from AppendDestroyedRead; reads counts the reads of the socket that
// Destroyed would make.
type batchHistoryCT struct {
	historyCT
	lookupAlls, reads int
}

func (b *batchHistoryCT) LookupAll(tus []event.Tuple, entries []conntrack.Entry, found []bool) {
	b.lookupAlls++
	for i, tu := range tus {
		entries[i], found[i] = b.Lookup(tu)
	}
}

func (b *batchHistoryCT) Destroyed(tu event.Tuple) []conntrack.Entry {
	b.reads++
	return b.historyCT.Destroyed(tu)
}

func (b *batchHistoryCT) AppendDestroyedRead(dst []conntrack.Entry, tu event.Tuple) []conntrack.Entry {
	return append(dst, b.historyCT.Destroyed(tu)...)
}

// TestJoinReusedPortHistoryReadOncePerBatch: with a batch conntrack, the
// replaced connections (three of one tuple, and one whose newer entry is
// what the tuple now leads to) get the same entries as when each reads
// the DESTROYs itself, from the read LookupAll made: one LookupAll for
// the Expire that finishes them, and no other read.
func TestJoinReusedPortHistoryReadOncePerBatch(t *testing.T) {
	backends := []string{"10.0.2.2:8080", "10.0.2.3:8080", "10.0.2.2:8080"}
	var evs []event.Event
	for _, be := range backends {
		evs = append(evs, reusedPortNAT(7, be)...)
	}
	orig := evs[0].Orig
	states := []string{"CLOSE", "TIME_WAIT", "ESTABLISHED"}
	reused := historyCT{}
	for i := len(backends) - 1; i >= 0; i-- {
		reused[orig] = append(reused[orig], conntrack.Entry{Orig: orig, Reply: tuple(6, backends[i], "10.0.2.1:40000"),
			State: states[i], Destroyed: i < len(backends)-1, Status: conntrack.StatusSeenReply})
	}
	newer := conntrack.Entry{Orig: orig, Reply: tuple(6, "10.0.2.3:8080", "10.0.2.1:40000"), State: "ESTABLISHED"}
	own := conntrack.Entry{Orig: orig, Reply: tuple(6, "10.0.2.2:8080", "10.0.2.1:40000"), State: "CLOSE", Destroyed: true}
	for name, c := range map[string]struct {
		ct     historyCT
		evs    []event.Event
		states []string
	}{
		"reused three times":            {reused, evs, states},
		"newer connection not read yet": {historyCT{orig: {newer, own}}, reusedPortNAT(7, "10.0.2.2:8080"), []string{"CLOSE"}},
	} {
		alone := joinAll(&Joiner{CT: c.ct}, c.evs)
		b := &batchHistoryCT{historyCT: c.ct}
		batched := joinAll(&Joiner{CT: b}, c.evs)
		if len(batched) != len(c.states) || len(alone) != len(c.states) {
			t.Fatalf("%s: %d flows batched, %d alone, want %d", name, len(batched), len(alone), len(c.states))
		}
		for i, f := range batched {
			if f.Conntrack == nil || f.Conntrack.State != c.states[i] {
				t.Errorf("%s flow %d: conntrack %+v, want its own entry (%s)", name, i, f.Conntrack, c.states[i])
			}
			if !reflect.DeepEqual(f, alone[i]) {
				t.Errorf("%s flow %d batched:\n%+v\nalone:\n%+v", name, i, f, alone[i])
			}
		}
		if b.lookupAlls != 1 || b.reads != 0 {
			t.Errorf("%s: %d LookupAll and %d reads of the DESTROYs beside them, want 1 and 0", name, b.lookupAlls, b.reads)
		}
	}
}

// TestJoinRecycledState: a finished flow's state goes to the next new
// flow, and nothing leads to it by the finished flow's tuples: a later
// packet of the first connection, by its key or its reply, starts a flow
// of its own instead of joining the flow that took the state.
func TestJoinRecycledState(t *testing.T) {
	first := reusedPortNAT(7, "10.0.2.2:8080")[0]
	second := first
	second.Orig = tuple(6, "10.0.1.3:41000", "10.97.0.8:80")
	second.Reply = tuple(6, "10.0.2.3:8080", "10.0.1.3:41000")
	second.To = event.Range{MinAddr: netip.MustParseAddr("10.0.2.3"), MaxAddr: netip.MustParseAddr("10.0.2.3"), MinPort: 8080, MaxPort: 8080}
	late := event.Event{Kind: event.KindReset, Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet: first.Reply}

	var out []*trace.Flow
	j := &Joiner{Emit: func(f *Flow) { out = append(out, f.Record) }}
	now := time.Unix(1700000000, 0)
	add := func(ev event.Event, at time.Time) { ev.Time = at; j.Add(ev, at) }
	add(first, now)
	j.Expire(now.Add(2 * time.Second))
	if len(out) != 1 || len(j.free) != 1 {
		t.Fatalf("%d flows, %d free states after the first finished", len(out), len(j.free))
	}
	recycled := j.free[0]
	add(second, now.Add(3*time.Second))
	if len(j.free) != 0 || j.byTuple.get(packTuple(second.Orig)) != recycled {
		t.Fatalf("the second connection did not take the first's state")
	}
	// The taken state holds what a new one would: nothing of the first.
	fresh := &Joiner{}
	second.Time = now.Add(3 * time.Second)
	fresh.Add(second, second.Time)
	want := fresh.byTuple.get(packTuple(second.Orig))
	type view struct {
		key, reply                  ptuple
		old                         []ptuple
		rare, wide, replaced, moved bool
		events                      []event.Event
	}
	look := func(j *Joiner, p *pending) view {
		v := view{key: p.key(), reply: p.reply(), old: p.oldReplies(), rare: p.rare != nil, wide: p.wide, replaced: p.replaced, moved: p.moved}
		j.eachEvent(p, func(ev event.Event) bool { v.events = append(v.events, ev); return true })
		return v
	}
	if got, want := look(j, recycled), look(fresh, want); !reflect.DeepEqual(got, want) {
		t.Errorf("the recycled state:\n%+v\nwant, as a new one:\n%+v", got, want)
	}
	add(late, now.Add(3*time.Second))
	if p := j.byTuple.get(packTuple(first.Orig)); p == recycled {
		t.Errorf("the first connection's key leads to the state the second took")
	}
	j.Expire(now.Add(10 * time.Second))
	if len(out) != 3 {
		t.Fatalf("%d flows, want 3: the first, the second, and the first's late reset alone", len(out))
	}
	for i, f := range out[1:] {
		if len(f.Events) != 1 {
			t.Errorf("flow %d has %d events: %+v", i+2, len(f.Events), f.Events)
		}
	}
	if out[1].Orig.Src != "10.0.1.3:41000" || out[1].Events[0].Kind != trace.KindDNAT {
		t.Errorf("second flow %+v", out[1])
	}
}

// TestJoinReplacedFlowAloneStillDrainsDestroys: an Expire that finishes
// only a replaced connection (its deadline comes before its newer one's)
// asks a batch conntrack's LookupAll all the same, with no tuple: that
// call drains the DESTROYs the replaced flow's own entry is read from.
func TestJoinReplacedFlowAloneStillDrainsDestroys(t *testing.T) {
	first, second := reusedPortNAT(7, "10.0.2.2:8080"), reusedPortNAT(7, "10.0.2.3:8080")
	orig := first[0].Orig
	b := &batchHistoryCT{historyCT: historyCT{orig: {
		{Orig: orig, Reply: second[1].Reply, State: "ESTABLISHED"},
		{Orig: orig, Reply: first[1].Reply, State: "TIME_WAIT", Destroyed: true},
	}}}
	var out []*trace.Flow
	j := &Joiner{CT: b, Emit: func(f *Flow) { out = append(out, f.Record) }}
	t0 := time.Unix(1700000000, 0)
	for i, evs := range [][]event.Event{first, second} {
		at := t0.Add(time.Duration(i) * time.Second)
		for _, e := range evs {
			e.Time = at
			j.Add(e, at)
		}
	}
	j.Expire(t0.Add(1600 * time.Millisecond)) // the first's linger, not the second's
	if len(out) != 1 || b.lookupAlls != 1 {
		t.Fatalf("%d flows and %d LookupAll calls, want the replaced one and one call", len(out), b.lookupAlls)
	}
	if ct := out[0].Conntrack; ct == nil || ct.State != "TIME_WAIT" {
		t.Errorf("the replaced flow's conntrack %+v, want its own ended entry (TIME_WAIT)", ct)
	}
}
