package trace

import (
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"
)

// TypeState is a change of the node's state during the trace.
const TypeState = "state"

// The parts of a Snapshot a StateChange replaces, as Changed names them.
// A rules part is PartRules followed by the table's key in Rules ("nat",
// "ip6/filter").
const (
	PartAddresses   = "addresses"
	PartLocalRoutes = "local_routes"
	PartRules       = "rules:"
	PartIpsets      = "ipsets"
	PartIPVS        = "ipvs"
	PartListeners   = "listeners"
	PartNFTables    = "nftables"
)

// StateChange records that the node's state changed at Time: the parts
// Changed names are replaced, each whole, by Snapshot's; a named part that
// Snapshot leaves empty is now empty; every other part is as before. Time
// is when the tracer read the new state (it polls rules every 2 s, so the
// change itself happened at most one poll earlier). Flows decided from
// Time on are diagnosed against it, live and on replay.
type StateChange struct {
	Type     string    `json:"type"`
	Time     time.Time `json:"time"`
	Changed  []string  `json:"changed"`
	Snapshot Snapshot  `json:"snapshot"`
}

// Apply returns base with c's parts replaced; base is left as it was.
// Pods and Services are base's: they come from the cluster's metadata, not
// the node.
func (c *StateChange) Apply(base *Snapshot) *Snapshot {
	out := &Snapshot{}
	if base != nil {
		*out = *base
	}
	rulesCopied := false
	for _, part := range c.Changed {
		switch {
		case part == PartAddresses:
			out.Addresses = c.Snapshot.Addresses
		case part == PartLocalRoutes:
			out.LocalRoutes = c.Snapshot.LocalRoutes
		case strings.HasPrefix(part, PartRules):
			if !rulesCopied {
				out.Rules, rulesCopied = maps.Clone(out.Rules), true
			}
			table := strings.TrimPrefix(part, PartRules)
			if text, ok := c.Snapshot.Rules[table]; ok {
				if out.Rules == nil {
					out.Rules = map[string]string{}
				}
				out.Rules[table] = text
			} else {
				delete(out.Rules, table)
			}
		case part == PartIpsets:
			out.Ipsets = c.Snapshot.Ipsets
		case part == PartIPVS:
			out.IPVS = c.Snapshot.IPVS
		case part == PartListeners:
			out.Listeners = c.Snapshot.Listeners
		case part == PartNFTables:
			out.NFTables = c.Snapshot.NFTables
		}
	}
	return out
}

func validateState(c *StateChange) error {
	if c.Time.IsZero() {
		return errors.New("no time")
	}
	if len(c.Changed) == 0 {
		return errors.New("no changed parts")
	}
	for _, part := range c.Changed {
		switch {
		case part == PartAddresses, part == PartLocalRoutes, part == PartIpsets, part == PartIPVS,
			part == PartListeners, part == PartNFTables:
		case strings.HasPrefix(part, PartRules) && len(part) > len(PartRules):
		default:
			return fmt.Errorf("changed part %q is not addresses, local_routes, rules:TABLE, ipsets, ipvs, listeners or nftables", part)
		}
	}
	return nil
}

// Timeline is the node state in force over a trace: the header's
// snapshot, then each change from its time on.
type Timeline struct {
	at    []time.Time
	snaps []*Snapshot
}

// NewTimeline starts from the header's snapshot, in force from the start.
func NewTimeline(header *Snapshot) *Timeline {
	return &Timeline{at: []time.Time{{}}, snaps: []*Snapshot{header}}
}

// Add applies a change; changes come in the order they were recorded,
// and one stamped earlier than the change before it counts from that
// one's time.
func (t *Timeline) Add(c *StateChange) {
	at := c.Time
	if last := t.at[len(t.at)-1]; at.Before(last) {
		at = last
	}
	t.at = append(t.at, at)
	t.snaps = append(t.snaps, c.Apply(t.snaps[len(t.snaps)-1]))
}

// Snapshot is state i: 0 the header's, i the one after the i-th change.
func (t *Timeline) Snapshot(i int) *Snapshot { return t.snaps[i] }

// Len is the number of states: the header's and one per change.
func (t *Timeline) Len() int { return len(t.snaps) }

// After is the index of the first state read after ts, or -1 when there
// is none.
func (t *Timeline) After(ts time.Time) int {
	if i := sort.Search(len(t.at), func(i int) bool { return t.at[i].After(ts) }); i > 0 && i < len(t.at) {
		return i
	}
	return -1
}

// At is the index and snapshot of the state in force at ts: the last one
// read at or before it.
func (t *Timeline) At(ts time.Time) (int, *Snapshot) {
	i := sort.Search(len(t.at), func(i int) bool { return t.at[i].After(ts) }) - 1
	i = max(i, 0) // the header's state stands for anything before it
	return i, t.snaps[i]
}
