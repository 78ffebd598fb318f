package main

import (
	"bytes"
	"context"
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

	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/lab"
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

// startConnect runs `tracer connect -o json ARGS` and gives it the time
// to open its streams: each agent counts a subscriber once connect opened
// its stream, a heartbeat's worth.
func startConnect(t *testing.T, bin string, args ...string) (*exec.Cmd, *bytes.Buffer, *lockedBuffer) {
	t.Helper()
	conn := exec.Command(bin, append([]string{"connect", "-o", "json"}, args...)...)
	conn.Env = append(os.Environ(), asTracerEnv+"=1")
	out, connErr := &bytes.Buffer{}, &lockedBuffer{}
	conn.Stdout, conn.Stderr = out, connErr
	if err := conn.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Process.Kill() })
	time.Sleep(1500 * time.Millisecond)
	return conn, out, connErr
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

	conn, out, connErr := startConnect(t, bin, "--window", "1s", "unix:"+sock, addrB)
	// A second client asks both agents for node-a's flows alone.
	onlyA, outA, _ := startConnect(t, bin, "--window", "1s", "--filter", "node:node-a", "unix:"+sock, addrB)

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
	f, err := trace.ReadAll(out, "connect")
	if err != nil {
		t.Fatalf("the merged trace: %v\n%s", err, out.String())
	}
	checkMerged(t, f, a, b)
	checkAgentCosts(t, f.Summary.Nodes, agentA.ProcessState, agentB.ProcessState)

	onlyA.Wait()
	fa, err := trace.ReadAll(outA, "connect --filter node:node-a")
	if err != nil {
		t.Fatal(err)
	}
	var srcs []string
	for _, fl := range fa.Flows {
		if fl.Node != "node-a" {
			t.Errorf("node:node-a let through a flow of %q", fl.Node)
		}
		srcs = append(srcs, fl.Orig.Src)
	}
	slices.Sort(srcs)
	if want := slices.Sorted(slices.Values(a.made)); !slices.Equal(srcs, want) {
		t.Errorf("node:node-a gave flows from %v; node-a's client made %v", srcs, want)
	}
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

// TestAgentsJoinReturnPath: seed 004's return path, built by the lab
// (return-path-etp-local), traced by two agents as a cluster would: one
// on node-1, which DNATs the LB IP to a pod on node-2 without SNAT, and
// one on the outside client's host, whose stack resets the pod's direct
// answer. `tracer connect` joins the two sides into one flow diagnosed
// from both ends. Truth is the lab's: the client's connect timed out, its
// Tcp OutRsts went up, node-1's conntrack entry stayed unreplied; the
// baseline (an ETP=Cluster LB, SNAT) connected and is one node's flow.
// Without the join the two sides come out as two flows, each guessing
// at the other half.
func TestAgentsJoinReturnPath(t *testing.T) {
	requireRootHost(t)
	bin := selfTracer(t)
	env, err := lab.NewEnv()
	if err != nil {
		t.Fatal(err)
	}
	sc, _ := lab.Lookup("return-path-etp-local")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	built, err := sc.Build(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	defer built.Close()
	if len(built.Observe) != 2 {
		t.Fatalf("the scenario observes %d namespaces, want node-1 and the client's", len(built.Observe))
	}
	metadata := filepath.Join(t.TempDir(), "metadata.json")
	if err := os.WriteFile(metadata, built.MetadataJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	var agents []*exec.Cmd
	var addrs []string
	for _, ns := range built.Observe {
		name := "outside"
		if ns.Path() == built.Node.Path() {
			name = built.NodeName
		}
		node := &agentNode{name: name, ns: ns}
		cmd, addr, _ := startAgent(t, bin, node, "--listen", "127.0.0.1:0", "--metadata", metadata)
		agents, addrs = append(agents, cmd), append(addrs, addr)
	}
	conn, out, connErr := startConnect(t, bin, addrs...) // the default window
	exps, err := built.Traffic(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// node-1's side of the return path is a SYN nothing answered: it
	// leaves UnansweredLinger after the DNAT, the client's side at its
	// linger after the last reset, and the attempt ended with the
	// client's 3 s timeout.
	time.Sleep(join.UnansweredLinger)
	for _, a := range agents {
		a.Process.Signal(syscall.SIGTERM)
		a.Wait()
	}
	if err := conn.Wait(); err != nil {
		t.Fatalf("tracer connect: %v; stderr: %s", err, connErr.String())
	}
	f, err := trace.ReadAll(out, "connect")
	if err != nil {
		t.Fatalf("the merged trace: %v\n%s", err, out.String())
	}
	for _, e := range exps {
		if !e.Reproduced() {
			t.Fatalf("the lab did not reproduce %s -> %s: saw %q, want %q; unproven %v", e.Src, e.Dst, e.Saw, e.Outcome, e.Unproven)
		}
		checkJoined(t, f.Flows, e, built.NodeName)
	}
}

// checkJoined: the return-path attempt is one flow from both nodes with
// the verdict seen from both ends; the baseline one node-1 flow, ok.
func checkJoined(t *testing.T, flows []*trace.Flow, e lab.Expectation, node1 string) {
	t.Helper()
	var got []*trace.Flow
	for _, f := range flows {
		if f.Orig.Src == e.Src && f.Orig.Dst == e.Dst {
			got = append(got, f)
		}
	}
	if len(got) != 1 {
		t.Errorf("%s -> %s: %d flows in the merged trace, want 1", e.Src, e.Dst, len(got))
		return
	}
	f := got[0]
	if e.Verdict == trace.VerdictReturnPathMismatch {
		// The client's host has no conntrack entry of its connection
		// (nothing there tracks): its flow is the answer it reset, which
		// came after node-1's DNAT.
		if strings.Join(f.Nodes, ",") != node1+",outside" || f.Verdict != e.Verdict || !strings.Contains(f.Explanation, "seen from both ends") {
			t.Errorf("%s -> %s: nodes %v, verdict %s: %s; want joined from %s and outside, seen from both ends", e.Src, e.Dst, f.Nodes, f.Verdict, f.Explanation, node1)
		}
		byNode := map[string][]string{}
		for _, ev := range f.Events {
			byNode[ev.Node] = append(byNode[ev.Node], ev.Kind)
		}
		if !slices.Contains(byNode[node1], trace.KindDNAT) || !slices.Contains(byNode["outside"], trace.KindReset) {
			t.Errorf("%s -> %s: events by node %v: want node-1's DNAT and the client's reset", e.Src, e.Dst, byNode)
		}
		return
	}
	if f.Node != node1 || len(f.Nodes) != 0 || f.Verdict != trace.VerdictOK {
		t.Errorf("baseline %s -> %s: node %q nodes %v verdict %s, want node-1's own ok flow", e.Src, e.Dst, f.Node, f.Nodes, f.Verdict)
	}
}

// checkAgentCosts compares what each agent's heartbeats said its process
// cost with what the kernel told this process, its parent, when it
// waited for it: the CPU time so far cannot exceed the final one, nor the
// resident size then the peak (a quarter's slack: the kernel updates the
// peak lazily).
func checkAgentCosts(t *testing.T, parts []trace.NodeStatus, agents ...*os.ProcessState) {
	t.Helper()
	for i, ps := range agents {
		part := parts[i]
		ru, ok := ps.SysUsage().(*syscall.Rusage)
		if !ok {
			t.Fatalf("no rusage for %s's agent", part.Node)
		}
		cpuMS := (ps.UserTime() + ps.SystemTime()).Milliseconds()
		t.Logf("%s: heartbeat %d ms CPU, %d KiB resident; wait4: %d ms CPU, peak %d KiB", part.Node, part.TracerCPUMillis, part.TracerRSSKiB, cpuMS, ru.Maxrss)
		if part.TracerCPUMillis <= 0 || part.TracerCPUMillis > cpuMS+1 {
			t.Errorf("%s: the agent said %d ms CPU; the kernel's at exit %d ms", part.Node, part.TracerCPUMillis, cpuMS)
		}
		if part.TracerRSSKiB == 0 || part.TracerRSSKiB > uint64(ru.Maxrss)*5/4 {
			t.Errorf("%s: the agent said %d KiB resident; the kernel's peak %d KiB", part.Node, part.TracerRSSKiB, ru.Maxrss)
		}
	}
}
