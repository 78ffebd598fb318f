package trace

import (
	"encoding/json"
	"net/netip"
	"testing"
)

func TestListenerRank(t *testing.T) {
	for _, c := range []struct {
		addr   string
		v6only bool
		dst    string
		want   int
	}{
		{"10.0.0.1", false, "10.0.0.1", 3},
		{"0.0.0.0", false, "10.0.0.1", 2},
		{"0.0.0.0", false, "fd00::1", 0},
		{"0.0.0.0", false, "::ffff:10.0.0.1", 2},
		{"::", false, "10.0.0.1", 1},
		{"::", true, "10.0.0.1", 0},
		{"::", false, "fd00::1", 2},
		{"::", true, "fd00::1", 2},
		{"fd00::1", true, "fd00::1", 3},
		{"::ffff:10.0.0.1", false, "10.0.0.1", 3},
		{"10.0.0.2", false, "10.0.0.1", 0},
		{"fd00::2", false, "fd00::1", 0},
	} {
		if got := ListenerRank(netip.MustParseAddr(c.addr), c.v6only, netip.MustParseAddr(c.dst)); got != c.want {
			t.Errorf("ListenerRank(%s, v6only=%v, %s) = %d, want %d", c.addr, c.v6only, c.dst, got, c.want)
		}
	}
}

// v6only is written only when set, so a dual-stack or IPv4 listener reads
// as before the field existed.
func TestListenerV6OnlyJSON(t *testing.T) {
	b, _ := json.Marshal(Listener{Proto: "tcp", Address: "[::]:80"})
	if string(b) != `{"proto":"tcp","address":"[::]:80"}` {
		t.Errorf("dual-stack listener: %s", b)
	}
	b, _ = json.Marshal(Listener{Proto: "tcp", Address: "[::]:80", V6Only: true})
	if string(b) != `{"proto":"tcp","address":"[::]:80","v6only":true}` {
		t.Errorf("V6ONLY listener: %s", b)
	}
}
