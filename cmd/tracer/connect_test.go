package main

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/agent"
	"github.com/tracer-dev/tracer/internal/trace"
)

// fakeAgent serves a hub on a unix socket, as tracer agent does, with a
// header naming node.
func fakeAgent(t *testing.T, node string) (*agent.Server, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), node+".sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &agent.Server{Hub: agent.NewHub(), Header: trace.Header{Type: trace.TypeHeader, Schema: trace.Schema, Node: node, Kernel: "6.1",
		Conntrack: []trace.ConntrackSource{{Netns: node + "-ns", Inode: 4026531840, Lookups: trace.LookupsNetlink,
			LookupsWhy: "the kernel has no bpf_xdp_ct_lookup", Ends: trace.EndsKernel}}},
		Heartbeat: 50 * time.Millisecond}
	srv.Start()
	go srv.Serve(l)
	t.Cleanup(func() { srv.Stop(0) })
	return srv, "unix:" + sock
}

func connectFlow(src string, at time.Time) *trace.Flow {
	return &trace.Flow{Type: trace.TypeFlow, Time: at, Proto: "tcp", Orig: trace.Tuple{Src: src, Dst: "10.96.0.1:80"},
		Events: []trace.Event{}, Verdict: trace.VerdictOK, Explanation: "ok"}
}

// Two nodes whose flows arrive out of their time order come out merged
// in time order, each naming its node; a node whose agent goes away
// mid-stream is that node's error in the summary and exit 1, while the
// other node's later flows still come.
func TestConnectMergesTwoAgents(t *testing.T) {
	a, addrA := fakeAgent(t, "node-a")
	b, addrB := fakeAgent(t, "node-b")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errs lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- dispatch(ctx, []string{"connect", "-o", "json", "--window", "300ms", "--filter", "port:80", addrA, addrB}, &out, &errs)
	}()
	waitSubscribed(t, a, b)
	t0 := time.Now().Add(-time.Minute)
	// node-b's flows are older but published after node-a's.
	a.Hub.Publish(connectFlow("10.0.0.1:1001", t0.Add(3*time.Second)))
	a.Hub.Publish(connectFlow("10.0.0.1:1002", t0.Add(5*time.Second)))
	b.Hub.Publish(connectFlow("10.0.0.2:2001", t0.Add(1*time.Second)))
	b.Hub.Publish(connectFlow("10.0.0.2:2002", t0.Add(4*time.Second)))
	a.Hub.Publish(&trace.Flow{Type: trace.TypeFlow, Time: t0, Proto: "udp", Orig: trace.Tuple{Src: "10.0.0.1:53", Dst: "10.96.0.10:53"}}) // filtered in the agent
	time.Sleep(600 * time.Millisecond)
	b.Stop(0) // node-b's agent goes away without a summary
	time.Sleep(200 * time.Millisecond)
	a.Hub.Publish(connectFlow("10.0.0.1:1003", t0.Add(6*time.Second)))
	a.Finish(trace.Summary{Type: trace.TypeSummary})
	var exit int
	select {
	case exit = <-code:
	case <-ctx.Done():
		t.Fatalf("connect did not end; stderr: %s", errs.String())
	}
	if exit != 1 || !strings.Contains(errs.String(), "node node-b: agent unix:") {
		t.Errorf("exit %d, stderr %q: want 1 and node-b's error", exit, errs.String())
	}
	f, err := trace.ReadAll(strings.NewReader(out.String()), "connect")
	if err != nil {
		t.Fatalf("merged trace: %v\n%s", err, out.String())
	}
	var got []string
	for _, fl := range f.Flows {
		got = append(got, fl.Node+" "+fl.Orig.Src)
	}
	want := "node-b 10.0.0.2:2001,node-a 10.0.0.1:1001,node-b 10.0.0.2:2002,node-a 10.0.0.1:1002,node-a 10.0.0.1:1003"
	if strings.Join(got, ",") != want {
		t.Errorf("merged order:\n got %s\nwant %s", strings.Join(got, ","), want)
	}
	nodes := f.Summary.Nodes
	if len(nodes) != 2 || nodes[0].Node != "node-a" || nodes[0].Flows != 3 || nodes[0].Error != "" ||
		nodes[1].Node != "node-b" || nodes[1].Flows != 2 || nodes[1].Error == "" || nodes[1].Kernel != "6.1" {
		t.Errorf("summary nodes %+v", nodes)
	}
	// Each node's own conntrack lines, as its agent's header said them.
	for i, n := range nodes {
		if len(n.Conntrack) != 1 || n.Conntrack[0].Netns != n.Node+"-ns" || n.Conntrack[0].Lookups != trace.LookupsNetlink ||
			n.Conntrack[0].Ends != trace.EndsKernel || n.Conntrack[0].LookupsWhy == "" {
			t.Errorf("summary node %d: conntrack %+v, want its agent's header's", i, n.Conntrack)
		}
	}
}

func waitSubscribed(t *testing.T, srvs ...*agent.Server) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := 0
		for _, s := range srvs {
			n += s.Hub.Subscribers()
		}
		if n == len(srvs) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("connect did not subscribe to every agent")
		}
	}
}

// An agent that is not there is that node's error, not a hang.
func TestConnectAgentMissing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errs lockedBuffer
	missing := "unix:" + filepath.Join(t.TempDir(), "none.sock")
	if code := dispatch(ctx, []string{"connect", missing}, &out, &errs); code != 1 || !strings.Contains(errs.String(), missing) {
		t.Errorf("exit %d, stderr %q: want 1 naming %s", code, errs.String(), missing)
	}
	if !strings.Contains(out.String(), "# agent "+missing+": unreachable: dial unix") {
		t.Errorf("the text stream does not say the node's error: %q", out.String())
	}
}

// twoNodeUIMerge is the UI's merge of agents a:1 and b:1, whose headers
// name node-a and node-b, and what it writes to the terminal.
func twoNodeUIMerge() (m *merge, out, errs *lockedBuffer) {
	out, errs = &lockedBuffer{}, &lockedBuffer{}
	m = newMerge(connectOptions{output: "ui"}, []mergeTarget{{addr: "a:1"}, {addr: "b:1"}}, out, errs)
	m.store = trace.NewStore()
	m.take(feedMsg{i: 0, header: &trace.Header{Node: "node-a"}})
	m.take(feedMsg{i: 1, header: &trace.Header{Node: "node-b"}})
	return m, out, errs
}

// In the UI the merged flows go to its store, and the title says each
// node's health: a dropped count, a failed stream as an alert.
func TestConnectUIStatus(t *testing.T) {
	m, out, errs := twoNodeUIMerge()
	f := connectFlow("10.0.0.1:1", time.Now())
	f.Node = "node-a"
	m.take(feedMsg{i: 0, msg: agent.Message{Flow: f, Time: time.Now(), Dropped: 3, LostEvents: 2}, at: time.Now()})
	m.take(feedMsg{i: 1, end: true, err: errors.New("agent b:1: unreachable")})
	if err := m.write(m.merger.Drain(nil)); err != nil {
		t.Fatal(err)
	}
	line, alert := m.statusLine()
	if line != "node-a ok, 3 dropped · node-b: agent b:1: unreachable" || !alert {
		t.Errorf("status %q alert %v", line, alert)
	}
	if m.store.Len() != 1 || m.stats().LostEvents != 2 {
		t.Errorf("store %d flows, lost %d", m.store.Len(), m.stats().LostEvents)
	}
	if out.String() != "" || errs.String() != "" {
		t.Errorf("the UI's merge wrote to the terminal: %q %q", out.String(), errs.String())
	}
}

// The title says what each agent's tracer costs its node: its resident
// size from the first heartbeat, its share of a CPU from the next, over
// the agent's own clock.
func TestConnectUIStatusShowsAgentCost(t *testing.T) {
	m, _, _ := twoNodeUIMerge()
	agentAt := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	// The client's clock runs apart from the agent's: the share is timed
	// by the agent's.
	beat := func(i int, after time.Duration, cpuMillis int64, rssKiB uint64) {
		m.take(feedMsg{i: i, msg: agent.Message{Time: agentAt.Add(after), TracerCPUMillis: cpuMillis, TracerRSSKiB: rssKiB}, at: time.Now()})
	}
	beat(0, 0, 5000, 100<<10)
	if line, _ := m.statusLine(); line != "node-a ok, tracer 100 MiB · node-b ok" {
		t.Errorf("after one heartbeat: %q", line)
	}
	beat(0, 2*time.Second, 5084, 102<<10)
	beat(1, 0, 100, 90<<10)
	beat(1, 500*time.Millisecond, 101, 90<<10)
	if line, _ := m.statusLine(); line != "node-a ok, tracer 4.2% CPU 102 MiB · node-b ok, tracer 0.2% CPU 90 MiB" {
		t.Errorf("after two heartbeats each: %q", line)
	}
	// A heartbeat without the figures (an older agent) changes nothing.
	m.take(feedMsg{i: 0, msg: agent.Message{Time: agentAt.Add(3 * time.Second)}, at: time.Now()})
	if line, _ := m.statusLine(); line != "node-a ok, tracer 4.2% CPU 102 MiB · node-b ok, tracer 0.2% CPU 90 MiB" {
		t.Errorf("after a heartbeat without figures: %q", line)
	}
}
