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
	got := tab.bySource(6, client, now)
	if len(got) != 1 || got[0].Orig.DstAddrPort().String() != "192.168.1.200:80" || !got[0].Destroyed {
		t.Fatalf("bySource: %+v", got)
	}
	if got := tab.bySource(17, client, now); len(got) != 0 {
		t.Errorf("udp matched a tcp entry: %+v", got)
	}
	if got := tab.bySource(6, client, now.Add(30*time.Second)); len(got) != 1 {
		t.Errorf("a recently ended entry must still answer: %+v", got)
	}
	if got := tab.bySource(6, client, now.Add(2*time.Minute)); len(got) != 0 {
		t.Errorf("an entry past retention answered: %+v", got)
	}
}
