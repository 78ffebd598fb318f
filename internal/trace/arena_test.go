package trace

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// TestArenaStrings: every string the arena made still reads what was
// written, after many more filled and replaced its blocks; a write that
// goes past what it promised, a long string and an empty one come out
// whole; and short strings share blocks.
func TestArenaStrings(t *testing.T) {
	var a Arena
	var got, want []string
	for i := range 5000 {
		ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}), uint16(i))
		switch i % 50 {
		case 7: // promises less than it writes
			got = append(got, a.Append(3, ap.AppendTo))
		case 9:
			got = append(got, a.String([]byte(strings.Repeat("x", 1000+i))))
			want = append(want, strings.Repeat("x", 1000+i))
			continue
		case 11:
			got = append(got, a.Append(10, func(b []byte) []byte { return b }))
			want = append(want, "")
			continue
		default:
			got = append(got, a.Append(maxEndpointText, ap.AppendTo))
		}
		want = append(want, ap.String())
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("string %d reads %q, want %q", i, got[i], want[i])
		}
	}
	if allocs := testing.AllocsPerRun(1000, func() { a.Append(maxEndpointText, netip.MustParseAddrPort("10.1.2.3:4567").AppendTo) }); allocs > 0.1 {
		t.Errorf("%.2f allocations per endpoint: the arena's blocks are not shared", allocs)
	}
}

// An arena that handed out a string never writes its bytes again, even
// when a write fails to fit: strings made before stay what they were.
func TestArenaNeverRewrites(t *testing.T) {
	a := Arena{BlockSize: 64}
	first := a.String([]byte("0123456789"))
	for i := range 100 {
		a.Append(4, func(b []byte) []byte { return append(b, fmt.Sprint(i*12345)...) })
		if first != "0123456789" {
			t.Fatalf("after %d more strings the first reads %q", i+1, first)
		}
	}
}
