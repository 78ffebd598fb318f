// Package livetest runs the live pipeline on a network namespace for the
// privileged end-to-end tests (internal/enrich's, tests/controlplane's) and
// collects the flows it reports, so each test checks them against the
// node's own truth without its own copy of the plumbing.
package livetest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Tier is an attachment tier the live tests run.
type Tier struct {
	Name string
	// Only restricts every hook to these methods; nil is the best each
	// hook has on this kernel.
	Only []event.Via
}

// Tiers are the best each hook has, and BPF netfilter links alone.
var Tiers = []Tier{{"best", nil}, {"netfilter", []event.Via{event.ViaNetfilter}}}

// SkipWithoutLinks skips the netfilter tier in the VM matrix: 5.10 and
// 6.1 have no BPF netfilter links (6.4+), and on 6.12 the host's run of
// the same test covers the tier's userspace while TestCapture checks the
// guest's own netfilter links, so the guests spend their TCG minutes on
// the kprobe and fentry tiers only the guests have.
func (tr Tier) SkipWithoutLinks(t testing.TB) {
	t.Helper()
	k := os.Getenv("TRACER_VM_KERNEL")
	switch {
	case tr.Only == nil || k == "":
	case k == "5.10" || k == "6.1":
		t.Skipf("the %s VM's kernel has no BPF netfilter links (6.4+): no netfilter tier to test", k)
	default:
		t.Skipf("the VM matrix leaves this test's netfilter tier to the host (TestCapture checks the %s guest's netfilter links)", k)
	}
}

// Linger is the live default: a dropped SYN's retransmission a second
// later still joins its flow.
const Linger = join.DefaultLinger

// Config is what the pipeline is started with besides the namespace.
type Config struct {
	NodeName string // default node-1
	Only     []event.Via
	// Metadata names pods and Services; MetadataSnapshot and
	// MetadataWarnings are an index's, as `tracer trace --kubeconfig`
	// passes them.
	Metadata         enrich.Metadata
	MetadataSnapshot func() ([]trace.Pod, []trace.Service)
	MetadataWarnings func() []string
}

// Tracing is the live pipeline observing one namespace.
type Tracing struct {
	P      *live.Pipeline
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	flows  []*trace.Flow
}

// Start attaches the live pipeline to node; the test's cleanup stops it.
func Start(t testing.TB, node netlab.Namespace, cfg Config) *Tracing {
	t.Helper()
	ino, err := node.Inode()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName == "" {
		cfg.NodeName = "node-1"
	}
	ctx, cancel := context.WithCancel(context.Background())
	p, err := live.Start(ctx, live.Config{
		Loader:    loader.Config{Netns: []uint32{ino}, NetnsPaths: []string{node.Path()}, Only: cfg.Only},
		NetnsPath: node.Path(), NodeName: cfg.NodeName, Linger: Linger,
		Metadata: cfg.Metadata, MetadataSnapshot: cfg.MetadataSnapshot, MetadataWarnings: cfg.MetadataWarnings,
	})
	if err != nil {
		cancel()
		t.Fatalf("start the live pipeline: %v", err)
	}
	tr := &Tracing{P: p, cancel: cancel, done: make(chan error, 1)}
	go func() {
		_, err := p.Run(ctx, live.Sink{Flow: func(f *trace.Flow) {
			tr.mu.Lock()
			tr.flows = append(tr.flows, f)
			tr.mu.Unlock()
		}})
		tr.done <- err
	}()
	t.Cleanup(func() { tr.Stop(t) })
	return tr
}

// Via is how hook h was attached.
func (tr *Tracing) Via(h event.Hook) event.Via {
	for _, hp := range tr.P.Plan() {
		if hp.Hook == h {
			return hp.Via
		}
	}
	return event.ViaNone
}

// Stop waits out the flows' linger, then detaches; safe to call twice.
func (tr *Tracing) Stop(t testing.TB) {
	if tr.cancel == nil {
		return
	}
	time.Sleep(Linger + time.Second)
	tr.cancel()
	tr.cancel = nil
	if err := <-tr.done; err != nil {
		t.Errorf("live pipeline: %v", err)
	}
	if err := tr.P.Close(); err != nil {
		t.Errorf("close the live pipeline: %v", err)
	}
}

// FlowsOf are the flows the tracer reported for the connection; proto ""
// is any protocol.
func (tr *Tracing) FlowsOf(proto, src, dst string) []*trace.Flow {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var got []*trace.Flow
	for _, f := range tr.flows {
		if (proto == "" || f.Proto == proto) && f.Orig.Src == src && f.Orig.Dst == dst {
			got = append(got, f)
		}
	}
	return got
}

// All is every flow reported so far.
func (tr *Tracing) All() []*trace.Flow {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]*trace.Flow(nil), tr.flows...)
}

// FlowOf is the one flow the tracer reported for the connection, or nil
// (an error) when it did not report exactly one.
func (tr *Tracing) FlowOf(t testing.TB, proto, src, dst string) *trace.Flow {
	t.Helper()
	got := tr.FlowsOf(proto, src, dst)
	if len(got) != 1 {
		t.Errorf("%d flows for %s %s → %s, want one; all flows: %s", len(got), proto, src, dst, FlowList(tr.All()))
		return nil
	}
	return got[0]
}

// EventList renders events for a failure message.
func EventList(evs []trace.Event) string {
	var s []string
	for _, e := range evs {
		s = append(s, fmt.Sprintf("%s via %s at %q reason %q", e.Kind, e.Via, e.NFHook, e.Reason))
	}
	return strings.Join(s, ", ")
}

// FlowList renders flows for a failure message.
func FlowList(fs []*trace.Flow) string {
	var s []string
	for _, f := range fs {
		s = append(s, fmt.Sprintf("%s %s→%s %s", f.Proto, f.Orig.Src, f.Orig.Dst, f.Verdict))
	}
	return strings.Join(s, "; ")
}
