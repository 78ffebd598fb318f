// Package tui is the live terminal UI: a header with the node and its
// hooks, a virtualised flow table over a trace.Store, a filter bar, a
// details view, help, and export to a trace file. It is the only package
// that imports Bubble Tea and Lip Gloss.
package tui

import (
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Source is where the UI's flows come from.
//
// The live pipeline appends to Store directly (or sends on Flows) and
// reports its counters through Stats; a replay fills Store from a trace
// file and leaves Flows and Stats nil.
type Source struct {
	// Header names the node and kernel and lists the hooks; its snapshot
	// is written into exports.
	Header trace.Header
	// Title says what is shown: "live", "replay FILE" or "lab SCENARIOS".
	Title string
	// Store holds the flows. The UI only reads it, except for flows it
	// receives on Flows, which it appends. nil is a store with
	// trace.DefaultCaps; beyond its caps the store drops the oldest
	// flows and the header says how many.
	Store *trace.Store
	// Flows, when not nil, is drained into Store until it is closed.
	Flows <-chan *trace.Flow
	// Stats, when not nil, is polled for the event rate and lost events.
	Stats func() Stats
	// Live makes the UI poll Store for new flows. It is implied by Flows
	// or Stats.
	Live bool
	// LostEvents is the lost-event count when Stats is nil (a replay's
	// summary).
	LostEvents uint64
	// States, when not nil, are the node state changes an export writes
	// with its flows, so a replay of it diagnoses each flow against the
	// rules in force at its time. Without them an export has the
	// header's snapshot alone.
	States *trace.StateLog
	// Nodes says the flows come from several nodes (tracer connect,
	// kubectl tracer): the table shows which node saw each.
	Nodes bool
	// Status, when not nil, is polled for a line the title shows next to
	// "tracer" (the lab's checks so far); alert shows it as a warning.
	Status func() (text string, alert bool)
}

// Stats are the capture stage's counters.
type Stats struct {
	EventsPerSec float64
	LostEvents   uint64
	// ConntrackOverruns counts conntrack events the kernel dropped before
	// the tracker read them: some flows lack their conntrack entry.
	ConntrackOverruns uint64
	// ConntrackEndsEvicted counts ended conntrack entries the tracker's
	// full table forgot within a flow's linger of their end: flows that
	// finished after their connection's entry ended may lack it.
	ConntrackEndsEvicted uint64
	// ConntrackDrops counts packets conntrack itself dropped (table full,
	// insert clashes) in the observed namespace since the start.
	ConntrackDrops uint64
	// TracerCPU is the share of one CPU the tracer's process used lately
	// (1 is a whole core), TracerRSS its resident size in bytes; 0 when
	// unknown.
	TracerCPU float64
	TracerRSS uint64
}

// Options adjust the UI.
type Options struct {
	// Filter is the initial filter expression (--filter).
	Filter string
	// ExportDir is where `e` writes; "" is the working directory.
	ExportDir string
	// Now is the clock for export file names and rates; tests fix it.
	Now func() time.Time
	// RefreshEvery is how often a live UI picks up new flows.
	RefreshEvery time.Duration
}

func (s *Source) live() bool { return s.Live || s.Flows != nil || s.Stats != nil }
