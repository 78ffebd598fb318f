package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tracer-dev/tracer/internal/agent"
	"github.com/tracer-dev/tracer/internal/trace"
)

// skewWarnAt is the clock offset from which a node's flow times are said
// to be its own clock's: beyond it the merged order can mislead.
const skewWarnAt = 500 * time.Millisecond

// merge follows every agent and writes their flows in time order.
type merge struct {
	o      connectOptions
	feeds  []*agentFeed
	merger agent.Merger
	stdout io.Writer
	stderr io.Writer
	json   *trace.Writer
	// store is the UI's (-o ui); mu guards the nodes' status, which the
	// UI reads while the merge runs.
	store *trace.Store
	mu    sync.Mutex
	sum   trace.Summary
}

// agentFeed is one agent's stream as the merge sees it.
type agentFeed struct {
	target   mergeTarget
	status   trace.NodeStatus
	skew     agent.Skew
	warned   bool
	ended    bool
	messages int
	cost     agentCost
}

// agentCost is the share of a CPU an agent's process used between its
// last two heartbeats that said, timed by the agent's own clock.
type agentCost struct {
	cpuMillis int64
	at        time.Time
	share     float64 // -1 until two heartbeats have said
}

// observe takes a heartbeat's CPU time, sent at the agent's time at.
func (c *agentCost) observe(cpuMillis int64, at time.Time) {
	if dt := at.Sub(c.at); !c.at.IsZero() && dt > 0 && cpuMillis >= c.cpuMillis {
		c.share = float64(cpuMillis-c.cpuMillis) * float64(time.Millisecond) / float64(dt)
	}
	c.cpuMillis, c.at = cpuMillis, at
}

// mergeTarget is an agent to follow: where to dial it, what to call it
// (status.Agent), and an error that already ended it (its port-forward
// could not be opened).
type mergeTarget struct {
	addr string
	name string
	node string // known before its header: the node its pod runs on
	err  error
}

// feedMsg is what a follower hands the merge: the agent's header, a
// message, or the end of its stream.
type feedMsg struct {
	i      int
	header *trace.Header
	msg    agent.Message
	at     time.Time
	end    bool
	err    error
}

func newMerge(o connectOptions, targets []mergeTarget, stdout, stderr io.Writer) *merge {
	m := &merge{o: o, merger: agent.Merger{Window: o.window}, stdout: stdout, stderr: stderr}
	for _, t := range targets {
		name := t.name
		if name == "" {
			name = t.addr
		}
		m.feeds = append(m.feeds, &agentFeed{target: t, status: trace.NodeStatus{Agent: name, Node: t.node}, cost: agentCost{share: -1}})
	}
	m.sum = trace.Summary{Type: trace.TypeSummary, Verdicts: map[string]int{}}
	return m
}

// run follows the agents into the output -o asks for.
func (m *merge) run(ctx context.Context, title string) error {
	if m.o.output == "ui" {
		return m.runUI(ctx, title)
	}
	if err := m.start(); err != nil {
		return err
	}
	return m.follow(ctx)
}

// follow reads every agent until all their streams end or ctx does, and
// writes the flows in order.
func (m *merge) follow(ctx context.Context) error {
	follow, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan feedMsg, 1024)
	for i := range m.feeds {
		go m.followOne(follow, i, ch)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var writeErr error
	for open := len(m.feeds); open > 0 && writeErr == nil; {
		select {
		case <-ctx.Done():
			open = 0
		case fm := <-ch:
			if m.take(fm) {
				open--
			}
		case now := <-tick.C:
			writeErr = m.write(m.merger.Ready(now, nil))
		}
	}
	cancel()
	writeErr = errors.Join(writeErr, m.write(m.merger.Drain(nil)))
	return errors.Join(writeErr, m.finish())
}

// followOne reads one agent until its stream ends or ctx does.
func (m *merge) followOne(ctx context.Context, i int, ch chan<- feedMsg) {
	send := func(fm feedMsg) bool {
		fm.i = i
		select {
		case ch <- fm:
			return true
		case <-ctx.Done():
			return false
		}
	}
	end := func(err error) {
		if ctx.Err() == nil {
			send(feedMsg{end: true, err: err})
		}
	}
	t := m.feeds[i].target
	if t.err != nil {
		end(t.err)
		return
	}
	c, err := agent.Dial(t.addr)
	if err != nil {
		end(err)
		return
	}
	defer c.Close()
	hdr, err := c.Header(ctx)
	if err != nil {
		end(err)
		return
	}
	if !send(feedMsg{header: &hdr}) {
		return
	}
	s, err := c.Flows(ctx, agent.FlowsRequest{Filter: m.o.filter, Buffer: m.o.buffer})
	if err != nil {
		end(err)
		return
	}
	defer s.Close()
	for {
		msg, err := s.Recv()
		if err == io.EOF {
			end(nil)
			return
		}
		if err != nil {
			end(err)
			return
		}
		if !send(feedMsg{msg: msg, at: time.Now()}) {
			return
		}
	}
}

// take applies one follower's report; it says whether that stream ended.
func (m *merge) take(fm feedMsg) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.feeds[fm.i]
	st := &f.status
	switch {
	case fm.header != nil:
		if fm.header.Node != "" {
			st.Node = fm.header.Node
		}
		st.Kernel, st.Warnings, st.Conntrack = fm.header.Kernel, fm.header.Warnings, fm.header.Conntrack
		for _, w := range st.Warnings {
			if m.store == nil {
				fmt.Fprintf(m.stderr, "tracer: node %s: warning: %s\n", m.name(f), w)
			}
		}
		return false
	case fm.end:
		f.ended = true
		if fm.err != nil {
			st.Error = fm.err.Error()
			// Said once: in the text stream where it happened, beside
			// the JSON on stderr, in the UI's title.
			switch {
			case m.store != nil:
			case m.json == nil:
				fmt.Fprintf(m.stdout, "# %s%v\n", m.nodePrefix(f), fm.err)
			default:
				fmt.Fprintf(m.stderr, "tracer: %s%v\n", m.nodePrefix(f), fm.err)
			}
		}
		return true
	}
	msg := fm.msg
	st.Dropped, st.LostEvents = msg.Dropped, msg.LostEvents
	if msg.TracerRSSKiB != 0 {
		st.TracerCPUMillis, st.TracerRSSKiB = msg.TracerCPUMillis, msg.TracerRSSKiB
		f.cost.observe(msg.TracerCPUMillis, msg.Time)
	}
	f.skew.Observe(msg.Time, fm.at)
	f.messages++
	m.warnSkew(f)
	if msg.Flow != nil {
		msg.Flow.Node = st.Node
		m.merger.Add(msg.Flow, fm.at)
	}
	return false
}

// warnSkew says once when a node's clock is off; three messages first,
// so one delayed message does not raise it.
func (m *merge) warnSkew(f *agentFeed) {
	d, _ := f.skew.Offset()
	f.status.ClockOffsetMS = d.Milliseconds()
	if f.warned || f.messages < 3 || d.Abs() < skewWarnAt {
		return
	}
	f.warned = true
	way := "ahead of"
	if d < 0 {
		way = "behind"
	}
	fmt.Fprintf(m.stderr, "tracer: node %s: its clock is %s %s this machine's: its flows carry its own times, so the merged order is off by that much\n",
		m.name(f), d.Abs().Round(time.Millisecond), way)
}

// nodePrefix names the node ahead of an error, which names its agent.
func (m *merge) nodePrefix(f *agentFeed) string {
	if f.status.Node == "" {
		return ""
	}
	return "node " + f.status.Node + ": "
}

func (m *merge) name(f *agentFeed) string {
	if f.status.Node == "" {
		return f.status.Agent
	}
	return f.status.Node + " (" + f.status.Agent + ")"
}

func (m *merge) start() error {
	if m.o.output != "json" {
		fmt.Fprintf(m.stdout, "# %d agents, flows ordered within %s\n", len(m.feeds), m.merger.Window)
		return nil
	}
	h := trace.Header{Type: trace.TypeHeader, Schema: trace.Schema, Started: time.Now(), Command: "connect", Filter: m.o.filter, Hooks: []trace.Hook{}}
	w, err := trace.NewWriter(m.stdout, h)
	if err != nil {
		return fmt.Errorf("write header: %w", err)
	}
	m.json = w
	return nil
}

func (m *merge) write(flows []*trace.Flow) error {
	for _, f := range flows {
		m.sum.Flows++
		m.sum.Verdicts[f.Verdict]++
		nodes := f.Nodes
		if len(nodes) == 0 {
			nodes = []string{f.Node}
		}
		m.countFlow(nodes)
		if m.store != nil {
			m.store.Append(f)
			continue
		}
		if m.json != nil {
			if err := m.json.WriteFlow(f); err != nil {
				return fmt.Errorf("stdout: %w", err)
			}
			continue
		}
		if _, err := fmt.Fprintf(m.stdout, "%-12s %s\n", strings.Join(nodes, "+"), flowLine(f)); err != nil {
			return fmt.Errorf("stdout: %w", err)
		}
	}
	return nil
}

func (m *merge) countFlow(nodes []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, feed := range m.feeds {
		if slices.Contains(nodes, feed.status.Node) {
			feed.status.Flows++
		}
	}
}

// finish writes the summary: every node's part, and the flows that came
// out of order. A stream that ended in an error is the command's error.
func (m *merge) finish() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var failed []string
	for _, f := range m.feeds {
		m.sum.Nodes = append(m.sum.Nodes, f.status)
		m.sum.LostEvents += f.status.LostEvents
		if f.status.Error != "" {
			failed = append(failed, m.name(f))
		}
	}
	m.sum.Ended = time.Now()
	var err error
	switch {
	case m.store != nil: // the UI's title said it all along
	case m.json != nil:
		m.json.SetLoss(m.sum)
		err = m.json.Close()
	default:
		for _, f := range m.feeds {
			st := f.status
			clock := "no message came"
			if f.messages > 0 {
				clock = fmt.Sprintf("clock %+dms from this machine's", st.ClockOffsetMS)
			}
			fmt.Fprintf(m.stdout, "# node %s: %d flows, %d dropped for this client, %d events lost, %s\n",
				m.name(f), st.Flows, st.Dropped, st.LostEvents, clock)
		}
		fmt.Fprintf(m.stdout, "# %d flows (%d joined from several nodes' flows of one connection), %d out of order beyond the window\n",
			m.sum.Flows, m.merger.Joined, m.merger.OutOfOrder)
	}
	if len(failed) > 0 {
		return errors.Join(err, fmt.Errorf("%d of %d agents failed (each said where it happened): %s", len(failed), len(m.feeds), strings.Join(failed, ", ")))
	}
	return err
}
