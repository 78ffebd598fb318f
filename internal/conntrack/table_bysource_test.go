package conntrack

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
)

func TestBySource(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newTable(100, time.Minute)
	client := netip.MustParseAddrPort("172.18.0.99:40000")
	mk := func(dst string) Entry {
		d := netip.MustParseAddrPort(dst)
		o := event.Tuple{Src: client.Addr(), Dst: d.Addr(), SrcPort: client.Port(), DstPort: d.Port(), Proto: 6}
		return Entry{Orig: o, Reply: o.Reverse(), Seen: now}
	}
	tab.ended(mk("192.168.1.200:80"))
	other := mk("10.0.0.1:443")
	other.Orig.SrcPort, other.Reply.DstPort = 40001, 40001
	tab.ended(other)
	got := tab.bySource(6, client, now, 0)
	if len(got) != 1 || got[0].Orig.DstAddrPort().String() != "192.168.1.200:80" || !got[0].Destroyed {
		t.Fatalf("bySource: %+v", got)
	}
	if got := tab.bySource(17, client, now, 0); len(got) != 0 {
		t.Errorf("udp matched a tcp entry: %+v", got)
	}
	if got := tab.bySource(6, client, now.Add(30*time.Second), 0); len(got) != 1 {
		t.Errorf("a recently ended entry must still answer: %+v", got)
	}
	if got := tab.bySource(6, client, now.Add(2*time.Minute), 0); len(got) != 0 {
		t.Errorf("an entry past retention answered: %+v", got)
	}
}

// TestBySourceLimit: a limit walks only the newest ends: the client's end
// behind 10 newer ones is found with a limit of 11 or none, not 10.
func TestBySourceLimit(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newTable(100, time.Minute)
	end := func(src, dst string) Entry {
		s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
		o := event.Tuple{Src: s.Addr(), Dst: d.Addr(), SrcPort: s.Port(), DstPort: d.Port(), Proto: 17}
		return Entry{Orig: o, Reply: o.Reverse(), Seen: now}
	}
	client := netip.MustParseAddrPort("10.244.1.2:53000")
	tab.ended(end(client.String(), "10.96.0.10:53"))
	for i := range 10 {
		tab.ended(end(netip.AddrPortFrom(client.Addr(), uint16(1024+i)).String(), "10.96.0.10:53"))
	}
	for _, c := range []struct{ limit, want int }{{0, 1}, {11, 1}, {10, 0}, {1000, 1}} {
		if got := tab.bySource(17, client, now, c.limit); len(got) != c.want {
			t.Errorf("limit %d: %d entries, want %d", c.limit, len(got), c.want)
		}
	}
}

// BenchmarkBySourceRecent is a refused BySource's walk: the newest
// recentEnds of a table that holds twice as many, none from the source.
func BenchmarkBySourceRecent(b *testing.B) {
	now := time.Unix(1000, 0)
	tab := newTable(2*recentEnds, time.Minute)
	for i := range 2 * recentEnds {
		o := event.Tuple{Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddr("10.96.0.10"), SrcPort: uint16(1024 + i), DstPort: 53, Proto: 17}
		tab.ended(Entry{Orig: o, Reply: o.Reverse(), Seen: now})
	}
	src := netip.MustParseAddrPort("10.244.1.3:53000")
	for b.Loop() {
		tab.bySource(17, src, now, recentEnds)
	}
}
