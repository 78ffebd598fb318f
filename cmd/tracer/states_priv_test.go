package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// rulesChangedFixture is a trace TestRuleInForceAtDecision recorded, for
// the unit tests of replay (TRACER_WRITE_FIXTURE=1 writes it again).
const rulesChangedFixture = "testdata/rules-changed.ndjson"

// TestRuleInForceAtDecision: the DNAT rule of a VIP is rewritten while the
// tracer runs, between two connections. Each flow is attributed to the
// rule that was in force when the kernel decided (the one whose target
// the server that accepted it confirms), live, although the first one's
// linger ends after the change, and on replay of the recording, which
// holds the change as a state line. Without that line, replay attributes
// the second connection to the rule of the header's snapshot.
func TestRuleInForceAtDecision(t *testing.T) {
	requirePriv(t)
	if k := os.Getenv("TRACER_VM_KERNEL"); k != "" {
		t.Skipf("which rules were in force is the pipeline's bookkeeping, the same on every kernel: the host tier runs it, not the %s VM", k)
	}
	ns := scratchNamespace(t, "trrif",
		[]string{"ip", "addr", "add", "10.78.0.1/32", "dev", "lo"},
		[]string{"ip", "addr", "add", "10.78.0.2/32", "dev", "lo"},
		[]string{"ip", "route", "add", "10.96.78.0/24", "dev", "lo"},
		[]string{"iptables", "-t", "nat", "-A", "OUTPUT", "-d", "10.96.78.1", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.78.0.1:8080"},
	)
	var accepted connLog[string]
	acceptLog(t, ns, &accepted, "10.78.0.1:8080", "10.78.0.2:8080")
	rule := func(backend string) string {
		return "-A OUTPUT -d 10.96.78.1/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination " + backend
	}

	rec := filepath.Join(t.TempDir(), "changed.ndjson")
	cmd, stdout, stderr := startTrace(t, selfTracer(t), ns, "-o", "json", "--record", rec, "--linger", "4s", "--filter", "port:80")

	dialVIP(t, ns)
	if _, err := ns.Run("iptables", "-t", "nat", "-R", "OUTPUT", "1", "-d", "10.96.78.1/32", "-p", "tcp", "-m", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.78.0.2:8080"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if b, _ := os.ReadFile(rec); bytes.Contains(b, []byte(`"type":"state"`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no state line in the recording 10 s after the rule changed")
		}
	}
	dialVIP(t, ns)
	time.Sleep(4500 * time.Millisecond) // past --linger
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("trace: %v; stderr %s", err, stderr.String())
	}

	check := func(how string, flows []trace.Flow) {
		t.Helper()
		n := 0
		for _, f := range flows {
			if f.Orig.Dst != "10.96.78.1:80" {
				continue
			}
			n++
			backend, ok := accepted.near(f.Orig.Src, f.Time)
			if !ok {
				t.Errorf("%s: flow from %s: no backend accepted that connection", how, f.Orig.Src)
				continue
			}
			if f.Rule == nil || f.Rule.Text != rule(backend) {
				t.Errorf("%s: flow from %s, accepted by %s: rule %+v, want %q", how, f.Orig.Src, backend, f.Rule, rule(backend))
			}
		}
		if n != 2 {
			t.Errorf("%s: %d flows to the VIP, want 2", how, n)
		}
	}
	_, live, sum := readNDJSON(t, stdout.Bytes())
	check("live", live)
	if sum.StateChanges == 0 {
		t.Errorf("summary %+v counts no state change", sum)
	}
	file, err := trace.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	nat := ""
	for _, c := range file.States {
		if text, ok := c.Snapshot.Rules["nat"]; ok {
			nat = text
		}
	}
	if !strings.Contains(nat, rule("10.78.0.2:8080")+"\n") || strings.Contains(nat, rule("10.78.0.1:8080")) {
		t.Errorf("the recorded state changes end with nat rules:\n%s", nat)
	}
	code, out, errs := runTracer("replay", "-o", "json", rec)
	if code != 0 {
		t.Fatalf("replay: exit %d: %s", code, errs)
	}
	_, replayed, _ := readNDJSON(t, []byte(out))
	check("replay", replayed)

	if os.Getenv("TRACER_WRITE_FIXTURE") != "" {
		b, err := os.ReadFile(rec)
		if err == nil {
			err = os.WriteFile(rulesChangedFixture, b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
