package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// agentNode is a namespace standing in for a node: its OUTPUT DNAT sends
// 10.96.78.1:80 to a listener on 10.78.0.1:8080 that counts what it
// accepts, and the client's connections are kept by source address.
type agentNode struct {
	name     string
	ns       netlab.Namespace
	accepted atomic.Int64
	made     []string // the client's source endpoints, in order
}

func newAgentNode(t *testing.T, prefix, name string) *agentNode {
	n := &agentNode{name: name, ns: dnatRules(t, prefix)}
	var ln net.Listener
	if err := n.ns.Do(func() (err error) { ln, err = net.Listen("tcp", "10.78.0.1:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
			n.accepted.Add(1)
			c.Close()
		}
	}()
	return n
}

func dnatRules(t *testing.T, prefix string) netlab.Namespace {
	return scratchNamespace(t, prefix,
		[]string{"ip", "addr", "add", "10.78.0.1/32", "dev", "lo"},
		[]string{"iptables", "-t", "nat", "-A", "OUTPUT", "-d", "10.96.78.1", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.78.0.1:8080"},
		[]string{"ip", "route", "add", "10.96.78.0/24", "dev", "lo"},
	)
}

// connect makes k connections to the VIP, each completed, and keeps
// their source endpoints.
func (n *agentNode) connect(t *testing.T, k int) {
	t.Helper()
	err := n.ns.Do(func() error {
		for range k {
			c, err := net.DialTimeout("tcp", "10.96.78.1:80", 2*time.Second)
			if err != nil {
				return err
			}
			n.made = append(n.made, c.LocalAddr().String())
			c.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: connect: %v", n.name, err)
	}
}

// startAgent runs `tracer agent` observing n's namespace and returns the
// process, the address it serves, and its stderr.
func startAgent(t *testing.T, bin string, n *agentNode, args ...string) (*exec.Cmd, string, *lockedBuffer) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command(bin, append([]string{"agent", "--netns", n.ns.Path(), "--node", n.name, "--ready-file", ready, "--linger", "300ms"}, args...)...)
	cmd.Env = append(os.Environ(), asTracerEnv+"=1")
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitReady(t, ready, stderr)
	m := regexp.MustCompile(`serving on (\S+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("%s: the agent does not say where it serves: %s", n.name, stderr.String())
	}
	return cmd, m[1], stderr
}

// TestAgentsMerged: two agents, one on a unix socket and one on TCP, each
// observing its own node namespace, and `tracer connect -o json` merging
// them. Truth: the connections the client completed on each node (their
// source endpoints) and what each node's listener accepted. One agent is
// killed mid-stream: the merge says that node's error and goes on with
// the other, whose later connections still arrive; the merged trace names
// each flow's node, is in time order, and its summary gives each node's
// part.
func TestAgentsMerged(t *testing.T) {
	requireRootHost(t)
	bin := selfTracer(t)
	a := newAgentNode(t, "tragta", "node-a")
	b := newAgentNode(t, "tragtb", "node-b")
	sock := filepath.Join(t.TempDir(), "agent.sock")
	agentA, _, errA := startAgent(t, bin, a, "--listen", "", "--socket", sock)
	agentB, addrB, _ := startAgent(t, bin, b, "--listen", "127.0.0.1:0")
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the agent's socket: %v, mode %v, want 0600", err, st.Mode())
	}

	conn := exec.Command(bin, "connect", "-o", "json", "--window", "1s", "unix:"+sock, addrB)
	conn.Env = append(os.Environ(), asTracerEnv+"=1")
	var out bytes.Buffer
	connErr := &lockedBuffer{}
	conn.Stdout, conn.Stderr = &out, connErr
	if err := conn.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Process.Kill() })
	// Each agent counts its stream's subscriber once connect opened it:
	// wait for a heartbeat's worth before the traffic.
	time.Sleep(1500 * time.Millisecond)

	a.connect(t, 20)
	b.connect(t, 20)
	time.Sleep(1500 * time.Millisecond) // the flows' linger, and the stream
	agentB.Process.Signal(syscall.SIGKILL)
	agentB.Wait()
	a.connect(t, 10) // after node-b's agent died
	time.Sleep(1500 * time.Millisecond)
	agentA.Process.Signal(syscall.SIGTERM)
	if err := agentA.Wait(); err != nil {
		t.Fatalf("agent of node-a on SIGTERM: %v; stderr: %s", err, errA.String())
	}
	done := make(chan error, 1)
	go func() { done <- conn.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Errorf("tracer connect: %v, want exit 1 (an agent failed); stderr: %s", err, connErr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("tracer connect did not end with its agents; stderr: %s", connErr.String())
	}
	if !strings.Contains(connErr.String(), "node node-b: agent 127.0.0.1:") {
		t.Errorf("connect's stderr does not name node-b's failure: %s", connErr.String())
	}
	f, err := trace.ReadAll(&out, "connect")
	if err != nil {
		t.Fatalf("the merged trace: %v\n%s", err, out.String())
	}
	checkMerged(t, f, a, b)
}

func checkMerged(t *testing.T, f *trace.File, nodes ...*agentNode) {
	t.Helper()
	for i := 1; i < len(f.Flows); i++ {
		if f.Flows[i].Time.Before(f.Flows[i-1].Time) {
			t.Errorf("flow %d (%s) is earlier than flow %d before it", i, f.Flows[i].Time, i-1)
		}
	}
	sum := f.Summary
	if sum == nil || len(sum.Nodes) != len(nodes) {
		t.Fatalf("summary %+v: want one part per node", sum)
	}
	for i, n := range nodes {
		var got []string
		for _, fl := range f.Flows {
			if fl.Node != n.name || fl.Orig.Dst != "10.96.78.1:80" {
				continue
			}
			if fl.Reply == nil || fl.Reply.Src != "10.78.0.1:8080" || fl.Verdict != trace.VerdictOK {
				t.Errorf("%s: flow %s: reply %+v verdict %s, want DNAT'd to 10.78.0.1:8080 and ok", n.name, fl.Orig.Src, fl.Reply, fl.Verdict)
			}
			got = append(got, fl.Orig.Src)
		}
		want := slices.Clone(n.made)
		slices.Sort(got)
		slices.Sort(want)
		if int(n.accepted.Load()) != len(n.made) || !slices.Equal(got, want) {
			t.Errorf("%s: the merge has flows from %v; the client made %v, the listener accepted %d", n.name, got, want, n.accepted.Load())
		}
		part := sum.Nodes[i]
		if part.Node != n.name || part.Flows != len(got) {
			t.Errorf("summary part %d: %+v, want node %s with %d flows", i, part, n.name, len(got))
		}
	}
	if sum.Nodes[0].Error != "" || sum.Nodes[1].Error == "" {
		t.Errorf("summary errors: node-a %q, node-b %q: want only node-b's", sum.Nodes[0].Error, sum.Nodes[1].Error)
	}
	t.Logf("%d flows merged; node-b ended with: %s", len(f.Flows), sum.Nodes[1].Error)
}
