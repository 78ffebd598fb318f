package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/internal/tui"
)

// runUI follows the agents into the live terminal UI: a node column in
// the table, and in the title each node's health and what its buffer
// dropped for this client.
func (m *merge) runUI(ctx context.Context, title string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.store = trace.NewStore()
	done := make(chan error, 1)
	go func() { done <- m.follow(ctx) }()
	src := tui.Source{
		Header: trace.Header{Type: trace.TypeHeader, Schema: trace.Schema, Node: fmt.Sprintf("%d nodes", len(m.feeds)), Hooks: []trace.Hook{}},
		Title:  title, Store: m.store, Nodes: true, Live: true,
		Status: m.statusLine,
		Stats:  m.stats,
	}
	uiErr := tui.Run(ctx, src, tui.Options{})
	cancel()
	followErr := <-done
	if errors.Is(uiErr, tui.ErrNotTerminal) {
		uiErr = usageError{uiErr}
	}
	// The user quit: the streams ended on purpose, not the agents.
	if uiErr == nil {
		return nil
	}
	return errors.Join(uiErr, followErr)
}

// statusLine is each node's health for the UI's title, with what its
// tracer costs the node: an alert while any node's stream has failed.
func (m *merge) statusLine() (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var parts []string
	alert := false
	for _, f := range m.feeds {
		st := f.status
		name := st.Node
		if name == "" {
			name = st.Agent
		}
		switch {
		case st.Error != "":
			alert = true
			parts = append(parts, name+": "+st.Error)
		case f.ended:
			parts = append(parts, name+" ended")
		case st.Dropped > 0:
			parts = append(parts, fmt.Sprintf("%s ok, %d dropped", name, st.Dropped)+costText(f))
		default:
			parts = append(parts, name+" ok"+costText(f))
		}
	}
	return strings.Join(parts, " · "), alert
}

// stats sums the nodes' lost events for the UI's header.
func (m *merge) stats() tui.Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	var s tui.Stats
	for _, f := range m.feeds {
		s.LostEvents += f.status.LostEvents
	}
	return s
}

// costText is what a following agent's process costs its node, as far as
// its heartbeats have said: its share of a CPU over the last one, and its
// resident size.
func costText(f *agentFeed) string {
	st := f.status
	if st.TracerRSSKiB == 0 {
		return ""
	}
	mib := fmt.Sprintf("%d MiB", st.TracerRSSKiB>>10)
	if f.cost.share < 0 {
		return ", tracer " + mib
	}
	return fmt.Sprintf(", tracer %.1f%% CPU %s", 100*f.cost.share, mib)
}
