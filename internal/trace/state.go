package trace

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	// PartMetadata: the change's Metadata says which pods and Services
	// came, changed or went.
	PartMetadata = "metadata"
	// PartWarnings: the change's Warnings replace the node's earlier ones
	// (none: everything could be read again).
	PartWarnings = "warnings"
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
	// Metadata is set when the cluster's pods or Services changed.
	Metadata *MetadataChange `json:"metadata,omitempty"`
	// Warnings, when Changed names them, say what of the node could not
	// be read from Time on (a tool gone, a table that failed to parse).
	Warnings []string `json:"warnings,omitempty"`
}

// MetadataChange is a delta of the pods and Services a trace knows: each
// pod and Service listed is new or replaces, whole, the one with its
// namespace and name (and, for a pod, deletion time); the gone ones left
// the metadata. A deleted pod is first replaced by itself with its
// deletion time, and leaves only when the tracer stops finding it by IP
// (its retention period), so a flow joined late still names it.
type MetadataChange struct {
	Pods         []Pod       `json:"pods,omitempty"`
	Services     []Service   `json:"services,omitempty"`
	PodsGone     []ObjectRef `json:"pods_gone,omitempty"`
	ServicesGone []ObjectRef `json:"services_gone,omitempty"`
}

// ObjectRef names a namespaced object. Deleted tells a deleted pod still
// kept from a live one of the same name (Pod.Deleted); zero otherwise.
type ObjectRef struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Deleted   time.Time `json:"deleted,omitzero"`
}

// Ref is the pod's key in a metadata delta.
func (p *Pod) Ref() ObjectRef {
	return ObjectRef{Namespace: p.Namespace, Name: p.Name, Deleted: p.Deleted}
}

// Ref is the Service's key in a metadata delta.
func (s *Service) Ref() ObjectRef { return ObjectRef{Namespace: s.Namespace, Name: s.Name} }

// Compare orders by namespace, name, then deletion (live first).
func (r ObjectRef) Compare(o ObjectRef) int {
	return cmp.Or(strings.Compare(r.Namespace, o.Namespace), strings.Compare(r.Name, o.Name), r.Deleted.Compare(o.Deleted))
}

// Apply returns base with c's parts replaced and its metadata delta
// applied; base is left as it was.
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
		case part == PartMetadata && c.Metadata != nil:
			out.Pods = c.Metadata.applyPods(out.Pods)
			out.Services = c.Metadata.applyServices(out.Services)
		}
	}
	return out
}

// NodeParts is c without its metadata delta and warnings, the change of
// the node alone; nil when c changed nothing of the node.
func (c *StateChange) NodeParts() *StateChange {
	node := slices.DeleteFunc(slices.Clone(c.Changed), func(p string) bool { return p == PartMetadata || p == PartWarnings })
	if len(node) == 0 {
		return nil
	}
	out := *c
	out.Changed, out.Metadata, out.Warnings = node, nil, nil
	return &out
}

func (m *MetadataChange) applyPods(pods []Pod) []Pod {
	if len(m.Pods) == 0 && len(m.PodsGone) == 0 {
		return pods
	}
	return applyDelta(pods, m.Pods, m.PodsGone, func(p Pod) ObjectRef { return p.Ref() })
}

func (m *MetadataChange) applyServices(svcs []Service) []Service {
	if len(m.Services) == 0 && len(m.ServicesGone) == 0 {
		return svcs
	}
	return applyDelta(svcs, m.Services, m.ServicesGone, func(s Service) ObjectRef { return s.Ref() })
}

// applyDelta returns a new list: base without the gone objects, each
// changed one replacing its namesake or added, sorted by namespace and
// name as a header lists them.
func applyDelta[T any](base, changed []T, gone []ObjectRef, key func(T) ObjectRef) []T {
	drop := make(map[ObjectRef]bool, len(gone)+len(changed))
	for _, r := range gone {
		drop[r] = true
	}
	for _, o := range changed {
		drop[key(o)] = true
	}
	out := make([]T, 0, len(base)+len(changed))
	for _, o := range base {
		if !drop[key(o)] {
			out = append(out, o)
		}
	}
	out = append(out, changed...)
	slices.SortStableFunc(out, func(a, b T) int { return key(a).Compare(key(b)) })
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
			part == PartListeners, part == PartNFTables, part == PartWarnings:
		case part == PartMetadata:
			if c.Metadata == nil {
				return errors.New(`changed part "metadata" without a metadata delta`)
			}
		case strings.HasPrefix(part, PartRules) && len(part) > len(PartRules):
		default:
			return fmt.Errorf("changed part %q is not addresses, local_routes, rules:TABLE, ipsets, ipvs, listeners, nftables, metadata or warnings", part)
		}
	}
	if c.Metadata != nil && !slices.Contains(c.Changed, PartMetadata) {
		return errors.New(`a metadata delta without "metadata" among the changed parts`)
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
