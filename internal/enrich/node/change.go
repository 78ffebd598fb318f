package node

import (
	"bytes"
	"reflect"
	"slices"
	"sort"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Change is what a trace records when the node's state went from old to
// cur: the parts that differ, each whole, and the warnings on what could
// not be read when they differ, at cur's read time; nil when nothing
// differs.
func Change(old, cur *State) *trace.StateChange {
	o, n := old.Snapshot(), cur.Snapshot()
	c := &trace.StateChange{Type: trace.TypeState, Time: cur.read.UTC()}
	add := func(part string) { c.Changed = append(c.Changed, part) }
	if !reflect.DeepEqual(o.Addresses, n.Addresses) {
		add(trace.PartAddresses)
		c.Snapshot.Addresses = n.Addresses
	}
	if !reflect.DeepEqual(o.LocalRoutes, n.LocalRoutes) {
		add(trace.PartLocalRoutes)
		c.Snapshot.LocalRoutes = n.LocalRoutes
	}
	var tables []string
	for t := range o.Rules {
		if _, ok := n.Rules[t]; !ok {
			tables = append(tables, t)
		}
	}
	for t, text := range n.Rules {
		if o.Rules[t] != text {
			tables = append(tables, t)
		}
	}
	sort.Strings(tables)
	for _, t := range tables {
		add(trace.PartRules + t)
		if text, ok := n.Rules[t]; ok {
			if c.Snapshot.Rules == nil {
				c.Snapshot.Rules = map[string]string{}
			}
			c.Snapshot.Rules[t] = text
		}
	}
	if o.Ipsets != n.Ipsets {
		add(trace.PartIpsets)
		c.Snapshot.Ipsets = n.Ipsets
	}
	if !reflect.DeepEqual(o.IPVS, n.IPVS) {
		add(trace.PartIPVS)
		c.Snapshot.IPVS = n.IPVS
	}
	if !reflect.DeepEqual(o.Listeners, n.Listeners) {
		add(trace.PartListeners)
		c.Snapshot.Listeners = n.Listeners
	}
	if !sameRuleset(o.NFTables, n.NFTables) {
		add(trace.PartNFTables)
		c.Snapshot.NFTables = n.NFTables
	}
	if notes := cur.Warnings(); !slices.Equal(old.Warnings(), notes) {
		add(trace.PartWarnings)
		c.Warnings = notes
	}
	if len(c.Changed) == 0 {
		return nil
	}
	return c
}

// sameRuleset: a ruleset the watcher did not re-read is the same pointer;
// one it re-read is compared as listed.
func sameRuleset(a, b *trace.NFTRuleset) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	return a.Listing == b.Listing && bytes.Equal(a.JSON, b.JSON) && reflect.DeepEqual(a.IPTables, b.IPTables)
}
