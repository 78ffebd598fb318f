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
	if !slices.Equal(batch.batches, []int{256, 44}) || len(batch.lookups) != 0 {
		t.Errorf("LookupAll of %v tuples and %d single lookups, want [256 44] and none", batch.batches, len(batch.lookups))
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
