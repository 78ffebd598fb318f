package enrich

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/conntrack"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// joinedAddrsChecked counts the flows whose joined addresses were checked
// against their text.
var joinedAddrsChecked atomic.Int64

// Every flow any test of this package joins is checked: the addresses the
// joiner made of its typed events must be what its trace text reads, and
// its events in time order. A difference panics inside the test that
// joined the flow.
func init() {
	testHookJoinedAddrs = func(f *trace.Flow, a flowAddrs) {
		joinedAddrsChecked.Add(1)
		if !slices.IsSortedFunc(f.Events, func(x, y trace.Event) int { return x.Time.Compare(y.Time) }) {
			panic(fmt.Sprintf("flow %s -> %s: events not in time order", f.Orig.Src, f.Orig.Dst))
		}
		if want := recordedAddrs(f); a != want {
			panic(fmt.Sprintf("flow %s -> %s (reply %+v):\njoined   %+v\nrecorded %+v", f.Orig.Src, f.Orig.Dst, f.Reply, a, want))
		}
	}
}

// TestJoinedAddrsAreRecorded joins one flow of each shape whose addresses
// are read differently (IPv4 and IPv6 NAT, SNAT after DNAT, ICMP without
// ports, a REJECT's packet after DNAT, a stack reset, IPVS, events out of
// order, a stray reply tied to its client's entry) and has the hook above
// check each.
func TestJoinedAddrsAreRecorded(t *testing.T) {
	v4 := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	nat := func(k event.Kind, orig, reply event.Tuple, to netip.AddrPort, at time.Duration) event.Event {
		return event.Event{Kind: k, Hook: event.HookNFNat, Via: event.ViaNetfilter, NFHook: event.NFHookNone, Packet: orig, Orig: orig, Reply: reply,
			To: event.Range{MinAddr: to.Addr(), MaxAddr: to.Addr(), MinPort: to.Port(), MaxPort: to.Port(), Flags: 3}, Time: time.Unix(1700000000, 0).Add(at)}
	}
	ext := tuple(6, "192.168.9.9:40000", "172.18.0.2:80")
	extReply := tuple(6, "10.244.1.6:80", "172.18.0.2:40000")
	v6 := event.Tuple{Src: v4("fd00:10:244:1::7"), Dst: v4("fd00:10:96::20"), SrcPort: 5555, DstPort: 80, Proto: 6}
	v6Reply := event.Tuple{Src: v4("fd00:10:244:2::9"), Dst: v4("fd00:10:244:1::7"), SrcPort: 8080, DstPort: 5555, Proto: 6}
	ping := event.Tuple{Src: v4("10.244.1.7"), Dst: v4("10.96.0.10"), SrcPort: 77, DstPort: 8 << 8, Proto: 1}
	stray := tuple(6, "10.244.2.7:3306", "10.244.1.7:41000")
	clientEntry := conntrack.Entry{Orig: tuple(6, "10.244.1.7:41000", "10.96.0.20:3306"), Reply: tuple(6, "10.244.9.9:3306", "10.244.1.7:41000")}

	flows := []struct {
		name string
		ct   join.Conntrack
		evs  []event.Event
	}{
		{"IPv4 DNAT", nil, []event.Event{nat(event.KindDNAT, tuple(6, "10.244.1.7:1234", "10.96.0.20:80"),
			tuple(6, "10.244.2.7:8080", "10.244.1.7:1234"), netip.MustParseAddrPort("10.244.2.7:8080"), 0)}},
		{"IPv6 DNAT", nil, []event.Event{nat(event.KindDNAT, v6, v6Reply, netip.AddrPortFrom(v6Reply.Src, 8080), 0)}},
		{"SNAT after DNAT, out of order", nil, []event.Event{
			nat(event.KindSNAT, ext, extReply, netip.MustParseAddrPort("172.18.0.2:0"), 2*time.Millisecond),
			nat(event.KindDNAT, ext, extReply, netip.MustParseAddrPort("10.244.1.6:80"), time.Millisecond)}},
		{"ping rejected", nil, []event.Event{{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
			Packet: ping, ICMPType: 3, ICMPCode: 3}}},
		{"REJECT of a DNAT'd packet", nil, []event.Event{
			nat(event.KindDNAT, tuple(6, "10.244.1.7:1235", "10.96.0.20:80"), tuple(6, "10.244.2.7:8080", "10.244.1.7:1235"),
				netip.MustParseAddrPort("10.244.2.7:8080"), 0),
			{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
				Packet: tuple(6, "10.244.1.7:1235", "10.244.2.7:8080"), ICMPType: 3, ICMPCode: 3, Time: time.Unix(1700000000, 0).Add(time.Millisecond)}}},
		{"stack reset", nil, []event.Event{{Kind: event.KindReset, Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
			Packet: tuple(6, "10.244.1.7:1236", "172.18.0.2:9000")}}},
		{"IPVS", nil, []event.Event{{Kind: event.KindIPVS, Hook: event.HookIPVSConnNew, Via: event.ViaKprobe, NFHook: event.NFHookNone,
			Orig: tuple(6, "10.244.1.7:1237", "10.96.0.30:443"), To: event.Range{MinAddr: v4("10.244.2.8"), MinPort: 8443}}}},
		{"stray reply", sourceCT{clientEntry}, []event.Event{{Kind: event.KindReset, Hook: event.HookTCPSendReset,
			Via: event.ViaTracepoint, NFHook: event.NFHookNone, Packet: stray}}},
	}
	snap := node2(t)
	env, err := NewNodeEnv("node-2", snap, NewSnapshotMetadata(snap.Pods, snap.Services))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range flows {
		t.Run(tc.name, func(t *testing.T) {
			before := joinedAddrsChecked.Load()
			var out []*trace.Flow
			j := NewStages(&join.Joiner{CT: tc.ct}, &Enricher{Env: func(time.Time) Env { return env }, Emit: func(f *trace.Flow) { out = append(out, f) }})
			now := time.Unix(1700000000, 0)
			for _, e := range tc.evs {
				if e.Time.IsZero() {
					e.Time = now
				}
				j.Add(e, now)
			}
			j.Flush()
			if len(out) != 1 {
				t.Fatalf("%d flows, want 1", len(out))
			}
			if n := joinedAddrsChecked.Load() - before; n != 1 {
				t.Fatalf("%d flows checked, want 1", n)
			}
			if tc.name == "stray reply" && out[0].Orig.Dst != "10.96.0.20:3306" {
				t.Errorf("stray reply not tied to its client's connection: orig %+v", out[0].Orig)
			}
		})
	}
}

// sourceCT is a conntrack table of live entries found only by their
// source (join.SourceIndex): the client connections a stray reply may
// answer.
type sourceCT []conntrack.Entry

func (c sourceCT) Lookup(event.Tuple) (conntrack.Entry, bool) { return conntrack.Entry{}, false }

func (c sourceCT) BySource(proto uint8, src netip.AddrPort) []conntrack.Entry {
	var out []conntrack.Entry
	for _, e := range c {
		if e.Orig.Proto == proto && e.Orig.SrcAddrPort() == src {
			out = append(out, e)
		}
	}
	return out
}
