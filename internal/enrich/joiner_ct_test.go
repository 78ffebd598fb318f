package enrich

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich/conntrack"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// fakeCT is a conntrack table that counts the lookups made of it.
type fakeCT struct {
	entries []conntrack.Entry
	lookups []event.Tuple
}

func (c *fakeCT) Lookup(tu event.Tuple) (conntrack.Entry, bool) {
	c.lookups = append(c.lookups, tu)
	for _, e := range c.entries {
		if e.Orig == tu || e.Reply == tu {
			return e, true
		}
	}
	return conntrack.Entry{}, false
}

func (c *fakeCT) BySource(proto uint8, src netip.AddrPort) []conntrack.Entry {
	var out []conntrack.Entry
	for _, e := range c.entries {
		if e.Orig.Proto == proto && e.Orig.SrcAddrPort() == src {
			out = append(out, e)
		}
	}
	return out
}

func joinWithCT(t *testing.T, ct *fakeCT, evs ...event.Event) []*trace.Flow {
	t.Helper()
	var out []*trace.Flow
	j := &Joiner{CT: ct, Emit: func(f *trace.Flow) { out = append(out, f) }}
	now := time.Unix(1700000000, 0)
	for _, e := range evs {
		e.Time = now
		j.Add(e, now)
	}
	j.Expire(now.Add(2 * time.Second))
	return out
}

// TestJoinNATDecisionLooksUpOnlyAtFinish: a DNAT event carries both tuples,
// so the join asks conntrack nothing when it arrives; the flow's entry is
// asked for once, when the flow is finished, and is the flow's reply and
// conntrack state.
func TestJoinNATDecisionLooksUpOnlyAtFinish(t *testing.T) {
	orig := tuple(6, "10.244.1.7:40000", "10.96.0.20:3306")
	// The event's reply is the one at the decision; conntrack's, later,
	// has the SNAT too.
	evReply := tuple(6, "10.244.1.5:3306", "10.244.1.7:40000")
	ctReply := tuple(6, "10.244.1.5:3306", "172.18.0.2:61000")
	ct := &fakeCT{entries: []conntrack.Entry{{Orig: orig, Reply: ctReply, State: "ESTABLISHED", Replied: true,
		Status: conntrack.StatusSeenReply | conntrack.StatusConfirmed | conntrack.StatusDstNAT}}}
	dnat := event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, Orig: orig, Reply: evReply}
	flows := joinWithCT(t, ct, dnat)
	if len(flows) != 1 {
		t.Fatalf("%d flows", len(flows))
	}
	f := flows[0]
	if len(ct.lookups) != 1 || ct.lookups[0] != orig {
		t.Errorf("conntrack lookups %v, want one of %v at finish", ct.lookups, orig)
	}
	if f.Reply == nil || *f.Reply != *trace.TupleOf(ctReply) || f.Conntrack == nil || f.Conntrack.State != "ESTABLISHED" || !f.Conntrack.Replied {
		t.Errorf("flow reply %+v conntrack %+v", f.Reply, f.Conntrack)
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
