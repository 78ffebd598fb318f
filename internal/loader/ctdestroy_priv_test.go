package loader

import (
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netlab"
)

// conntrackTool lists ns's conntrack table with the conntrack tool.
func conntrackTool(t *testing.T, ns netlab.Namespace, args ...string) []netlab.ConntrackEntry {
	t.Helper()
	entries, err := ns.ConntrackList(args...)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// TestConntrackEndsReported: the kernel side reports the end of every
// conntrack entry a flow can ask for in the namespaces asked for, as
// ctnetlink's DESTROY would (tuples with the NAT'd reply, status, TCP
// state), however the entry ends: deleted (`conntrack -D`), timed out
// (conntrack's garbage collection), or replaced by a new connection of
// its tuple. A translated connection's entry is one, and so is that of a
// connection whose packet was answered with a reset; an untranslated
// connection nothing answered has no flow, and its end is not reported.
// Truth: the entries the conntrack tool listed before they ended. The
// client's namespace, whose table has entries too, was not asked for.
func TestConntrackEndsReported(t *testing.T) {
	requirePrivileged(t)
	for _, tier := range []tier{{"best", nil}, {"kprobe", []event.Via{event.ViaKprobe}}} {
		t.Run(tier.name, func(t *testing.T) { testConntrackEnds(t, tier.only) })
	}
}

func testConntrackEnds(t *testing.T, only []event.Via) {
	if slices.Equal(only, []event.Via{event.ViaKprobe}) && !hasKprobes() {
		t.Skip("no kprobes on this kernel")
	}
	tp := newTopology(t)
	run(t, tp.r, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", vip, "-p", "udp", "--dport", "5353",
		"-j", "DNAT", "--to-destination", sAddr+":5353")
	run(t, tp.r, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", vip, "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", sAddr+":8080")
	// A conntrack match makes C track its connections too.
	run(t, tp.c, "iptables", "-A", "OUTPUT", "-m", "conntrack", "--ctstate", "NEW,ESTABLISHED", "-j", "ACCEPT")
	serve(t, tp.s, sAddr+":8080")
	var sink net.PacketConn
	must(t, tp.s.Do(func() (err error) {
		sink, err = net.ListenPacket("udp", sAddr+":5353")
		return err
	}))
	t.Cleanup(func() { sink.Close() })

	ino, err := tp.r.Inode()
	must(t, err)
	cIno, err := tp.c.Inode()
	must(t, err)
	tr, err := Open(Config{Netns: []uint32{ino}, NetnsPaths: []string{tp.r.Path()}, ConntrackNetns: []uint32{ino}, Only: only})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	if !tr.Plan.Serves(event.HookCTDestroy) {
		fentry := slices.ContainsFunc(tr.Plan, func(h HookPlan) bool { return h.Via == event.ViaFentry })
		if !hasKprobes() && !fentry {
			t.Skip("neither fentry nor kprobes on this kernel: conntrack trackers keep ctnetlink's DESTROY events")
		}
		t.Fatalf("conntrack ends not reported on a kernel with fentry or kprobes: %s", tr.Plan.Reasons())
	}
	t.Logf("conntrack ends: %s", tr.Plan[slices.IndexFunc(tr.Plan, func(h HookPlan) bool { return h.Hook == event.HookCTDestroy })].Summary())
	c := collect(tr)

	// Deleted: UDP entries never answered, TCP entries in TIME_WAIT.
	for i := range 20 {
		must(t, sendUDPFrom(tp.c, 31000+i, vip+":5353"))
	}
	for range 3 {
		mustConnect(t, tp.c, vip+":80")
	}
	time.Sleep(200 * time.Millisecond) // the TCP closes reach TIME_WAIT
	want := conntrackTool(t, tp.r, "-d", vip)
	if len(want) != 23 {
		t.Fatalf("conntrack -L in R listed %d entries to %s, want 23: %+v", len(want), vip, want)
	}
	if len(conntrackTool(t, tp.c)) == 0 {
		t.Fatal("C's conntrack table is empty: the namespace not asked for has nothing to leave out")
	}
	run(t, tp.r, "conntrack", "-D", "-d", vip)
	run(t, tp.c, "conntrack", "-D")
	checkEnds(t, "deleted", c, ino, cIno, want)

	// Timed out: conntrack ends an expired entry when it next finds it,
	// here on a lookup of its tuple by a new packet (or first in its
	// garbage collection).
	must(t, tp.r.Sysctl("net.netfilter.nf_conntrack_udp_timeout", "1"))
	for i := range 10 {
		must(t, sendUDPFrom(tp.c, 32000+i, vip+":5353"))
	}
	want = conntrackTool(t, tp.r, "-d", vip)
	if len(want) != 10 {
		t.Fatalf("conntrack -L in R listed %d entries to %s, want 10", len(want), vip)
	}
	time.Sleep(2500 * time.Millisecond)
	for i := range 10 {
		must(t, sendUDPFrom(tp.c, 32000+i, vip+":5353"))
	}
	checkEnds(t, "timed out", c, ino, cIno, want)

	// Replaced: a new SYN on a tuple in TIME_WAIT ends the old entry. The
	// server closes first, so the client's port is free again at once.
	must(t, connectFrom(tp.c, 33000, vip+":80"))
	time.Sleep(200 * time.Millisecond)
	want = conntrackTool(t, tp.r, "-d", vip, "-p", "tcp")
	if len(want) != 1 || want[0].State != "TIME_WAIT" {
		t.Fatalf("conntrack -L in R: %+v, want one TCP entry in TIME_WAIT", want)
	}
	must(t, connectFrom(tp.c, 33000, vip+":80"))
	checkEnds(t, "replaced", c, ino, cIno, want)

	// Untranslated: a connection routed through R to S's own address,
	// which nothing answered with an error or reset, ends deleted, and its
	// end is not reported. Then one to a port of R where nothing listens:
	// R's stack resets it, and conntrack ends an entry whose only answer
	// was a reset at once (nf_conntrack_proto_tcp), too soon for the tool
	// to list it: its tuples are the client's port's.
	mustConnect(t, tp.c, sAddr+":8080")
	time.Sleep(200 * time.Millisecond)
	if routed := conntrackTool(t, tp.r, "-d", sAddr, "-p", "tcp"); len(routed) != 1 || routed[0].Reply.Src != netip.MustParseAddr(sAddr) {
		t.Fatalf("conntrack -L in R: %+v, want one untranslated TCP entry to %s", routed, sAddr)
	}
	run(t, tp.r, "conntrack", "-D", "-d", sAddr, "-p", "tcp")
	client := netip.MustParseAddrPort(mustBeRefused(t, tp.c, rAddrC+":81"))
	orig := event.Tuple{Src: client.Addr(), Dst: netip.MustParseAddr(rAddrC), SrcPort: client.Port(), DstPort: 81, Proto: 6}
	want = []netlab.ConntrackEntry{{Orig: orig, Reply: orig.Reverse(), State: "CLOSE", Unreplied: true}}
	checkEndsTo(t, "reset, untranslated", c, ino, cIno, endsTo{dst: rAddrC, notTo: sAddr, resetEnded: true}, want)
}

// endsTo says which ends a check takes: those of entries to dst; an end
// of an entry to notTo is one that should not have been reported.
// resetEnded: the entries ended at the reset that answered them, whose
// SEEN_REPLY conntrack sets on that reset after it deleted the entry: an
// end read at the delete (nf_ct_delete) has it unset, one read at the
// free (destroy_conntrack, 5.10) set.
type endsTo struct {
	dst, notTo string
	resetEnded bool
}

// connectFrom connects from port in ns and reads until the server, which
// writes a byte and closes, has closed.
func connectFrom(ns netlab.Namespace, port int, addr string) error {
	return ns.Do(func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{Port: port}, Timeout: 2 * time.Second}
		conn, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		_, err = io.ReadAll(conn)
		return err
	})
}

// checkEnds takes the ends reported within 15 s (the garbage collector
// runs every few seconds) and holds them to want: each entry's end exactly
// once, with its tuples, its answer and its state, and none from the
// namespace not asked for.
func checkEnds(t *testing.T, what string, c *collector, ino, notAsked uint32, want []netlab.ConntrackEntry) {
	t.Helper()
	checkEndsTo(t, what, c, ino, notAsked, endsTo{dst: vip}, want)
}

// checkEndsTo is checkEnds of the ends of entries to.dst; an entry to
// to.dst is translated (DST_NAT) when it is the VIP.
func checkEndsTo(t *testing.T, what string, c *collector, ino, notAsked uint32, to endsTo, want []netlab.ConntrackEntry) {
	t.Helper()
	dst := netip.MustParseAddr(to.dst)
	var notTo netip.Addr // invalid: no end is unwanted
	if to.notTo != "" {
		notTo = netip.MustParseAddr(to.notTo)
	}
	wantNAT := to.dst == vip
	var got []event.Event
	deadline := time.After(15 * time.Second)
	for len(got) < len(want) {
		select {
		case ev := <-c.events:
			if ev.Kind != event.KindCTDestroy {
				continue
			}
			if ev.Netns == notAsked {
				t.Errorf("%s: an end in the namespace not asked for: %+v", what, ev)
			}
			if ev.Netns == ino && notTo.IsValid() && ev.Orig.Dst == notTo {
				t.Errorf("%s: the end of an entry no flow asks for was reported: %+v", what, ev)
			}
			if ev.Netns == ino && ev.Orig.Dst == dst {
				got = append(got, ev)
			}
		case err := <-c.errs:
			t.Errorf("%s: ring buffer record did not decode: %v", what, err)
		case <-deadline:
			t.Fatalf("%s: %d ends reported in 15 s, %d entries ended", what, len(got), len(want))
		}
	}
	c.drain()
	for _, w := range want {
		i := slices.IndexFunc(got, func(ev event.Event) bool { return ev.Orig == w.Orig })
		if i < 0 {
			t.Errorf("%s: no end reported for %+v", what, w.Orig)
			continue
		}
		ev := got[i]
		got = slices.Delete(got, i, i+1)
		if ev.Hook != event.HookCTDestroy || ev.Reply != w.Reply {
			t.Errorf("%s: end of %+v: hook %s, reply %+v, want reply %+v", what, w.Orig, ev.Hook, ev.Reply, w.Reply)
		}
		if replied := ev.CTStatus&(1<<1) != 0; replied == w.Unreplied && !to.resetEnded {
			t.Errorf("%s: end of %+v: SEEN_REPLY %v, the tool said unreplied %v", what, w.Orig, replied, w.Unreplied)
		}
		if translated := ev.CTStatus&(1<<5) != 0; translated != wantNAT {
			t.Errorf("%s: end of %+v: status %#x, DST_NAT %v, want %v", what, w.Orig, ev.CTStatus, translated, wantNAT)
		}
		if w.State != "" && (!ev.HasReason || tcpStates[ev.Reason] != w.State) {
			t.Errorf("%s: end of %+v: TCP state %d, the tool said %s", what, w.Orig, ev.Reason, w.State)
		}
	}
	if len(got) > 0 {
		t.Errorf("%s: ends of entries that did not end: %+v", what, got)
	}
}

// tcpStates are conntrack's TCP state numbers as the conntrack tool
// names them (enum tcp_conntrack).
var tcpStates = map[uint32]string{0: "NONE", 1: "SYN_SENT", 2: "SYN_RECV", 3: "ESTABLISHED", 4: "FIN_WAIT",
	5: "CLOSE_WAIT", 6: "LAST_ACK", 7: "TIME_WAIT", 8: "CLOSE", 9: "SYN_SENT2"}
