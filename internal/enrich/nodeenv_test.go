package enrich

import (
	"net/netip"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// A trace written before snapshots carried the local routing table: every
// interface address (as a host address) and loopback count as local.
func TestNodeEnvOldTraceWithoutLocalRoutes(t *testing.T) {
	env, err := NewNodeEnv("node-1", &trace.Snapshot{Addresses: []trace.Address{{Interface: "eth0", Address: "172.18.0.2/16", Up: true}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]bool{"172.18.0.2": true, "172.18.0.3": false, "127.0.0.1": true, "::1": true} {
		if got, _ := env.IsLocal(netip.MustParseAddr(addr)); got != want {
			t.Errorf("IsLocal(%s) = %v, want %v", addr, got, want)
		}
	}
}
