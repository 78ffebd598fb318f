package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNetnsDeletedWhileAttached: the namespace --netns observes is
// deleted (`ip netns del`, as a pod's teardown removes its path) while the
// tracer runs. It stops within seconds, exit 1, saying so, and its output
// and recording are complete: the flow seen before, and the summary.
func TestNetnsDeletedWhileAttached(t *testing.T) {
	requirePriv(t)
	skipInVM(t)
	ns := dnatNamespace(t, "trgone")
	rec := filepath.Join(t.TempDir(), "gone.ndjson")
	cmd, stdout, stderr := startTrace(t, selfTracer(t), ns, "-o", "json", "--record", rec, "--linger", "200ms", "--filter", "port:80")
	dialVIP(t, ns)
	time.Sleep(500 * time.Millisecond) // past --linger: the flow is written
	if out, err := exec.Command("ip", "netns", "del", ns.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	deleted := time.Now()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var exitErr error
	select {
	case exitErr = <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("still tracing 10 s after its namespace was deleted; stderr %s", stderr.String())
	}
	t.Logf("stopped %s after the namespace was deleted: %s", time.Since(deleted).Round(time.Millisecond), strings.TrimSpace(stderr.String()))
	if code := exitCodeOf(exitErr); code != 1 || !strings.Contains(stderr.String(), "namespace is gone: "+ns.Path()) {
		t.Errorf("exit %d, stderr %q: want 1 and the namespace named", code, stderr.String())
	}
	for name, data := range map[string][]byte{"stdout": stdout.Bytes(), rec: mustRead(t, rec)} {
		_, flows, sum := readNDJSON(t, data)
		if flowTo(flows, "10.96.78.1:80") == nil || sum.Flows != len(flows) {
			t.Errorf("%s: flows %d, summary %+v: want the connection made before, and the summary", name, len(flows), sum)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
