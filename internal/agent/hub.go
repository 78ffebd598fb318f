// Package agent serves a node's flows to remote clients (tracer agent)
// and reads them back from many agents (tracer connect): the node agent of
// cluster mode. The pipeline publishes each flow to a Hub, which never
// blocks it; every client has its own filter and bounded buffer, and what
// its buffer had no room for is counted and sent to that client.
package agent

import (
	"sync"
	"sync/atomic"

	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/trace"
)

// DefaultBuffer is a client's buffer when it asks for none: about ten
// seconds of a busy node's flows (BENCHMARKS.md measures ~10,000 new
// connections/s at most on the benchmark machine), a few MiB of flows.
const DefaultBuffer = 100_000

// MaxBuffer bounds what a client may ask for, so no client can make the
// agent hold more than this many flows for it.
const MaxBuffer = 1_000_000

// Hub hands every published flow to every subscription whose filter it
// passes. Publish never blocks: a subscription whose buffer is full drops
// the flow and counts it.
type Hub struct {
	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	closed bool
	// published counts the flows the pipeline handed over.
	published atomic.Uint64
}

// NewHub returns a hub with no subscriptions.
func NewHub() *Hub { return &Hub{subs: map[*Subscription]struct{}{}} }

// Subscription is one client's view of the hub.
type Subscription struct {
	hub     *Hub
	filter  filter.Filter
	flows   chan *trace.Flow
	dropped atomic.Uint64
	once    sync.Once
}

// Subscribe adds a subscription with filter f and room for buffer flows
// (DefaultBuffer when 0 or less, at most MaxBuffer). On a closed hub it
// returns a subscription whose Flows channel is already closed.
func (h *Hub) Subscribe(f filter.Filter, buffer int) *Subscription {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	buffer = min(buffer, MaxBuffer)
	s := &Subscription{hub: h, filter: f, flows: make(chan *trace.Flow, buffer)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		s.once.Do(func() { close(s.flows) })
		return s
	}
	h.subs[s] = struct{}{}
	return s
}

// Publish offers f to every subscription. Subscribers only read f: the
// pipeline does not touch a flow once emitted.
func (h *Hub) Publish(f *trace.Flow) {
	h.published.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if !s.filter.Empty() && !s.filter.Match(f) {
			continue
		}
		select {
		case s.flows <- f:
		default:
			s.dropped.Add(1)
		}
	}
}

// Published is how many flows the pipeline handed to the hub.
func (h *Hub) Published() uint64 { return h.published.Load() }

// Subscribers is how many subscriptions are open.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Close ends every subscription's stream (the pipeline has ended): each
// reader gets what its buffer holds, then the closed channel.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		delete(h.subs, s)
		s.once.Do(func() { close(s.flows) })
	}
}

// Flows is the subscription's stream; it is closed when the hub closes.
func (s *Subscription) Flows() <-chan *trace.Flow { return s.flows }

// Dropped is how many flows passed the filter but found the buffer full.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close removes the subscription (its client went away).
func (s *Subscription) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	delete(s.hub.subs, s)
}
