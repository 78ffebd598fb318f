package join_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/bench/mix"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Every flow of the benchmark mix (each of its shapes: NAT, IPVS, REJECT,
// reset, drop, IPv6, ICMP) hands the next stage typed values that say
// what its record's text says: the original and reply tuples, whether it
// has a reply, and its events, kind and time, in the record's order,
// which is time order.
func TestFlowTypedValuesAreItsRecord(t *testing.T) {
	evs, err := mix.Events(4*mix.Shapes, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	flows := 0
	j := &join.Joiner{Names: mix.Names{}, Emit: func(f *join.Flow) {
		flows++
		r := f.Record
		checkTuple(t, "orig", f.Orig, r.Orig)
		if f.HasReply != (r.Reply != nil) {
			t.Errorf("flow %v: has reply %v, record's reply %+v", f.Orig, f.HasReply, r.Reply)
		} else if f.HasReply {
			checkTuple(t, "reply", f.Reply, *r.Reply)
		}
		if len(f.Events) != len(r.Events) {
			t.Fatalf("flow %v: %d typed events, %d in the record", f.Orig, len(f.Events), len(r.Events))
		}
		for i, ev := range f.Events {
			if ev.Kind.String() != r.Events[i].Kind || !ev.Time.Equal(r.Events[i].Time) {
				t.Errorf("flow %v event %d: %s at %s, the record's %s at %s", f.Orig, i, ev.Kind, ev.Time, r.Events[i].Kind, r.Events[i].Time)
			}
			if i > 0 && ev.Time.Before(f.Events[i-1].Time) {
				t.Errorf("flow %v: event %d before event %d", f.Orig, i, i-1)
			}
		}
		if f.At.IsZero() {
			t.Errorf("flow %v: finished by an Expire at no time", f.Orig)
		}
	}}
	var last time.Time
	for _, ev := range evs {
		j.Add(ev, ev.Time)
		last = ev.Time
	}
	j.Expire(last.Add(time.Hour))
	if flows != 4*mix.Shapes {
		t.Errorf("%d flows, want %d", flows, 4*mix.Shapes)
	}
}

// checkTuple compares a typed tuple with its text: ICMP's without ports.
func checkTuple(t *testing.T, what string, typed event.Tuple, text trace.Tuple) {
	t.Helper()
	src, dst := typed.SrcAddrPort(), typed.DstAddrPort()
	if typed.Proto == 1 || typed.Proto == 58 {
		src, dst = netip.AddrPortFrom(src.Addr(), 0), netip.AddrPortFrom(dst.Addr(), 0)
	}
	if trace.ParseEndpoint(text.Src) != src || trace.ParseEndpoint(text.Dst) != dst {
		t.Errorf("%s %v, the record's %+v", what, typed, text)
	}
}
