package diagnose

import (
	"fmt"

	"github.com/tracer-dev/tracer/internal/trace"
)

// answerUntranslated: the node's own TCP stack reset (or dropped) a packet
// of the flow's reply direction, addressed to the node's address as the
// translated connection had it. Conntrack maps such a packet back to the
// client while the connection's entry lives; that the node's stack got it
// means no entry was left to do so. After the connection ended (its entry
// replied and closed, or a new SYN from the same port replaced it) that is
// a straggler the connection never misses. Before, the backend's answers
// themselves were being refused.
func (d *diagnosis) answerUntranslated() (Result, bool) {
	ev := d.replyDirectionEvent()
	if ev == nil {
		return Result{}, false
	}
	what := "reset"
	if ev.Kind == trace.KindDrop {
		what = "dropped (" + orDefault(ev.Reason, "no reason given") + ")"
	}
	ct := d.f.Conntrack
	if ct != nil && ct.Replied && connectionEnded(ct.State) {
		r := d.ok()
		r.Explanation = sentences(r.Explanation,
			fmt.Sprintf("After the connection ended, a late packet from %s to %s reached the node with no conntrack entry left to translate it back to %s, and the node's TCP stack %s it: the connection itself was answered",
				ev.Packet.Src, ev.Packet.Dst, d.f.Orig.Src, what))
		return r, true
	}
	return Result{trace.VerdictReset, sentences(
		fmt.Sprintf("reset: the answers of %s to %s reach the node untranslated: a packet from %s to %s found no conntrack entry to translate it back to %s, and the node's TCP stack %s it (no socket of the node's own holds %s)",
			d.f.Orig.Src, d.target(), ev.Packet.Src, ev.Packet.Dst, d.f.Orig.Src, what, ev.Packet.Dst),
		d.conntrackEvidence(),
		"The connection's conntrack entry went away while it was in use: flushed (conntrack -F, a restart of whatever manages it), expired, or evicted from a full table",
	)}, true
}

// replyDirectionEvent is a stack reset or a drop of a packet that is the
// flow's reply tuple itself: from where the connection went, to the
// address it left with.
func (d *diagnosis) replyDirectionEvent() *trace.Event {
	if d.f.Reply == nil || d.f.Proto != "tcp" {
		return nil
	}
	for i := range d.f.Events {
		ev := &d.f.Events[i]
		if stackResetOrDrop(ev) && *ev.Packet == *d.f.Reply {
			return ev
		}
	}
	return nil
}

// stackResetOrDrop: a reset the TCP stack sent, or a drop, of a packet the
// event names.
func stackResetOrDrop(e *trace.Event) bool {
	stack := e.Kind == trace.KindReset && e.By == trace.ResetByStack
	return (stack || e.Kind == trace.KindDrop) && e.Packet != nil
}

// connectionEnded: a TCP conntrack state after a reset or both FINs, in
// which neither end sends the connection anything more but stragglers.
func connectionEnded(state string) bool {
	return state == "CLOSE" || state == "TIME_WAIT"
}
