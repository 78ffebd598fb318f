package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/meta"
)

// thisNode is the node the tracer under test runs on.
const thisNode = "node-a"

// newIndex starts the tracer's metadata index the way the tracer does,
// from a kubeconfig authenticating as its ServiceAccount. The informers
// stop when the test ends.
func newIndex(t testing.TB, kubeconfig string, syncTimeout time.Duration) meta.Index {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	idx, err := meta.NewFromKubeconfig(ctx, kubeconfig, thisNode, meta.Options{SyncTimeout: syncTimeout})
	if err != nil {
		t.Fatalf("start metadata index: %v", err)
	}
	return idx
}

// eventually polls cond every 100 ms until it returns "" or timeout passes,
// then fails with its last answer.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() string) time.Duration {
	t.Helper()
	d, last := poll(timeout, cond)
	if last != "" {
		t.Fatalf("%s: not true after %s: %s", what, timeout, last)
	}
	return d
}

// poll calls cond every 100 ms until it returns "" or timeout passes; it
// returns the time taken and cond's last answer.
func poll(timeout time.Duration, cond func() string) (time.Duration, string) {
	start := time.Now()
	for {
		last := cond()
		if last == "" || time.Since(start) > timeout {
			return time.Since(start), last
		}
		time.Sleep(100 * time.Millisecond)
	}
}
