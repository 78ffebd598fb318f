package main

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// TestExplainLiveNode: `tracer explain --netns` reads a namespace's rules
// as they are and predicts three connections, which are then made: the
// server that accepted a DNAT'd one, the refusal a REJECT sends and the
// reset of a port nothing listens on are the truth each prediction must
// have said.
func TestExplainLiveNode(t *testing.T) {
	requirePriv(t)
	if k := os.Getenv("TRACER_VM_KERNEL"); k != "" {
		t.Skipf("a walk of the rules is userspace, the same on every kernel: the host tier runs it, not the %s VM", k)
	}
	ns := scratchNamespace(t, "trexp",
		[]string{"ip", "addr", "add", "10.79.0.1/32", "dev", "lo"},
		[]string{"ip", "addr", "add", "10.79.0.2/32", "dev", "lo"},
		[]string{"ip", "route", "add", "10.96.79.0/24", "dev", "lo"},
		[]string{"iptables", "-t", "nat", "-A", "OUTPUT", "-d", "10.96.79.1", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.79.0.2:8080"},
		[]string{"iptables", "-A", "OUTPUT", "-d", "10.79.0.1", "-p", "tcp", "--dport", "9000", "-j", "REJECT"},
	)
	var accepted connLog[string]
	acceptLog(t, ns, &accepted, "10.79.0.1:8080", "10.79.0.2:8080")

	for _, c := range []struct {
		to, want string
		truth    string // what the connection then saw: who accepted it, or its refusal
	}{
		{"10.96.79.1:80", "ok", "10.79.0.2:8080"},
		{"10.79.0.1:9000", "rejected", "connection refused"},
		{"10.79.0.1:9001", "reset", "connection refused"},
	} {
		code, out, errs := runTracer("explain", "--netns", ns.Path(), "-o", "json", "10.79.0.1", c.to)
		if code != 0 {
			t.Fatalf("explain %s: exit %d: %s", c.to, code, errs)
		}
		var got explainJSON
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		saw := connectAndSee(t, ns, c.to, &accepted)
		t.Logf("%s: predicted %s %q; the connection: %s", c.to, got.Verdict, got.Steps, saw)
		if saw != c.truth {
			t.Fatalf("%s: the connection saw %q, the test expects %q: the namespace is not what the test built", c.to, saw, c.truth)
		}
		if got.Verdict != c.want || len(got.Uncertain) > 0 {
			t.Errorf("%s: predicted %s (uncertain %q), but the connection saw %s", c.to, got.Verdict, got.Uncertain, saw)
		}
		if c.want == "ok" && (got.Flow.Reply == nil || got.Flow.Reply.Src != saw) {
			t.Errorf("%s: predicted it goes to %+v, the server at %s accepted it", c.to, got.Flow.Reply, saw)
		}
	}
}

// connectAndSee connects from 10.79.0.1 to addr and says who accepted it, or
// how it was refused.
func connectAndSee(t *testing.T, ns netlab.Namespace, addr string, accepted *connLog[string]) string {
	t.Helper()
	var local string
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("10.79.0.1")}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		local = c.LocalAddr().String()
		return c.Close()
	})
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "connection refused"
	}
	if err != nil {
		return err.Error()
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got, ok := accepted.near(local, time.Now()); ok {
			return got
		}
	}
	return "accepted by no listener of the test"
}
