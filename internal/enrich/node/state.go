// Package node reads the state of one network namespace ("the node") that
// the tracer's diagnosis depends on: addresses and the local routing table,
// iptables rules, ipsets, IPVS virtual servers, native nftables tables and
// listening sockets. A State is immutable; a Watcher rebuilds it when the
// namespace changes and hands it out with an atomic load, so the joiner
// never waits for a refresh and never sees a half-built state.
//
// Everything is read, never written: the commands it runs (iptables-save,
// ip6tables-save, ipset save, nft list ruleset) only print, and it does not
// load kernel modules (IPVS is only queried when the kernel already has it).
package node

import (
	"maps"
	"time"

	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Address is one address on one interface.
type Address struct {
	Interface string
	Prefix    netip.Prefix // the address with its subnet length
	// Up is the link's administrative state. kube-ipvs0 is never up, yet
	// its addresses are local.
	Up bool
}

// Listener is a listening socket: TCP in LISTEN, or an unconnected UDP
// socket bound to a port.
type Listener struct {
	Proto string // tcp or udp
	Addr  netip.AddrPort
	// V6Only is set for an IPv6 socket that does not take IPv4 (only
	// matters for the [::] wildcard).
	V6Only  bool
	Process string // "comm[pid]" where it could be found, else ""
	Inode   uint32
}

// IPVSService is one IPVS virtual server and its real servers.
type IPVSService struct {
	Proto     string // tcp, udp, sctp, or "fwmark"
	VIP       netip.AddrPort
	FWMark    uint32
	Scheduler string
	Reals     []IPVSReal
}

// IPVSReal is a real server of a virtual server.
type IPVSReal struct {
	Addr    netip.AddrPort
	Forward string // masq, local, tunnel, route, bypass
	Weight  uint32
}

// NFTable is a native nftables table (not one of iptables-nft's), its text
// cut from `nft list ruleset` with comment lines dropped and counters and
// timers left out, so that a poll sees a change only when a rule changed.
type NFTable struct {
	Family, Name string
	Text         string
}

// State is a namespace's state at one moment. It is immutable once built;
// every method is safe for concurrent use.
type State struct {
	addrs []Address
	// local are the destinations of "local" routes in table local, which
	// is what -m addrtype --dst-type LOCAL tests.
	local []netip.Prefix
	// rulesText is iptables-save text per table, keyed "nat", "filter",
	// ... for IPv4 and "ip6/nat", ... for IPv6 (the trace format's keys).
	rulesText      map[string]string
	rules4, rules6 *rules.Ruleset
	ipsetText      string
	sets           map[string]*rules.IPSet
	ipvs           []IPVSService
	nft            []NFTable
	nftRuleset     *trace.NFTRuleset
	listeners      []Listener
	// notes say what could not be read and why (a missing tool, no IPVS
	// in the kernel), keyed by part so a refresh replaces its own note;
	// facts are the parts whose note leaves nothing unknown (a module not
	// loaded holds no rules).
	notes map[string]string
	facts map[string]bool
	mem   *rules.MemNode
	// read is when the reading of this state began: what it holds was in
	// force from then on, until the next state's read.
	read time.Time
}

// Read is when the reading of this state began.
func (s *State) Read() time.Time { return s.read }

// finish builds the derived indexes after the parts were set.
func (s *State) finish() {
	mem := &rules.MemNode{Local: s.local, Sets: s.sets}
	if mem.Sets == nil {
		mem.Sets = map[string]*rules.IPSet{}
	}
	s.mem = mem
}

// clone copies the part pointers so a refresh can replace some parts; the
// parts themselves are never modified after being built.
func (s *State) clone() *State {
	c := *s
	c.notes, c.facts = maps.Clone(s.notes), maps.Clone(s.facts)
	if c.notes == nil {
		c.notes = map[string]string{}
	}
	if c.facts == nil {
		c.facts = map[string]bool{}
	}
	return &c
}

// IsLocal reports whether a has a "local" route in the local routing table:
// what `-m addrtype --dst-type LOCAL` matches. kube-ipvs0's addresses are
// there even though the link is down.
func (s *State) IsLocal(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range s.local {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// NodeState is the State as internal/rules' evaluator wants it (IsLocal with
// an error result, ipset membership).
func (s *State) NodeState() rules.NodeState { return s.mem }

// SetMember reports whether the lookups find a member of the named ipset.
func (s *State) SetMember(name string, lookups []rules.SetLookup) (bool, error) {
	return s.mem.SetMember(name, lookups)
}

// Ruleset is the iptables rules of one family, nil when they could not be
// read (then attribution must be skipped, not guessed).
func (s *State) Ruleset(f rules.Family) *rules.Ruleset {
	if f == rules.IPv6 {
		return s.rules6
	}
	return s.rules4
}

// IPSets are the parsed sets, by name (sets of unsupported types are left
// out by the parser).
func (s *State) IPSets() map[string]*rules.IPSet { return s.sets }

// Addresses are the interface addresses.
func (s *State) Addresses() []Address { return s.addrs }

// LocalRoutes are the destinations of the local table's local routes.
func (s *State) LocalRoutes() []netip.Prefix { return s.local }

// IPVS are the virtual servers.
func (s *State) IPVS() []IPVSService { return s.ipvs }

// IPVSService finds the virtual server for proto ("tcp") and vip.
func (s *State) IPVSService(proto string, vip netip.AddrPort) (IPVSService, bool) {
	for _, v := range s.ipvs {
		if v.Proto == proto && v.VIP == vip {
			return v, true
		}
	}
	return IPVSService{}, false
}

// NFTables are the native nftables tables.
func (s *State) NFTables() []NFTable { return s.nft }

// Listeners are the listening sockets.
func (s *State) Listeners() []Listener { return s.listeners }

// Notes say which parts could not be read and why.
func (s *State) Notes() []string { return s.notesWhere(func(string) bool { return true }) }

// Warnings are the notes that leave part of the node unknown: what a
// reader of the trace must be told.
func (s *State) Warnings() []string {
	return s.notesWhere(func(part string) bool { return !s.facts[part] })
}

func (s *State) notesWhere(keep func(part string) bool) []string {
	keys := make([]string, 0, len(s.notes))
	for k := range s.notes {
		if keep(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, s.notes[k])
	}
	return out
}

// Listening finds the listening socket that would accept a connection (or
// datagram) to ap: one bound to ap's address, else a wildcard one of the
// same family (or [::] without V6ONLY for IPv4), as the kernel prefers.
func (s *State) Listening(proto string, ap netip.AddrPort) (Listener, bool) {
	best, rank := -1, 0
	for i := range s.listeners {
		l := &s.listeners[i]
		if l.Proto != proto || l.Addr.Port() != ap.Port() {
			continue
		}
		if r := trace.ListenerRank(l.Addr.Addr(), l.V6Only, ap.Addr()); r > rank {
			best, rank = i, r
		}
	}
	if best < 0 {
		return Listener{}, false
	}
	return s.listeners[best], true
}

// Snapshot is the state as a trace header records it.
func (s *State) Snapshot() *trace.Snapshot {
	snap := &trace.Snapshot{Ipsets: s.ipsetText}
	for _, a := range s.addrs {
		snap.Addresses = append(snap.Addresses, trace.Address{Interface: a.Interface, Address: a.Prefix.String(), Up: a.Up})
	}
	for _, p := range s.local {
		snap.LocalRoutes = append(snap.LocalRoutes, p.String())
	}
	if len(s.rulesText) > 0 {
		snap.Rules = make(map[string]string, len(s.rulesText))
		for k, v := range s.rulesText {
			snap.Rules[k] = v
		}
	}
	for _, v := range s.ipvs {
		ts := trace.IPVSService{Proto: v.Proto, Address: v.VIP.String(), Scheduler: v.Scheduler}
		if v.Proto == "fwmark" {
			ts.Address = strconv.FormatUint(uint64(v.FWMark), 10)
		}
		for _, r := range v.Reals {
			ts.Reals = append(ts.Reals, r.Addr.String())
		}
		snap.IPVS = append(snap.IPVS, ts)
	}
	snap.NFTables = s.nftRuleset
	for _, l := range s.listeners {
		snap.Listeners = append(snap.Listeners, trace.Listener{Proto: l.Proto, Address: l.Addr.String(), Process: l.Process, V6Only: l.V6Only})
	}
	return snap
}

// parseRulesText parses the per-table texts, IPv4 and IPv6 separately,
// sharing the rules prev4 and prev6 (the last parse, or nil) already have.
// The tables are joined in a fixed order so a parse error is reproducible.
func parseRulesText(texts map[string]string, prev4, prev6 *rules.Ruleset) (v4, v6 *rules.Ruleset, err error) {
	keys := make([]string, 0, len(texts))
	for k := range texts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b4, b6 strings.Builder
	for _, k := range keys {
		if strings.HasPrefix(k, "ip6/") {
			b6.WriteString(texts[k])
			b6.WriteString("\n")
		} else {
			b4.WriteString(texts[k])
			b4.WriteString("\n")
		}
	}
	if b4.Len() > 0 {
		if v4, err = rules.ParseSaveReusing(b4.String(), rules.IPv4, prev4); err != nil {
			return nil, nil, fmt.Errorf("parse iptables rules: %w", err)
		}
	}
	if b6.Len() > 0 {
		if v6, err = rules.ParseSaveReusing(b6.String(), rules.IPv6, prev6); err != nil {
			return nil, nil, fmt.Errorf("parse ip6tables rules: %w", err)
		}
	}
	return v4, v6, nil
}

// splitSave cuts iptables-save output into one text per table ("*nat" to
// "COMMIT"), keyed by table name with prefix, dropping the "#" comment
// lines (they carry a timestamp, which would make every poll look like a
// change). Chain counters are zeroed for the same reason: iptables-legacy
// prints them even without -c.
func splitSave(out, prefix string) map[string]string {
	tables := map[string]string{}
	var cur string
	var b strings.Builder
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimRight(line, "\r")
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
			continue
		case strings.HasPrefix(line, "*"):
			cur = strings.TrimPrefix(line, "*")
			b.Reset()
		case strings.HasPrefix(line, ":") && cur != "":
			if i := strings.LastIndex(line, " ["); i > 0 && strings.HasSuffix(line, "]") {
				line = line[:i] + " [0:0]"
			}
		}
		if cur == "" {
			continue
		}
		b.WriteString(line)
		b.WriteString("\n")
		if line == "COMMIT" {
			tables[prefix+cur] = b.String()
			cur = ""
		}
	}
	return tables
}
