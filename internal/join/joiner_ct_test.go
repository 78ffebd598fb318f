package join

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/conntrack"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// fakeCT is a conntrack table that counts the lookups made of it.
type fakeCT struct {
	entries []conntrack.Entry
	lookups []event.Tuple
	// bySource are the sources BySource was asked for.
	bySource []netip.AddrPort
}

func (c *fakeCT) Lookup(tu event.Tuple) (conntrack.Entry, bool) {
	c.lookups = append(c.lookups, tu)
	return c.find(tu)
}

func (c *fakeCT) find(tu event.Tuple) (conntrack.Entry, bool) {
	for _, e := range c.entries {
		if e.Orig == tu || e.Reply == tu {
			return e, true
		}
	}
	return conntrack.Entry{}, false
}

func (c *fakeCT) BySource(proto uint8, src netip.AddrPort) []conntrack.Entry {
	c.bySource = append(c.bySource, src)
	var out []conntrack.Entry
	for _, e := range c.entries {
		if e.Orig.Proto == proto && e.Orig.SrcAddrPort() == src {
			out = append(out, e)
		}
	}
	return out
}

func joinWithCT(t *testing.T, ct Conntrack, evs ...event.Event) []*trace.Flow {
	t.Helper()
	var out []*trace.Flow
	j := &Joiner{CT: ct, Emit: func(f *Flow) { out = append(out, f.Record) }}
	now := time.Unix(1700000000, 0)
	for _, e := range evs {
		e.Time = now
		j.Add(e, now)
	}
	j.Expire(now.Add(2 * time.Second))
	j.Expire(now.Add(2*time.Second + UnansweredLinger))
	return out
}

// TestJoinNATDecisionLooksUpOnlyAtFinish: a DNAT event that carries both
// tuples (the netfilter and fentry tiers read them after NAT set the
// reply) asks conntrack nothing when it arrives; the flow's entry is
// asked for once, when the flow is finished, and is the flow's reply and
// conntrack state. A kprobe-tier DNAT, read before NAT set the reply
// tuple, asks for it when it arrives too: a later answer in the reply
// direction must find its own connection's flow by it
// (TestPrivReusedSourcePorts on 5.10 fails without).
func TestJoinNATDecisionLooksUpOnlyAtFinish(t *testing.T) {
	orig := tuple(6, "10.244.1.7:40000", "10.96.0.20:3306")
	// The event's reply is the one at the decision; conntrack's, later,
	// has the SNAT too.
	evReply := tuple(6, "10.244.1.5:3306", "10.244.1.7:40000")
	ctReply := tuple(6, "10.244.1.5:3306", "172.18.0.2:61000")
	for _, c := range []struct {
		dnat    event.Event
		lookups int
	}{
		{event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Orig: orig, Reply: evReply}, 1},
		{event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaKprobe, Orig: orig}, 2},
	} {
		ct := &fakeCT{entries: []conntrack.Entry{{Orig: orig, Reply: ctReply, State: "ESTABLISHED", Replied: true,
			Status: conntrack.StatusSeenReply | conntrack.StatusConfirmed | conntrack.StatusDstNAT}}}
		flows := joinWithCT(t, ct, c.dnat)
		if len(flows) != 1 {
			t.Fatalf("%s: %d flows", c.dnat.Via, len(flows))
		}
		f := flows[0]
		if len(ct.lookups) != c.lookups || slices.ContainsFunc(ct.lookups, func(tu event.Tuple) bool { return tu != orig }) {
			t.Errorf("%s: conntrack lookups %v, want %d of %v", c.dnat.Via, ct.lookups, c.lookups, orig)
		}
		if f.Reply == nil || *f.Reply != *trace.TupleOf(ctReply) || f.Conntrack == nil || f.Conntrack.State != "ESTABLISHED" || !f.Conntrack.Replied {
			t.Errorf("%s: flow reply %+v conntrack %+v", c.dnat.Via, f.Reply, f.Conntrack)
		}
	}
}

// TestJoinKprobeDecisionThenReplyEvent: after a kprobe-tier DNAT, which
// has no reply tuple, a drop of the backend's answer (a reply-direction
// packet) joins the same flow by the reply tuple conntrack gave when the
// decision arrived, asking nothing more.
func TestJoinKprobeDecisionThenReplyEvent(t *testing.T) {
	orig := tuple(6, "10.244.1.7:40000", "10.96.0.20:3306")
	reply := tuple(6, "10.244.1.5:3306", "10.244.1.7:40000")
	ct := &fakeCT{entries: []conntrack.Entry{{Orig: orig, Reply: reply, State: "SYN_RECV",
		Status: conntrack.StatusSeenReply | conntrack.StatusConfirmed | conntrack.StatusDstNAT}}}
	flows := joinWithCT(t, ct,
		event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaKprobe, Orig: orig},
		event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Packet: reply})
	if len(flows) != 1 || len(flows[0].Events) != 2 {
		t.Fatalf("%d flows (%+v), want one with the dnat and the drop", len(flows), flows)
	}
	if f := flows[0]; f.Reply == nil || *f.Reply != *trace.TupleOf(reply) {
		t.Errorf("flow reply %+v, want conntrack's %v", f.Reply, reply)
	}
	if len(ct.lookups) != 2 || ct.lookups[0] != orig || ct.lookups[1] != orig {
		t.Errorf("conntrack lookups %v, want the decision's and the finish's, of %v", ct.lookups, orig)
	}
}

// TestJoinStrayReplyTiedToClient: a reset of a reply from a peer the
// client never addressed (the return-path incident) has no entry of its
// own; it is tied to the client connection from the endpoint it was sent
// to, and a packet event is still resolved through conntrack.
func TestJoinStrayReplyTiedToClient(t *testing.T) {
	// The client's own namespace: no NAT there.
	client := conntrack.Entry{Orig: tuple(6, "10.0.0.2:40000", "192.168.1.200:80"), Reply: tuple(6, "192.168.1.200:80", "10.0.0.2:40000")}
	ct := &fakeCT{entries: []conntrack.Entry{client}}
	stray := tuple(6, "10.244.2.7:8080", "10.0.0.2:40000")
	rst := event.Event{Kind: event.KindReset, Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, Packet: stray}
	flows := joinWithCT(t, ct, rst)
	if len(flows) != 1 {
		t.Fatalf("%d flows", len(flows))
	}
	f := flows[0]
	if f.Orig != *trace.TupleOf(client.Orig) || f.Reply == nil || *f.Reply != *trace.TupleOf(client.Reply) {
		t.Errorf("stray reply tied to %+v reply %+v, want the client connection %v", f.Orig, f.Reply, client.Orig)
	}
	if len(ct.lookups) == 0 || ct.lookups[0] != stray {
		t.Errorf("conntrack lookups %v: the packet's tuple was not resolved through conntrack", ct.lookups)
	}
}

// TestJoinAsksForStrayRepliesOnlyOfResetsAndDrops: BySource is a dump of
// the kernel's whole table, so only a flow that may be a stray reply (a
// reset or a drop, without a NAT decision) asks for one when its entry is
// gone. Connections whose entries went before they finished (a flood of
// one-datagram connections with a short timeout, a flushed or overrun
// table) ask for none.
func TestJoinAsksForStrayRepliesOnlyOfResetsAndDrops(t *testing.T) {
	ct := &fakeCT{}
	var evs []event.Event
	for i := range 50 {
		orig := tuple(17, fmt.Sprintf("10.78.1.10:%d", 2000+i), "10.97.78.8:53")
		reply := tuple(17, "10.78.2.2:5353", fmt.Sprintf("10.78.1.10:%d", 2000+i))
		evs = append(evs, event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Orig: orig, Reply: reply})
	}
	// A DNAT'd connection the backend then reset: a NAT decision still.
	natted := tuple(6, "10.78.1.10:3000", "10.97.78.8:80")
	evs = append(evs,
		event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Orig: natted, Reply: tuple(6, "10.78.2.2:8080", "10.78.1.10:3000")},
		event.Event{Kind: event.KindReset, Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, Packet: tuple(6, "10.78.2.2:8080", "10.78.1.10:3000")})
	strayRST := tuple(6, "10.244.2.7:8080", "10.0.0.2:40000")
	strayDrop := tuple(17, "10.244.2.7:53", "10.0.0.2:40001")
	unanswered := tuple(6, "10.0.0.2:40002", "10.244.2.7:8080") // a packet event that is neither
	evs = append(evs,
		event.Event{Kind: event.KindReset, Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, Packet: strayRST},
		event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Packet: strayDrop},
		event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, Packet: unanswered})
	flows := joinWithCT(t, ct, evs...)
	if len(flows) != 54 {
		t.Fatalf("%d flows, want 54", len(flows))
	}
	want := []netip.AddrPort{strayRST.DstAddrPort(), strayDrop.DstAddrPort()}
	if !reflect.DeepEqual(ct.bySource, want) {
		t.Errorf("BySource asked for %v, want only the stray reset's and drop's destinations %v", ct.bySource, want)
	}
}

// batchCT is fakeCT answering LookupAll too, recording each call's size.
type batchCT struct {
	*fakeCT
	batches []int
}

func (c *batchCT) LookupAll(tus []event.Tuple, entries []conntrack.Entry, found []bool) {
	c.batches = append(c.batches, len(tus))
	for i, tu := range tus {
		entries[i], found[i] = c.find(tu)
	}
}

// TestJoinFinishedFlowsLookedUpTogether: the 300 flows one Expire
// finishes are asked for in two LookupAll calls (256 and 44), no Lookup,
// and come out as they do, in the same order, when each is looked up
// alone.
func TestJoinFinishedFlowsLookedUpTogether(t *testing.T) {
	var entries []conntrack.Entry
	var evs []event.Event
	states := []string{"SYN_SENT", "ESTABLISHED", "TIME_WAIT"}
	for i := range 300 {
		orig := tuple(6, fmt.Sprintf("10.244.1.7:%d", 30000+i), "10.96.0.20:3306")
		reply := tuple(6, "10.244.1.5:3306", fmt.Sprintf("10.244.1.7:%d", 30000+i))
		evs = append(evs, event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Orig: orig, Reply: reply})
		if i%4 != 3 { // a quarter have no entry left
			entries = append(entries, conntrack.Entry{Orig: orig, Reply: reply, State: states[i%3], Replied: i%3 != 0, Status: conntrack.StatusConfirmed})
		}
	}
	alone := joinWithCT(t, &fakeCT{entries: entries}, evs...)
	batch := &batchCT{fakeCT: &fakeCT{entries: entries}}
	together := joinWithCT(t, batch, evs...)
	// The 75 SYN_SENT entries without a reply wait for their answer,
	// and are asked for again when they finish.
	if !slices.Equal(batch.batches, []int{256, 44, 75}) || len(batch.lookups) != 0 {
		t.Errorf("LookupAll of %v tuples and %d single lookups, want [256 44 75] and none", batch.batches, len(batch.lookups))
	}
	if len(alone) != 300 || len(together) != 300 {
		t.Fatalf("%d flows looked up alone, %d together; want 300", len(alone), len(together))
	}
	withState := 0
	for i := range alone {
		if !reflect.DeepEqual(alone[i], together[i]) {
			t.Fatalf("flow %d: looked up alone %+v, together %+v", i, alone[i], together[i])
		}
		if together[i].Conntrack != nil && together[i].Conntrack.State != "" {
			withState++
		}
	}
	if withState != 225 {
		t.Errorf("%d flows carry a conntrack state, want the 225 with an entry", withState)
	}
}

// progressCT is a conntrack table that hears the join's clock.
type progressCT struct {
	fakeCT
	told []time.Time
}

func (c *progressCT) Progress(now time.Time) { c.told = append(c.told, now) }

// The join tells its conntrack its clock after each Expire, once the
// flows due by then have asked for their entries: the tracker keeps the
// ended entries the join has not waited out (conntrack's Tracker.Progress).
func TestJoinTellsConntrackItsClock(t *testing.T) {
	ct := &progressCT{}
	toldBefore := -1 // how often the join had told its clock when the flow left
	j := &Joiner{Linger: time.Second, CT: ct, Emit: func(*Flow) { toldBefore = len(ct.told) }}
	t0 := time.Unix(1000, 0)
	j.Add(event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter,
		Orig: tuple(6, "10.244.1.7:40000", "10.96.0.20:3306"), Time: t0}, t0)
	j.Expire(t0.Add(500 * time.Millisecond))
	j.Expire(t0.Add(2 * time.Second))
	if want := []time.Time{t0.Add(500 * time.Millisecond), t0.Add(2 * time.Second)}; !slices.EqualFunc(ct.told, want, time.Time.Equal) {
		t.Errorf("told %v, want %v", ct.told, want)
	}
	if toldBefore != 1 {
		t.Errorf("the flow finishing at the second Expire left after %d clocks told, want 1: the clock comes after the flows it lets go", toldBefore)
	}
}

// A packet conntrack already translated (a DNAT'd SYN, rejected on its way
// to the endpoint with host-unreachable when the endpoint's address does
// not answer ARP, 3 s after the DNAT) carries the other direction's tuple
// reversed: its connection is found by that, open or not, and the flow it
// makes is the connection's, keyed by the address the client asked for.
func TestJoinFindsTheConnectionOfATranslatedPacket(t *testing.T) {
	orig := tuple(6, "10.0.0.1:55738", "10.96.1.2:80")
	reply := tuple(6, "10.245.1.2:8080", "10.0.0.1:55738")
	ct := &fakeCT{entries: []conntrack.Entry{{Orig: orig, Reply: reply}}}
	reject := event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, Packet: reply.Reverse()}
	dnat := dnatTo("10.0.0.1:55738", "10.96.1.2:80", "10.245.1.2:8080")

	t.Run("in the flow's linger", func(t *testing.T) {
		flows := joinWithCT(t, ct, dnat, reject)
		if len(flows) != 1 || len(flows[0].Events) != 2 {
			t.Fatalf("%d flows %+v, want the DNAT and the reject in one", len(flows), flows)
		}
	})
	t.Run("after the flow", func(t *testing.T) {
		flows := joinWithCT(t, ct, reject)
		if len(flows) != 1 {
			t.Fatalf("%d flows, want 1", len(flows))
		}
		f := flows[0]
		if f.Orig.Dst != "10.96.1.2:80" || f.Reply == nil || f.Reply.Src != "10.245.1.2:8080" {
			t.Errorf("the reject's flow is orig %+v reply %+v; want the connection's, to the Service address", f.Orig, f.Reply)
		}
	})
}

// TestJoinDropWithItsEntryAsksNothing: a drop whose packet had a
// conntrack entry carries the entry's tuples (the kfree_skb program reads
// them), so the join keys it by the connection without asking conntrack
// when it arrives: a new connection's entry, dropped before it was
// confirmed, is in no table (a drop storm of them made two failed lookups
// a packet). A translated packet's drop after its flow is done names the
// connection as the client made it. A drop without an entry still asks.
func TestJoinDropWithItsEntryAsksNothing(t *testing.T) {
	orig := tuple(6, "10.0.0.1:55738", "10.96.1.2:53")
	reply := tuple(6, "10.245.1.2:5353", "10.0.0.1:55738")
	drop := func(pkt event.Tuple, withEntry bool) event.Event {
		e := event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Packet: pkt}
		if withEntry {
			e.Orig, e.Reply = orig, reply
		}
		return e
	}
	for _, c := range []struct {
		name       string
		ev         event.Event
		atArrival  int // lookups before the finish's one
		wantOrig   string
		wantReply  string
		wantEvents int
	}{
		{"new connection", drop(orig, true), 0, "10.96.1.2:53", "10.245.1.2:5353", 1},
		{"translated packet", drop(reply.Reverse(), true), 0, "10.96.1.2:53", "10.245.1.2:5353", 1},
		{"reply direction", drop(reply, true), 0, "10.96.1.2:53", "10.245.1.2:5353", 1},
		{"no entry", drop(reply.Reverse(), false), 2, "10.245.1.2:5353", "", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ct := &fakeCT{}
			flows := joinWithCT(t, ct, c.ev)
			if len(flows) != 1 || len(flows[0].Events) != c.wantEvents {
				t.Fatalf("%d flows %+v", len(flows), flows)
			}
			f := flows[0]
			// The finish asks once for the flow's entry, by its key.
			if got := len(ct.lookups) - 1; got != c.atArrival {
				t.Errorf("lookups %v: %d when the drop arrived, want %d", ct.lookups, got, c.atArrival)
			}
			gotReply := ""
			if f.Reply != nil {
				gotReply = f.Reply.Src
			}
			if f.Orig.Dst != c.wantOrig || gotReply != c.wantReply {
				t.Errorf("flow orig %+v reply %+v, want to %s, answered from %q", f.Orig, f.Reply, c.wantOrig, c.wantReply)
			}
		})
	}
	t.Run("joins its open flow", func(t *testing.T) {
		ct := &fakeCT{}
		flows := joinWithCT(t, ct, dnatTo("10.0.0.1:55738", "10.96.1.2:53", "10.245.1.2:5353"), drop(reply.Reverse(), true))
		if len(flows) != 1 || len(flows[0].Events) != 2 {
			t.Fatalf("%d flows %+v, want the DNAT and the drop in one", len(flows), flows)
		}
	})
}

// TestJoinUnconfirmedEntryOfADrop: a connection whose packets were all
// dropped with a new entry conntrack never confirmed has that entry as its
// conntrack state, marked unconfirmed: none is in the table, and the
// drop's is the only one it had. A connection whose entry the table holds
// at the finish (a retransmission got through after the first packet was
// dropped) has the table's; a drop of a confirmed connection's packet
// whose entry has gone, or a drop without an entry, has none.
func TestJoinUnconfirmedEntryOfADrop(t *testing.T) {
	orig := tuple(17, "10.0.0.1:55738", "10.96.1.2:53")
	reply := tuple(17, "10.245.1.2:5353", "10.0.0.1:55738")
	drop := func(status uint32, mark uint32) event.Event {
		return event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint,
			Packet: orig, Orig: orig, Reply: reply, CTStatus: status, CTMark: mark}
	}
	confirmed := conntrack.Entry{Orig: orig, Reply: reply, Status: conntrack.StatusConfirmed | conntrack.StatusDstNAT | conntrack.StatusSeenReply, Replied: true}
	for _, c := range []struct {
		name  string
		table []conntrack.Entry
		evs   []event.Event
		want  *trace.Conntrack
	}{
		{"every packet dropped", nil, []event.Event{drop(conntrack.StatusDstNAT, 0), drop(conntrack.StatusDstNAT, 7)},
			&trace.Conntrack{Status: []string{"DST_NAT"}, Mark: 7, Unconfirmed: true}},
		{"a later packet got through", []conntrack.Entry{confirmed}, []event.Event{drop(conntrack.StatusDstNAT, 0)},
			&trace.Conntrack{Status: conntrack.FormatStatus(confirmed.Status), Replied: true}},
		{"confirmed connection's entry gone", nil, []event.Event{drop(conntrack.StatusConfirmed|conntrack.StatusDstNAT, 0)}, nil},
		{"no entry", nil, []event.Event{{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Packet: orig, NoCT: true}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			flows := joinWithCT(t, &fakeCT{entries: c.table}, c.evs...)
			if len(flows) != 1 {
				t.Fatalf("%d flows %+v, want one", len(flows), flows)
			}
			if got := flows[0].Conntrack; !reflect.DeepEqual(got, c.want) {
				t.Errorf("conntrack %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestJoinRetransmissionAfterUnconfirmedDrop: a client's SYN is DNAT'd
// and dropped before conntrack confirms its entry; its retransmission
// gets a new entry and a new DNAT (to another endpoint, kube-proxy's
// random pick) and is dropped too. That is one connection, one flow. The
// same DNAT after a drop of a confirmed connection's packet, or with no
// drop between, is a new connection of a reused source port: two flows.
func TestJoinRetransmissionAfterUnconfirmedDrop(t *testing.T) {
	dnat := func(to string) event.Event { return dnatTo("10.0.0.1:55738", "10.96.1.2:80", to) }
	first, again := dnat("10.245.1.2:8080"), dnat("10.245.1.3:8080")
	drop := func(after event.Event, status uint32) event.Event {
		return event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint,
			Packet: after.Reply.Reverse(), Orig: after.Orig, Reply: after.Reply, CTStatus: status}
	}
	const unconfirmed, confirmed = conntrack.StatusDstNAT, conntrack.StatusDstNAT | conntrack.StatusConfirmed
	for _, c := range []struct {
		name      string
		evs       []event.Event
		wantFlows []int // events of each flow
	}{
		{"every packet dropped unconfirmed", []event.Event{first, drop(first, unconfirmed), again, drop(again, unconfirmed)}, []int{4}},
		{"the retransmission got through", []event.Event{first, drop(first, unconfirmed), again}, []int{3}},
		{"a confirmed connection's drop", []event.Event{first, drop(first, confirmed), again}, []int{2, 1}},
		{"no drop: a reused port", []event.Event{first, again}, []int{1, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out []*trace.Flow
			j := &Joiner{CT: &fakeCT{}, Emit: func(f *Flow) { out = append(out, f.Record) }}
			t0 := time.Unix(1700000000, 0)
			for i, ev := range c.evs {
				ev.Time = t0.Add(time.Duration(i) * 500 * time.Millisecond)
				j.Add(ev, ev.Time)
			}
			j.Flush()
			var got []int
			for _, f := range out {
				got = append(got, len(f.Events))
			}
			slices.Sort(got)
			slices.Reverse(got)
			if !slices.Equal(got, c.wantFlows) {
				t.Errorf("flows of %v events, want %v", got, c.wantFlows)
			}
		})
	}
}

// TestJoinHoldsAnUnansweredSYNForItsRejection: a SYN DNAT'd to an
// endpoint that does not answer ARP is rejected with host-unreachable 3 s
// later, when the kernel gives up on the neighbour. Its flow waits for
// that past its linger, so the connection is one flow: the DNAT, the
// rejection and the drop. A flow that has its answer, or an event besides
// NAT, or is a TCP one past its SYN, finishes at its linger; a DNS query
// nothing answers waits as the SYN does; Flush finishes a held one.
func TestJoinHoldsAnUnansweredSYNForItsRejection(t *testing.T) {
	orig := tuple(6, "10.0.0.1:55738", "10.96.1.2:80")
	reply := tuple(6, "10.245.1.2:8080", "10.0.0.1:55738")
	synSent := conntrack.Entry{Orig: orig, Reply: reply, State: "SYN_SENT", Status: conntrack.StatusConfirmed | conntrack.StatusDstNAT}
	dnat := dnatTo("10.0.0.1:55738", "10.96.1.2:80", "10.245.1.2:8080")
	reject := event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, Packet: reply.Reverse(), ICMPType: 3, ICMPCode: 1}
	drop := event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Packet: reply.Reverse(), Reason: reasonNeighFailed, HasReason: true}
	ruleDrop := event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Packet: reply.Reverse(), Reason: reasonNeighFailed + 1, HasReason: true}
	t0 := time.Unix(1700000000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	run := func(ct Conntrack, steps func(j *Joiner)) []*trace.Flow {
		var out []*trace.Flow
		j := &Joiner{CT: ct, Names: neighFailedNamer{}, Emit: func(f *Flow) { out = append(out, f.Record) }}
		steps(j)
		return out
	}
	add := func(j *Joiner, ev event.Event, d time.Duration) {
		ev.Time = at(d)
		j.Add(ev, at(d))
	}
	// leavesAt expires j just before d, when the flow must still be
	// open, and at d.
	leavesAt := func(t *testing.T, j *Joiner, d time.Duration) {
		t.Helper()
		j.Expire(at(d - 100*time.Millisecond))
		if j.Open() != 1 {
			t.Errorf("%d flows open %s before %s, want the held one", j.Open(), 100*time.Millisecond, d)
		}
		j.Expire(at(d))
	}
	kinds := func(f *trace.Flow) []string {
		var ks []string
		for _, e := range f.Events {
			ks = append(ks, e.Kind)
		}
		return ks
	}

	t.Run("rejected after 3 s, and a SYN sent meanwhile 3 s later", func(t *testing.T) {
		var atLinger, atRejectsLinger int
		flows := run(&fakeCT{entries: []conntrack.Entry{synSent}}, func(j *Joiner) {
			add(j, dnat, 0)
			j.Expire(at(1600 * time.Millisecond))
			atLinger = j.Open()
			add(j, reject, 3*time.Second)
			add(j, drop, 3*time.Second)
			j.Expire(at(4600 * time.Millisecond))
			atRejectsLinger = j.Open()
			add(j, reject, 6*time.Second)
			add(j, drop, 6*time.Second)
			leavesAt(t, j, 6*time.Second+UnansweredLinger)
		})
		if atLinger != 1 || atRejectsLinger != 1 {
			t.Errorf("%d and %d flows open at the DNAT's and the first rejection's linger, want the unanswered one", atLinger, atRejectsLinger)
		}
		if len(flows) != 1 || !slices.Equal(kinds(flows[0]), []string{"dnat", "reject", "drop", "reject", "drop"}) {
			t.Fatalf("%d flows %+v; want one: dnat, reject, drop, reject, drop", len(flows), flows)
		}
		if flows[0].Orig.Dst != "10.96.1.2:80" || flows[0].Conntrack == nil || flows[0].Conntrack.State != "SYN_SENT" {
			t.Errorf("flow orig %+v conntrack %+v; want the Service connection's, SYN_SENT", flows[0].Orig, flows[0].Conntrack)
		}
	})
	t.Run("never answered", func(t *testing.T) {
		flows := run(&fakeCT{entries: []conntrack.Entry{synSent}}, func(j *Joiner) {
			add(j, dnat, 0)
			leavesAt(t, j, UnansweredLinger)
		})
		if len(flows) != 1 {
			t.Fatalf("%d flows at UnansweredLinger, want the DNAT's", len(flows))
		}
	})
	finishesAtLinger := func(t *testing.T, ct Conntrack, evs ...event.Event) {
		t.Helper()
		flows := run(ct, func(j *Joiner) {
			for _, ev := range evs {
				add(j, ev, 0)
			}
			j.Expire(at(1600 * time.Millisecond))
		})
		if len(flows) != 1 {
			t.Errorf("%d flows at the linger, want 1", len(flows))
		}
	}
	t.Run("answered", func(t *testing.T) {
		replied := synSent
		replied.State, replied.Replied = "ESTABLISHED", true
		finishesAtLinger(t, &fakeCT{entries: []conntrack.Entry{replied}}, dnat)
	})
	t.Run("dropped for another reason", func(t *testing.T) {
		finishesAtLinger(t, &fakeCT{entries: []conntrack.Entry{synSent}}, dnat, ruleDrop)
	})
	t.Run("refused", func(t *testing.T) {
		portUnreachable := reject
		portUnreachable.ICMPCode = 3
		finishesAtLinger(t, &fakeCT{entries: []conntrack.Entry{synSent}}, dnat, portUnreachable)
	})
	t.Run("no entry", func(t *testing.T) {
		finishesAtLinger(t, &fakeCT{}, dnat)
	})
	t.Run("ipv6", func(t *testing.T) {
		orig6 := tuple(6, "[fd00:a::2]:34117", "[fd00:96::10]:80")
		reply6 := tuple(6, "[fd00:245::9]:8080", "[fd00:a::2]:34117")
		dnat6 := event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Orig: orig6, Reply: reply6}
		// 6.18 frees the packet without a reason.
		unreachable6 := event.Event{Kind: event.KindReject, Hook: event.HookICMP6Send, Via: event.ViaTracepoint, Packet: reply6.Reverse(), ICMPType: 1, ICMPCode: 3}
		free6 := event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Packet: reply6.Reverse(), Reason: 2, HasReason: true}
		entry := conntrack.Entry{Orig: orig6, Reply: reply6, State: "SYN_SENT"}
		flows := run(&fakeCT{entries: []conntrack.Entry{entry}}, func(j *Joiner) {
			add(j, dnat6, 0)
			add(j, unreachable6, 3*time.Second)
			add(j, free6, 3*time.Second)
			leavesAt(t, j, 3*time.Second+UnansweredLinger)
		})
		if len(flows) != 1 {
			t.Fatalf("%d flows, want one", len(flows))
		}
		// Another packet's free, without a reason, tells the story.
		other := free6
		other.Packet = tuple(6, "[fd00:a::2]:40000", "[fd00:245::9]:8080")
		finishesAtLinger(t, &fakeCT{entries: []conntrack.Entry{entry}}, dnat6, other)
	})
	t.Run("tcp past its SYN", func(t *testing.T) {
		closed := synSent
		closed.State = "CLOSE"
		finishesAtLinger(t, &fakeCT{entries: []conntrack.Entry{closed}}, dnat)
	})
	uOrig := tuple(17, "10.0.0.1:55738", "10.96.1.2:53")
	uReply := tuple(17, "10.245.1.2:53", "10.0.0.1:55738")
	query := event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Orig: uOrig, Reply: uReply}
	t.Run("udp ended", func(t *testing.T) {
		ended := conntrack.Entry{Orig: uOrig, Reply: uReply, Destroyed: true}
		finishesAtLinger(t, &fakeCT{entries: []conntrack.Entry{ended}}, query)
	})
	t.Run("udp answered", func(t *testing.T) {
		finishesAtLinger(t, &fakeCT{entries: []conntrack.Entry{{Orig: uOrig, Reply: uReply, Replied: true}}}, query)
	})
	t.Run("udp unanswered", func(t *testing.T) {
		unreachable := event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, Packet: uReply.Reverse(), ICMPType: 3, ICMPCode: 1}
		flows := run(&fakeCT{entries: []conntrack.Entry{{Orig: uOrig, Reply: uReply}}}, func(j *Joiner) {
			add(j, query, 0)
			j.Expire(at(1600 * time.Millisecond))
			add(j, unreachable, 3*time.Second)
			j.Expire(at(4600 * time.Millisecond))
			leavesAt(t, j, 3*time.Second+UnansweredLinger)
		})
		if len(flows) != 1 || !slices.Equal(kinds(flows[0]), []string{"dnat", "reject"}) {
			t.Fatalf("%d flows %+v; want one: dnat, reject", len(flows), flows)
		}
	})
	t.Run("flushed", func(t *testing.T) {
		flows := run(&fakeCT{entries: []conntrack.Entry{synSent}}, func(j *Joiner) {
			add(j, dnat, 0)
			j.Expire(at(1600 * time.Millisecond))
			j.Flush()
		})
		if len(flows) != 1 {
			t.Errorf("%d flows after Flush, want the held one", len(flows))
		}
	})
}

const reasonNeighFailed = 90

// neighFailedNamer names drop reason reasonNeighFailed as the kernel
// names the drop of a packet whose next hop never answered.
type neighFailedNamer struct{}

func (neighFailedNamer) DropReason(r uint32) string {
	if r == reasonNeighFailed {
		return "NEIGH_FAILED"
	}
	return fmt.Sprintf("reason-%d", r)
}

func (neighFailedNamer) ResetReason(r uint32) string { return fmt.Sprintf("reset-%d", r) }
