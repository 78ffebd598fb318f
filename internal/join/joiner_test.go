package join

import (
	"slices"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/event/eventtest"
)

// TestExpireByDeadline: a flow finishes once it has been quiet for the
// linger, counted from its last event, not its first; flows finish in the
// order of their deadlines.
func TestExpireByDeadline(t *testing.T) {
	var out []string
	j := &Joiner{Emit: func(f *Flow) { out = append(out, f.Record.Orig.Src) }}
	t0 := time.Unix(1700000000, 0)
	a := dnatTo("10.1.0.1:1000", "10.96.0.1:80", "10.0.0.1:80")
	b := dnatTo("10.1.0.2:1000", "10.96.0.1:80", "10.0.0.1:80")
	c := dnatTo("10.1.0.3:1000", "10.96.0.1:80", "10.0.0.1:80")
	j.Add(a, t0)
	j.Add(b, t0.Add(time.Second))
	j.Add(c, t0.Add(1100*time.Millisecond))
	// a's later event: a reject of the same connection's packet.
	j.Add(rejectEvent(event.ViaTracepoint, event.NFHookNone, "10.1.0.1:1000", "10.0.0.1:80"), t0.Add(1200*time.Millisecond))
	for _, step := range []struct {
		at   time.Duration
		want []string
	}{
		{1600 * time.Millisecond, nil},
		{2500 * time.Millisecond, []string{"10.1.0.2:1000"}},
		{2650 * time.Millisecond, []string{"10.1.0.2:1000", "10.1.0.3:1000"}},
		{2700 * time.Millisecond, []string{"10.1.0.2:1000", "10.1.0.3:1000", "10.1.0.1:1000"}},
	} {
		j.Expire(t0.Add(step.at))
		if !slices.Equal(out, step.want) {
			t.Fatalf("at +%s: finished %v, want %v", step.at, out, step.want)
		}
	}
	if j.Open() != 0 || j.due.len() != 0 {
		t.Errorf("%d open, %d queued", j.Open(), j.due.len())
	}
}

// TestTupleKeyDistinct: the joiner's map key tells every tuple apart,
// an IPv4 address from its IPv4-mapped IPv6 form included.
func TestTupleKeyDistinct(t *testing.T) {
	tuples := []event.Tuple{
		tuple(6, "10.0.0.1:1000", "10.96.0.1:80"),
		tuple(6, "10.96.0.1:80", "10.0.0.1:1000"),
		tuple(17, "10.0.0.1:1000", "10.96.0.1:80"),
		tuple(6, "10.0.0.1:1001", "10.96.0.1:80"),
		tuple(17, "[fd00::1]:53000", "[fd00:10:96::a]:53"),
		tuple(6, "[::ffff:10.0.0.1]:1000", "[::ffff:10.96.0.1]:80"),
		tuple(1, "10.0.0.1:0", "10.96.0.1:0"),
	}
	seen := map[ptuple]event.Tuple{}
	for _, tu := range tuples {
		if other, dup := seen[packTuple(tu)]; dup {
			t.Errorf("%+v and %+v share a key", tu, other)
		}
		seen[packTuple(tu)] = tu
		if back := packTuple(tu).tuple(); back != tu {
			t.Errorf("%+v packs and reads back as %+v", tu, back)
		}
	}
}

var (
	tuple       = eventtest.Tuple
	dnatTo      = eventtest.DNAT
	rejectEvent = eventtest.Reject
)
