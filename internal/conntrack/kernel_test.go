package conntrack

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
)

// fakeKernelTable answers TCP tuples with an entry marked 1, and fails
// when fail is set.
type fakeKernelTable struct {
	asked  int
	fail   error
	closed bool
}

func (f *fakeKernelTable) Answers(tu event.Tuple) bool { return tu.Proto == 6 }

func (f *fakeKernelTable) LookupAll(tus []event.Tuple, entries []Entry, found []bool) error {
	if f.fail != nil {
		return f.fail
	}
	for i, tu := range tus {
		if tu.Proto != 6 {
			panic("asked for a tuple it does not answer")
		}
		f.asked++
		entries[i], found[i] = Entry{Orig: tu, Mark: 1}, tu.SrcPort%2 == 0
	}
	return nil
}

func (f *fakeKernelTable) Close() error { f.closed = true; return nil }

// netlinkFake answers every tuple with an entry marked 2.
func netlinkFake(asked *int) func([]event.Tuple, []Entry, []bool) error {
	return func(tus []event.Tuple, entries []Entry, found []bool) error {
		for i, tu := range tus {
			*asked++
			entries[i], found[i] = Entry{Orig: tu, Mark: 2}, true
		}
		return nil
	}
}

// TestKernelLookupsSplitTheBatch: the kernel table answers the tuples it
// takes and netlink the rest, each answer at its tuple's place; after the
// table fails, netlink answers that batch and every later one, and the
// failure is reported; after Close nothing reaches the table.
func TestKernelLookupsSplitTheBatch(t *testing.T) {
	table := &fakeKernelTable{}
	k, err := startKernelLookups("", table)
	if err != nil {
		t.Fatal(err)
	}
	var tus []event.Tuple
	for i := range 70 {
		proto := uint8(6)
		if i%3 == 0 {
			proto = 17
		}
		tus = append(tus, event.Tuple{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
			SrcPort: uint16(1000 + i), DstPort: 80, Proto: proto})
	}
	check := func(wantKernel bool) {
		t.Helper()
		entries, found := make([]Entry, len(tus)), make([]bool, len(tus))
		netlinkAsked := 0
		if err := k.getAll(tus, entries, found, netlinkFake(&netlinkAsked)); err != nil {
			t.Fatal(err)
		}
		byNetlink := 0
		for i, tu := range tus {
			kernel := wantKernel && tu.Proto == 6
			switch {
			case entries[i].Orig != tu:
				t.Fatalf("answer %d is %v's, asked %v", i, entries[i].Orig, tu)
			case kernel && (entries[i].Mark != 1 || found[i] != (tu.SrcPort%2 == 0)):
				t.Fatalf("%v: %+v found %v, want the kernel table's answer", tu, entries[i], found[i])
			case !kernel && (entries[i].Mark != 2 || !found[i]):
				t.Fatalf("%v: %+v found %v, want netlink's answer", tu, entries[i], found[i])
			case !kernel:
				byNetlink++
			}
		}
		if netlinkAsked != byNetlink {
			t.Fatalf("netlink asked %d tuples, answered %d", netlinkAsked, byNetlink)
		}
	}
	check(true)
	if n, want := k.answered.Load(), uint64(table.asked); n != want || n == 0 {
		t.Fatalf("answered counts %d, the table was asked %d", n, want)
	}
	table.fail = errors.New("bpf: run failed")
	check(false)
	if err := k.err(); err == nil {
		t.Fatal("the table failed, err says nothing")
	}
	table.fail = nil
	check(false) // off for good
	if err := k.Close(); err != nil || !table.closed {
		t.Fatalf("close: %v, table closed %v", err, table.closed)
	}
	check(false)
}
