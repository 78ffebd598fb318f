package enrich_test

// Helpers of the privileged tests (TestPrivServiceNoEndpoint,
// TestPrivPortmapNFTHijack): namespaces, real connections from a known
// endpoint, and the live pipeline observing the node's namespace.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// The nodes of these tests share their addressing: a pod-like client "c"
// on the node's cni0, the node "n", and an uplink "u" on the node's eth0.
//
//	c 10.0.0.2 --- 10.0.0.1 n 192.168.0.2 --- 192.168.0.1 u
const (
	clientAddr = "10.0.0.2"
	nodeAddr   = "192.168.0.2"
)

// tiers are the attachment tiers the live tests run: the best each hook
// has on this kernel, and BPF netfilter links alone.
var tiers = []tier{{"best", nil}, {"netfilter", []event.Via{event.ViaNetfilter}}}

type tier struct {
	name string
	only []event.Via
}

// skipWithoutLinks skips the netfilter tier on the VM kernels known to
// lack BPF netfilter links, before any namespace is built.
func (tr tier) skipWithoutLinks(t *testing.T) {
	t.Helper()
	if k := os.Getenv("TRACER_VM_KERNEL"); tr.only != nil && (k == "5.10" || k == "6.1") {
		t.Skipf("the %s VM's kernel has no BPF netfilter links (6.4+): no netfilter tier to test", k)
	}
}

// requirePrivileged skips without root or in -short mode, and fails when
// ip or one of the test's own tools is missing: a privileged run must not
// pass by testing nothing.
func requirePrivileged(t *testing.T, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged test: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged test: needs root (network namespaces, netfilter rules, CAP_BPF)")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("privileged test needs %s installed: %v", tool, err)
		}
	}
}

// newLab creates the named namespaces under prefix, removed when the test
// ends.
func newLab(t *testing.T, prefix string, names ...string) (*netlab.Lab, map[string]netlab.Namespace) {
	t.Helper()
	lab, err := netlab.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("remove namespaces: %v", err)
		}
	})
	nss := map[string]netlab.Namespace{}
	for _, name := range names {
		if nss[name], err = lab.Namespace(name); err != nil {
			t.Fatal(err)
		}
	}
	return lab, nss
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, ns netlab.Namespace, args ...string) string {
	t.Helper()
	out, err := ns.Run(args[0], args[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dial connects from ns to addr from a fixed local port, so a refused
// connection still names its five-tuple; it returns the local endpoint.
func dial(ns netlab.Namespace, from, addr string, timeout time.Duration) (string, error) {
	return dialThen(ns, from, addr, timeout, nil)
}

// dialThen is dial that hands the connection to use (when not nil) before
// closing it.
func dialThen(ns netlab.Namespace, from, addr string, timeout time.Duration, use func(net.Conn) error) (string, error) {
	local := &net.TCPAddr{IP: net.ParseIP(from), Port: 20000 + rand.IntN(20000)}
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: timeout, LocalAddr: local}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if use != nil {
			return use(c)
		}
		return nil
	})
	return local.String(), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// tracing is the live pipeline observing the node namespace.
type tracing struct {
	p      *live.Pipeline
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	flows  []*trace.Flow
}

// linger is the live default: a dropped SYN's retransmission a second
// later still joins its flow.
const linger = enrich.DefaultLinger

// startTracing attaches the live pipeline to node, with only the given
// tiers (nil: the best each hook has) and the pods and Services of meta.
func startTracing(t *testing.T, node netlab.Namespace, only []event.Via, meta enrich.Metadata) *tracing {
	t.Helper()
	ino, err := node.Inode()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p, err := live.Start(ctx, live.Config{
		Loader:    loader.Config{Netns: []uint32{ino}, NetnsPaths: []string{node.Path()}, Only: only},
		NetnsPath: node.Path(), NodeName: "node-1", Linger: linger,
		Metadata: meta,
	})
	if err != nil {
		cancel()
		t.Fatalf("start the live pipeline: %v", err)
	}
	tr := &tracing{p: p, cancel: cancel, done: make(chan error, 1)}
	go func() {
		_, err := p.Run(ctx, func(f *trace.Flow) {
			tr.mu.Lock()
			tr.flows = append(tr.flows, f)
			tr.mu.Unlock()
		}, nil)
		tr.done <- err
	}()
	t.Cleanup(func() { tr.stop(t) })
	return tr
}

func (tr *tracing) via(h event.Hook) event.Via {
	for _, hp := range tr.p.Plan() {
		if hp.Hook == h {
			return hp.Via
		}
	}
	return event.ViaNone
}

// stop waits out the flows' linger, then detaches; safe to call twice.
func (tr *tracing) stop(t *testing.T) {
	if tr.cancel == nil {
		return
	}
	time.Sleep(linger + time.Second)
	tr.cancel()
	tr.cancel = nil
	if err := <-tr.done; err != nil {
		t.Errorf("live pipeline: %v", err)
	}
	if err := tr.p.Close(); err != nil {
		t.Errorf("close the live pipeline: %v", err)
	}
}

// flowsOf are the flows the tracer reported for the connection.
func (tr *tracing) flowsOf(src, dst string) []*trace.Flow {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var got []*trace.Flow
	for _, f := range tr.flows {
		if f.Orig.Src == src && f.Orig.Dst == dst {
			got = append(got, f)
		}
	}
	return got
}

// all is every flow reported so far.
func (tr *tracing) all() []*trace.Flow {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]*trace.Flow(nil), tr.flows...)
}

// flowOf is the one flow the tracer reported for the connection, or nil
// (an error) when it did not report exactly one.
func (tr *tracing) flowOf(t *testing.T, src, dst string) *trace.Flow {
	t.Helper()
	got := tr.flowsOf(src, dst)
	if len(got) != 1 {
		t.Errorf("%d flows for %s → %s, want one; all flows: %s", len(got), src, dst, flowList(tr.all()))
		return nil
	}
	return got[0]
}

func eventList(evs []trace.Event) string {
	var s []string
	for _, e := range evs {
		s = append(s, fmt.Sprintf("%s via %s at %q reason %q", e.Kind, e.Via, e.NFHook, e.Reason))
	}
	return strings.Join(s, ", ")
}

func flowList(fs []*trace.Flow) string {
	var s []string
	for _, f := range fs {
		s = append(s, fmt.Sprintf("%s %s→%s %s", f.Proto, f.Orig.Src, f.Orig.Dst, f.Verdict))
	}
	return strings.Join(s, "; ")
}
