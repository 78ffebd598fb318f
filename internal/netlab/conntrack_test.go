package netlab

import (
	"net/netip"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
)

func TestParseConntrackLine(t *testing.T) {
	a := netip.MustParseAddr
	for _, c := range []struct {
		line string
		want ConntrackEntry
		ok   bool
	}{
		{"tcp      6 119 TIME_WAIT src=10.77.1.2 dst=10.96.77.7 sport=33000 dport=80 src=10.77.2.2 dst=10.77.1.2 sport=8080 dport=33000 [ASSURED] mark=0 use=1",
			ConntrackEntry{Orig: event.Tuple{Src: a("10.77.1.2"), Dst: a("10.96.77.7"), SrcPort: 33000, DstPort: 80, Proto: 6},
				Reply: event.Tuple{Src: a("10.77.2.2"), Dst: a("10.77.1.2"), SrcPort: 8080, DstPort: 33000, Proto: 6}, State: "TIME_WAIT", Assured: true}, true},
		{"udp      17 29 src=10.77.1.2 dst=10.96.77.7 sport=31000 dport=5353 [UNREPLIED] src=10.77.2.2 dst=10.77.1.2 sport=5353 dport=31000 mark=0 zone=3 use=1",
			ConntrackEntry{Orig: event.Tuple{Src: a("10.77.1.2"), Dst: a("10.96.77.7"), SrcPort: 31000, DstPort: 5353, Proto: 17},
				Reply: event.Tuple{Src: a("10.77.2.2"), Dst: a("10.77.1.2"), SrcPort: 5353, DstPort: 31000, Proto: 17}, Unreplied: true}, true},
		{"icmp     1 29 src=10.0.0.2 dst=10.0.0.1 type=8 code=0 id=7 src=10.0.0.1 dst=10.0.0.2 type=0 code=0 id=7 mark=0 use=1",
			ConntrackEntry{Orig: event.Tuple{Src: a("10.0.0.2"), Dst: a("10.0.0.1"), SrcPort: 7, DstPort: 8 << 8, Proto: 1},
				Reply: event.Tuple{Src: a("10.0.0.1"), Dst: a("10.0.0.2"), SrcPort: 7, Proto: 1}}, true},
		{"conntrack v1.4.7 (conntrack-tools): 2 flow entries have been shown.", ConntrackEntry{}, false},
		{"tcp 6 119 TIME_WAIT src=10.77.1.2 dst=nonsense sport=1 dport=2 src=10.77.2.2 dst=10.77.1.2 sport=3 dport=4", ConntrackEntry{}, false},
		{"tcp 6 119 SYN_SENT src=10.77.1.2 dst=10.96.77.7 sport=1 dport=2", ConntrackEntry{}, false},
	} {
		got, ok := ParseConntrackLine(c.line)
		if ok != c.ok || got != c.want {
			t.Errorf("%q:\n got %+v %v\nwant %+v %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func FuzzParseConntrackLine(f *testing.F) {
	f.Add("tcp 6 119 TIME_WAIT src=10.77.1.2 dst=10.96.77.7 sport=33000 dport=80 src=10.77.2.2 dst=10.77.1.2 sport=8080 dport=33000 [ASSURED] mark=0 use=1")
	f.Add("icmp 1 29 src=10.0.0.2 dst=10.0.0.1 type=8 code=0 id=7 src=10.0.0.1 dst=10.0.0.2 type=0 code=0 id=7")
	f.Fuzz(func(t *testing.T, line string) {
		if e, ok := ParseConntrackLine(line); ok && (!e.Orig.Valid() || !e.Reply.Valid()) {
			t.Fatalf("%q: parsed without both tuples: %+v", line, e)
		}
	})
}
