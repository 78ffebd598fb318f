// Package trace is the tracer's recorded and streamed format (schema
// tracer/v1): NDJSON with a header, then flows (or raw events), then a
// summary. docs/trace-format.md is the user-facing description; keep the
// two in step. Every optional field is omitted when unknown, never invented.
package trace

import (
	"encoding/json"
	"net/netip"
	"strings"
	"time"
)

// Schema identifies this format in the header.
const Schema = "tracer/v1"

// Record types, the "type" field of every line.
const (
	TypeHeader  = "header"
	TypeFlow    = "flow"
	TypeEvent   = "event"
	TypeSummary = "summary"
)

// Header is the first line of every trace.
type Header struct {
	Type     string     `json:"type"`
	Schema   string     `json:"schema"`
	Node     string     `json:"node,omitempty"`
	Kernel   string     `json:"kernel,omitempty"`
	Started  time.Time  `json:"started"`
	Command  string     `json:"command,omitempty"`
	Filter   string     `json:"filter,omitempty"`
	Hooks    []Hook     `json:"hooks"`
	Snapshot *Snapshot  `json:"snapshot,omitempty"`
	Warnings []string   `json:"warnings,omitempty"`
	Netns    *NetnsInfo `json:"netns,omitempty"`
	// Conntrack is how each namespace's conntrack table was read, in
	// the order the join asks them.
	Conntrack []ConntrackSource `json:"conntrack,omitempty"`
}

// ConntrackSource is how the tracer read one namespace's conntrack table:
// what a flow's conntrack entry rests on.
type ConntrackSource struct {
	// Netns is the namespace's path, "" for the tracer's own.
	Netns string `json:"netns,omitempty"`
	Inode uint32 `json:"inode,omitempty"`
	// Lookups is how a live entry is asked for: LookupsBPF or
	// LookupsNetlink; LookupsWhy says why it is not BPF.
	Lookups    string `json:"lookups"`
	LookupsWhy string `json:"lookups_why,omitempty"`
	// Ends is how the ends of entries are learnt: EndsKernel or
	// EndsDestroyEvents.
	Ends string `json:"ends"`
}

// How conntrack is read (ConntrackSource).
const (
	// LookupsBPF: TCP and UDP entries by conntrack's bpf_xdp_ct_lookup
	// kfunc, in test runs of a program never attached; the others by
	// netlink GETs.
	LookupsBPF = "bpf"
	// LookupsNetlink: every entry by a ctnetlink GET.
	LookupsNetlink = "netlink"
	// EndsKernel: the kernel side's program on nf_ct_delete.
	EndsKernel = "nf_ct_delete"
	// EndsDestroyEvents: a ctnetlink subscription to DESTROY events.
	EndsDestroyEvents = "destroy_events"
)

// NetnsInfo names the network namespace that was observed.
type NetnsInfo struct {
	Path  string `json:"path,omitempty"`
	Inode uint32 `json:"inode"`
}

// Hook is one logical kernel hook and how it was attached.
type Hook struct {
	Hook string `json:"hook"`
	// Via is fentry, kprobe, tracepoint, netfilter or none.
	Via    string `json:"via"`
	Target string `json:"target,omitempty"`
	// Error says why Via is none, or why the better methods failed.
	Error    string    `json:"error,omitempty"`
	Attempts []Attempt `json:"attempts,omitempty"`
}

// Attempt is one rung of a hook's attach ladder.
type Attempt struct {
	Via    string `json:"via"`
	Target string `json:"target"`
	Error  string `json:"error,omitempty"`
}

// Snapshot is the node state the diagnosis used, so a trace can be
// re-diagnosed anywhere. Its parts are filled by the enrich stage.
type Snapshot struct {
	Addresses []Address `json:"addresses,omitempty"`
	// LocalRoutes are the destinations of the local routing table (what
	// -m addrtype --dst-type LOCAL matches), as prefixes.
	LocalRoutes []string          `json:"local_routes,omitempty"`
	Rules       map[string]string `json:"rules,omitempty"`  // table -> iptables-save text
	Ipsets      string            `json:"ipsets,omitempty"` // ipset save text
	IPVS        []IPVSService     `json:"ipvs,omitempty"`
	Listeners   []Listener        `json:"listeners,omitempty"`
	// NFTables is the nftables ruleset, for the native tables' rules.
	NFTables *NFTRuleset `json:"nftables,omitempty"`
	Pods     []Pod       `json:"pods,omitempty"`
	Services []Service   `json:"services,omitempty"`
}

// NFTRuleset is the node's nftables ruleset as nft printed it: JSON for the
// rules' meaning, the handle-annotated listing for their text.
type NFTRuleset struct {
	// JSON is `nft -j list ruleset`.
	JSON json.RawMessage `json:"json"`
	// Listing is `nft -a list ruleset`.
	Listing string `json:"listing,omitempty"`
	// IPTables are the tables ("family name") iptables-nft owns: their
	// rules are read from iptables-save, not from here.
	IPTables []string `json:"iptables_tables,omitempty"`
}

// Skip reports whether a table is iptables-nft's, to be left out of the
// native rules.
func (n *NFTRuleset) Skip(family, name string) bool {
	id := family + " " + name
	for _, t := range n.IPTables {
		if t == id {
			return true
		}
	}
	return false
}

// Address is one address on one interface of the node.
type Address struct {
	Interface string `json:"interface"`
	Address   string `json:"address"` // CIDR form
	Up        bool   `json:"up"`
}

// IPVSService is one IPVS virtual server and its real servers.
type IPVSService struct {
	Proto     string   `json:"proto"`
	Address   string   `json:"address"` // IP:PORT
	Scheduler string   `json:"scheduler,omitempty"`
	Reals     []string `json:"reals,omitempty"` // IP:PORT
}

// Listener is a listening socket on the node.
type Listener struct {
	Proto   string `json:"proto"`
	Address string `json:"address"` // IP:PORT
	Process string `json:"process,omitempty"`
	// V6Only is an IPv6 socket with IPV6_V6ONLY, which takes no IPv4: it
	// tells a [::] listener that takes IPv6 only from a dual-stack one.
	// Traces older than the field read as dual-stack, Linux's default.
	V6Only bool `json:"v6only,omitempty"`
}

// ListenerRank says whether a socket listening on addr (V6ONLY or not)
// takes a connection to dst, and how the kernel prefers it: 3 bound to dst
// itself, 2 a wildcard of dst's family, 1 a dual-stack [::] taking IPv4, 0
// not at all. A 0.0.0.0 socket takes no IPv6. The live node state and a
// trace's replay both ask it, so they name the same listener.
func ListenerRank(addr netip.Addr, v6only bool, dst netip.Addr) int {
	dst = dst.Unmap()
	switch {
	case !addr.IsValid() || !dst.IsValid():
		return 0
	case addr.Unmap() == dst:
		return 3
	case !addr.IsUnspecified():
		return 0
	case addr.Is4():
		if dst.Is4() {
			return 2
		}
	case dst.Is6():
		return 2
	case !v6only:
		return 1
	}
	return 0
}

// Pod is the part of a pod's metadata the tracer uses.
type Pod struct {
	Namespace   string   `json:"namespace"`
	Name        string   `json:"name"`
	IPs         []string `json:"ips,omitempty"`
	Node        string   `json:"node,omitempty"`
	HostNetwork bool     `json:"host_network,omitempty"`
	ContainerID string   `json:"container_id,omitempty"`
	HostPorts   []string `json:"host_ports,omitempty"` // proto/port
	// Deleted is when a pod the metadata still keeps (a flow may be joined
	// after its pod went) was deleted; zero while it exists. A pod
	// recreated under its name is listed twice, the live one and this.
	Deleted time.Time `json:"deleted,omitzero"`
}

// Service is the part of a Service's metadata the tracer uses.
type Service struct {
	Namespace  string        `json:"namespace"`
	Name       string        `json:"name"`
	Type       string        `json:"type,omitempty"`
	ClusterIPs []string      `json:"cluster_ips,omitempty"`
	External   []string      `json:"external_ips,omitempty"`
	LBIPs      []string      `json:"lb_ips,omitempty"`
	Ports      []ServicePort `json:"ports,omitempty"`
	ETP        string        `json:"external_traffic_policy,omitempty"`
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string `json:"name,omitempty"`
	Proto    string `json:"proto"`
	Port     uint16 `json:"port"`
	NodePort uint16 `json:"node_port,omitempty"`
	Target   string `json:"target,omitempty"`
}

// Tuple is the source and destination of a five-tuple, each as "IP:PORT",
// or a bare IP for ICMP.
type Tuple struct {
	Src string `json:"src"`
	Dst string `json:"dst"`
}

// ParseEndpoint reads one side of a Tuple: "IP:PORT", or a bare IP (ICMP)
// as port 0. Anything else gives the zero AddrPort.
func ParseEndpoint(s string) netip.AddrPort {
	// A bare IP (ICMP) is told apart first: netip's failure to read it as
	// IP:PORT allocates an error, once per ICMP flow on the hot path.
	if i := strings.LastIndexByte(s, ':'); i < 0 || strings.IndexByte(s, ':') != i && !strings.HasPrefix(s, "[") {
		if a, err := netip.ParseAddr(s); err == nil {
			return netip.AddrPortFrom(a, 0)
		}
		return netip.AddrPort{}
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap
	}
	return netip.AddrPort{}
}

// Event is one decision the kernel made, as the capture stage decoded it.
// Kinds: dnat, snat, ipvs, ipvs-no-dest, reject, reset, drop.
type Event struct {
	Type string `json:"type,omitempty"` // "event" when streamed alone
	// Node is the node that made the decision, in a flow joined from
	// several nodes' (Flow.Nodes).
	Node  string    `json:"node,omitempty"`
	Kind  string    `json:"kind"`
	Time  time.Time `json:"time"`
	Hook  string    `json:"hook"`
	Via   string    `json:"via"`
	Proto string    `json:"proto,omitempty"`
	Netns uint32    `json:"netns,omitempty"`
	// Packet is the five-tuple of the packet the decision was about
	// (reject, reset, drop), or the connection's original tuple (NAT, IPVS).
	Packet *Tuple `json:"packet,omitempty"`
	// Orig and Reply are the conntrack tuples, where the kernel had them.
	Orig  *Tuple `json:"orig,omitempty"`
	Reply *Tuple `json:"reply,omitempty"`
	// To is the NAT range chosen (IP[-IP][:PORT[-PORT]]) or the IPVS real server.
	To string `json:"to,omitempty"`
	// Virtual is the IPVS virtual server (IP:PORT).
	Virtual string `json:"virtual,omitempty"`
	// Forward is the IPVS forwarding method (masq, local, tunnel, route, bypass).
	Forward string `json:"forward,omitempty"`
	// Netfilter hook where a netfilter-tier program saw it.
	NFHook   string   `json:"nf_hook,omitempty"`
	ICMPType *uint8   `json:"icmp_type,omitempty"`
	ICMPCode *uint8   `json:"icmp_code,omitempty"`
	Reason   string   `json:"reason,omitempty"`
	CTStatus []string `json:"ct_status,omitempty"`
	CTMark   uint32   `json:"ct_mark,omitempty"`
	CTZone   uint16   `json:"ct_zone,omitempty"`
	By       string   `json:"by,omitempty"` // reset: "netfilter" (REJECT) or "stack"
	// NoConntrack: a netfilter drop of a packet that carried no conntrack
	// entry (dropped in the raw table or by conntrack itself).
	NoConntrack bool `json:"no_conntrack,omitempty"`
	// ConntrackTable is the observed namespace's conntrack table around
	// such a drop, as its counters read.
	ConntrackTable *ConntrackTable `json:"conntrack_table,omitempty"`
}

// ConntrackTable is what conntrack's own counters said around a drop
// (ctnetlink's statistics, as `conntrack -S` and `conntrack -C` print).
type ConntrackTable struct {
	// Entries is the most entries read just before and just after the
	// drop; Max is net.netfilter.nf_conntrack_max.
	Entries uint32 `json:"entries"`
	Max     uint32 `json:"max"`
	// Drops and InsertFailed are how much conntrack's "drop" and
	// "insert_failed" counters rose between those two readings.
	Drops        uint64 `json:"drops"`
	InsertFailed uint64 `json:"insert_failed,omitempty"`
}

// Full reports whether the table held its maximum.
func (c *ConntrackTable) Full() bool { return c != nil && c.Max > 0 && c.Entries >= c.Max }

// Flow is one connection with everything the tracer knows about it.
type Flow struct {
	Type string `json:"type"`
	// Node is the node whose agent saw the flow, in a stream merged from
	// several nodes (tracer connect); a single node's trace leaves it to
	// the header.
	Node string `json:"node,omitempty"`
	// Nodes, in a merged trace, are the nodes that saw one connection, in
	// the order it went through them, when it was seen on more than one:
	// the flow is then their flows joined, each event naming its node.
	Nodes       []string    `json:"nodes,omitempty"`
	Time        time.Time   `json:"time"`
	Proto       string      `json:"proto"`
	Orig        Tuple       `json:"orig"`
	Reply       *Tuple      `json:"reply,omitempty"`
	Events      []Event     `json:"events"`
	Rule        *Rule       `json:"rule,omitempty"`
	Conntrack   *Conntrack  `json:"conntrack,omitempty"`
	SrcPod      *PodRef     `json:"src_pod,omitempty"`
	DstPod      *PodRef     `json:"dst_pod,omitempty"`
	Service     *ServiceRef `json:"service,omitempty"`
	Verdict     string      `json:"verdict,omitempty"`
	Explanation string      `json:"explanation,omitempty"`
}

// Rule is the netfilter rule that made a flow's decision: an iptables
// rule (Backend "" or "iptables") or a native nftables one.
type Rule struct {
	// Backend is BackendNFTables for a native nftables rule; iptables
	// rules leave it empty (older traces never had it).
	Backend string `json:"backend,omitempty"`
	// Family, Handle and Element identify a native nftables rule: its
	// table's family (ip, ip6, inet), its handle, and the map element that
	// sent the packet to it. An ip6tables rule has Family "ip6" too.
	Family     string       `json:"family,omitempty"`
	Handle     uint64       `json:"handle,omitempty"`
	Element    *RuleElement `json:"element,omitempty"`
	Table      string       `json:"table"`
	Chain      string       `json:"chain"`
	EntryChain string       `json:"entry_chain,omitempty"`
	Path       []string     `json:"path,omitempty"`
	Text       string       `json:"text"`
	Owner      *Owner       `json:"owner,omitempty"`
	Uncertain  string       `json:"uncertain,omitempty"`
}

// BackendNFTables marks a native nftables rule; BackendIPTables may be
// given for an iptables one.
const (
	BackendNFTables = "nftables"
	BackendIPTables = "iptables"
)

// NFTables reports whether the rule is a native nftables one.
func (r *Rule) NFTables() bool { return r != nil && r.Backend == BackendNFTables }

// RuleElement is a verdict map element on a native rule's path: its key
// as nft prints it, the map it is in, and its comment (kube-proxy names the
// Service there).
type RuleElement struct {
	Map     string `json:"map,omitempty"`
	Key     string `json:"key"`
	Comment string `json:"comment,omitempty"`
}

// Owner is whose rule it is (a hostPort's pod).
type Owner struct {
	ContainerID string  `json:"container_id,omitempty"`
	Pod         *PodRef `json:"pod,omitempty"`
}

// Conntrack is the connection's conntrack entry.
type Conntrack struct {
	State  string   `json:"state,omitempty"`
	Status []string `json:"status,omitempty"`
	Mark   uint32   `json:"mark,omitempty"`
	// Unconfirmed: the entry is the one a dropped packet carried, which
	// conntrack never confirmed: every packet of the connection was
	// dropped before that, so the entry was in no table (conntrack -L and
	// conntrack -E never show it), and its status is from the drop.
	Unconfirmed bool `json:"unconfirmed,omitempty"`
	Replied     bool `json:"replied"`
}

// Unreplied reports whether c is an entry conntrack confirmed that never
// saw a reply, what conntrack -L shows as [UNREPLIED]: the connection's
// packets left, and no answer came back the way conntrack expects.
func (c *Conntrack) Unreplied() bool { return c != nil && !c.Replied && !c.Unconfirmed }

// PodRef names a pod.
type PodRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// Key is "namespace/name", or "" for no pod.
func (p *PodRef) Key() string {
	if p == nil {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

// ServiceRef names the Service a client addressed.
type ServiceRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Port      string `json:"port,omitempty"`
}

// Summary is the last line of a complete trace.
type Summary struct {
	Type         string            `json:"type"`
	Ended        time.Time         `json:"ended"`
	Flows        int               `json:"flows"`
	Events       int               `json:"events"`
	LostEvents   uint64            `json:"lost_events"`
	DecodeErrors int               `json:"decode_errors,omitempty"`
	Verdicts     map[string]int    `json:"verdicts,omitempty"`
	LostByHook   map[string]uint64 `json:"lost_by_hook,omitempty"`
	// ConntrackOverruns: the times the kernel dropped conntrack DESTROY
	// events before a tracker read them.
	ConntrackOverruns uint64 `json:"conntrack_overruns,omitempty"`
	// ConntrackEndsEvicted counts ended conntrack entries a tracker forgot,
	// its table of them full, within a flow's linger and tick of their
	// end: a flow that finished after its connection's entry ended may
	// have gone without it. The ends forgotten later are not counted: their
	// flows had been written.
	ConntrackEndsEvicted uint64 `json:"conntrack_ends_evicted,omitempty"`
	// ConntrackSourceDumpsSkipped counts flows that may be stray replies
	// (a reset or a drop without a conntrack entry) whose client
	// connection was looked for among the newest ended entries only: the
	// full search, a dump of the whole conntrack table and a walk of every
	// ended entry kept, had used its 5% of the time.
	ConntrackSourceDumpsSkipped uint64 `json:"conntrack_source_dumps_skipped,omitempty"`
	// ConntrackBPFLookups counts the entries asked for by BPF rather
	// than netlink GETs; ConntrackLookupsOff says why the lookups are
	// netlink GETs now, when they are (the header says how they began).
	ConntrackBPFLookups uint64 `json:"conntrack_bpf_lookups,omitempty"`
	ConntrackLookupsOff string `json:"conntrack_lookups_off,omitempty"`
	// UnreadAtStop is how many of LostEvents were still in the ring buffer
	// when the tracer stopped: it reads what the kernel reported before
	// the stop for up to a few seconds, then gives up on the rest.
	UnreadAtStop uint64 `json:"unread_at_stop,omitempty"`
	// StateChanges counts the state lines: node state changes recorded.
	StateChanges int `json:"state_changes,omitempty"`
	// ConntrackDrops is how much conntrack's "drop" counter rose in the
	// observed namespace while tracing: packets conntrack itself dropped,
	// its table full or an insert clash lost, whichever hooks saw them.
	ConntrackDrops uint64 `json:"conntrack_drops,omitempty"`
	// HookChanges are the hooks lost or attached while tracing.
	HookChanges []HookChange `json:"hook_changes,omitempty"`
	// TracerCPUMillis is the CPU time (user and system) the tracer's
	// process had used when it wrote the summary, TracerPeakRSSKiB its
	// peak resident size: what tracing cost the node.
	TracerCPUMillis  int64  `json:"tracer_cpu_ms,omitempty"`
	TracerPeakRSSKiB uint64 `json:"tracer_peak_rss_kib,omitempty"`
	// Nodes, in a trace merged from several agents (tracer connect), is
	// each agent's part: its counters, and the error that ended its
	// stream, if one did.
	Nodes []NodeStatus `json:"nodes,omitempty"`
}

// NodeStatus is one agent's part in a merged trace.
type NodeStatus struct {
	Node  string `json:"node,omitempty"` // from the agent's header; "" if none came
	Agent string `json:"agent"`          // the address connected to
	// Kernel, Warnings and Conntrack are the agent's header's.
	Kernel    string            `json:"kernel,omitempty"`
	Warnings  []string          `json:"warnings,omitempty"`
	Conntrack []ConntrackSource `json:"conntrack,omitempty"`
	Flows     int               `json:"flows"`
	// Dropped counts the flows the agent's buffer for this client had no
	// room for; LostEvents the kernel events the agent lost.
	Dropped    uint64 `json:"dropped"`
	LostEvents uint64 `json:"lost_events"`
	// ClockOffsetMS is the node's clock minus the client's, in ms, as
	// far as the messages' send times show (network delay included).
	ClockOffsetMS int64 `json:"clock_offset_ms"`
	// TracerCPUMillis and TracerRSSKiB are what the agent's process had
	// cost its node by its last heartbeat: CPU time and resident size.
	TracerCPUMillis int64  `json:"tracer_cpu_ms,omitempty"`
	TracerRSSKiB    uint64 `json:"tracer_rss_kib,omitempty"`
	// Error is why the stream ended early; "" when the agent ended it.
	Error string `json:"error,omitempty"`
}

// HookChange is a hook lost or attached while tracing: the module its
// function lives in was unloaded, or loaded (again).
type HookChange struct {
	Time   time.Time `json:"time"`
	Hook   string    `json:"hook"`
	Module string    `json:"module,omitempty"`
	// Via is how the hook is attached from then on; "" when it is not.
	Via string `json:"via,omitempty"`
	Why string `json:"why"`
}

// Key is "namespace/name" (without the port), or "" for no Service.
func (s *ServiceRef) Key() string {
	if s == nil {
		return ""
	}
	return s.Namespace + "/" + s.Name
}
