package enrich

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich/node"
	"github.com/tracer-dev/tracer/internal/nft"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Metadata is the cluster side of an Env: the live metadata index, or the
// pods and Services recorded in a trace.
type Metadata interface {
	PodByIP(a netip.Addr, at time.Time) (trace.PodRef, bool)
	PodNode(p trace.PodRef) string
	// ServiceByAddr: nodeAddr says a is one of the node's own addresses
	// (so NodePorts apply).
	ServiceByAddr(a netip.Addr, port uint16, proto string, nodeAddr bool, at time.Time) (trace.ServiceRef, bool)
	Service(ref trace.ServiceRef) (trace.Service, bool)
	// HostNetworkPod is the hostNetwork pod on node declaring the port.
	HostNetworkPod(proto string, port uint16, node string) (trace.PodRef, bool)
}

// NodeEnv is an Env built from a node snapshot (the trace header's, or one
// the node watcher took) plus a metadata source. It is immutable: the live
// pipeline builds a new one when the node changes.
type NodeEnv struct {
	name      string
	rules4    *rules.Ruleset
	rules6    *rules.Ruleset
	node      *rules.MemNode
	kubeIPVS  map[netip.Addr]bool
	svcPorts  map[netip.Addr][]string
	ipvs      map[ipvsKey]trace.IPVSService
	listeners []trace.Listener
	// listenAt is each listener's address, read once: Listener is asked
	// for every flow that reaches a local port.
	listenAt []netip.AddrPort
	nft      *nft.Ruleset
	nftErr   error
	meta     Metadata
	attrs    *attributionCache
	shared   *nameCache
}

var _ Env = (*NodeEnv)(nil)

// ipvsKey is an IPVS virtual service: protocol and address.
type ipvsKey struct {
	proto string
	vip   netip.AddrPort
}

// kubeProxyServiceSets are the ipsets whose ip,proto:port members are the
// service ports KUBE-IPVS-FILTER lets through. kube-proxy names a set's
// IPv6 twin with the prefix KUBE-6- (pkg/proxy/ipvs/ipset.go NewIPSet), so
// a dual-stack node has both.
var kubeProxyServiceSets = []string{
	"KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL",
	"KUBE-6-CLUSTER-IP", "KUBE-6-LOAD-BALANCER", "KUBE-6-EXTERNAL-IP", "KUBE-6-EXTERNAL-IP-LOCAL",
}

// NewSnapshotEnv builds the Env of node name from snap with the pods and
// Services it holds as the metadata: a trace header, or a node read now
// with the cluster's objects.
func NewSnapshotEnv(name string, snap *trace.Snapshot) (*NodeEnv, error) {
	if snap == nil {
		return NewNodeEnv(name, snap, nil)
	}
	return NewNodeEnv(name, snap, NewSnapshotMetadata(snap.Pods, snap.Services))
}

// NewNodeEnv builds the Env of node name from snap, a trace header's
// record of the node; meta may be nil (no metadata: pods and Services
// stay unnamed). A snapshot part that does not parse is an error naming
// the part.
func NewNodeEnv(name string, snap *trace.Snapshot, meta Metadata) (*NodeEnv, error) {
	st, err := node.FromSnapshot(snap)
	if err != nil {
		return nil, err
	}
	return NewStateEnv(name, st, meta), nil
}

// NewStateEnv builds the Env of node name from its state as read: the
// parsed rules and sets are the state's own, shared, not printed and
// parsed again. meta may be nil, as for NewNodeEnv.
func NewStateEnv(name string, st *node.State, meta Metadata) *NodeEnv {
	if meta == nil {
		meta = noMetadata{}
	}
	sets := st.IPSets()
	if sets == nil {
		sets = map[string]*rules.IPSet{}
	}
	e := &NodeEnv{name: name, rules4: st.Ruleset(rules.IPv4), rules6: st.Ruleset(rules.IPv6),
		// Loopback is local to every env, whatever the routes read say.
		node:     &rules.MemNode{Local: append(rules.Loopback(), st.LocalRoutes()...), Sets: sets},
		kubeIPVS: map[netip.Addr]bool{}, svcPorts: servicePorts(sets), ipvs: map[ipvsKey]trace.IPVSService{},
		meta: meta, attrs: newAttributionCache(), shared: newNameCache()}
	for _, a := range st.Addresses() {
		if a.Interface == "kube-ipvs0" {
			e.kubeIPVS[a.Prefix.Addr()] = true
		}
	}
	for _, v := range st.IPVS() {
		if v.VIP.IsValid() {
			e.ipvs[ipvsKey{v.Proto, v.VIP}] = ipvsRecord(v)
		}
	}
	for _, l := range st.Listeners() {
		e.listeners = append(e.listeners, trace.Listener{Proto: l.Proto, Address: l.Addr.String(), Process: l.Process, V6Only: l.V6Only})
		e.listenAt = append(e.listenAt, l.Addr)
	}
	if n := st.NFTRuleset(); n != nil {
		// A ruleset that does not parse leaves native attribution uncertain
		// rather than failing the whole snapshot: the iptables side and
		// everything else still stand.
		e.nft, e.nftErr = nft.Parse(n.JSON, []byte(n.Listing), n.Skip)
		if e.nftErr == nil {
			nftServicePorts(e.nft, e.svcPorts)
		}
	}
	return e
}

// ipvsRecord is a virtual server as the diagnosis quotes it.
func ipvsRecord(v node.IPVSService) trace.IPVSService {
	r := trace.IPVSService{Proto: v.Proto, Address: v.VIP.String(), Scheduler: v.Scheduler}
	for _, real := range v.Reals {
		r.Reals = append(r.Reals, real.Addr.String())
	}
	return r
}

// attributions is the env's cache of rule attributions: the env never
// changes, so neither do they.
func (e *NodeEnv) attributions() *attributionCache { return e.attrs }

// names is the env's shared copies of the names it gave flows.
func (e *NodeEnv) names() *nameCache { return e.shared }

// AttributionCacheStats is how many rule attributions the env answered
// from its cache and how many it had to walk the rules for.
func (e *NodeEnv) AttributionCacheStats() (hits, misses uint64) { return e.attrs.stats() }

// servicePorts are the "proto:port" pairs (ipset save's spelling)
// kube-proxy's service ipsets hold for each address, sorted: a set's
// members come in hash order.
func servicePorts(sets map[string]*rules.IPSet) map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	for _, name := range kubeProxyServiceSets {
		s := sets[name]
		if s == nil {
			continue
		}
		s.IPPorts(func(a netip.Addr, proto uint8, port uint16) {
			if p := rules.ProtoName(proto) + ":" + strconv.FormatUint(uint64(port), 10); !slices.Contains(out[a], p) {
				out[a] = append(out[a], p)
			}
		})
	}
	for _, ports := range out {
		slices.Sort(ports)
	}
	return out
}

// kubeProxyServiceMaps are the maps of kube-proxy's nftables mode keyed
// "address . protocol . port" by Service port: service-ips (ports with
// endpoints) and no-endpoint-services (ports without, rejected there).
// Together they are what an address accepts before cluster-ips-check
// rejects the rest, as the ipsets above are for KUBE-IPVS-FILTER.
var kubeProxyServiceMaps = []string{"service-ips", "no-endpoint-services"}

// nftServicePorts adds to out the "proto:port" pairs (the ipsets'
// spelling) kube-proxy's nftables tables accept on each address. Without
// it a node in nftables mode, which has no such ipsets, said of every
// ClusterIP that it accepted no Service port.
func nftServicePorts(rs *nft.Ruleset, out map[netip.Addr][]string) {
	touched := map[netip.Addr]bool{}
	for _, t := range rs.Tables {
		if t.Name != "kube-proxy" || (t.Family != "ip" && t.Family != "ip6") {
			continue
		}
		for _, name := range kubeProxyServiceMaps {
			s := t.Sets[name]
			if s == nil {
				continue
			}
			for _, el := range s.Elems {
				f := strings.Split(el.KeyText(), " . ")
				if len(f) != 3 {
					continue
				}
				a, err := netip.ParseAddr(f[0])
				if err != nil {
					continue
				}
				if port := f[1] + ":" + f[2]; !slices.Contains(out[a], port) {
					out[a] = append(out[a], port)
					touched[a] = true
				}
			}
		}
	}
	// Map elements come in hash order: sort, for a stable explanation.
	for a := range touched {
		slices.Sort(out[a])
	}
}

func (e *NodeEnv) NodeName() string { return e.name }

func (e *NodeEnv) OnKubeIPVS(a netip.Addr) bool { return e.kubeIPVS[a] }

func (e *NodeEnv) ServicePortsOn(a netip.Addr) []string { return e.svcPorts[a] }

func (e *NodeEnv) IPVSService(proto string, vip netip.AddrPort) (trace.IPVSService, bool) {
	s, ok := e.ipvs[ipvsKey{proto, vip}]
	return s, ok
}

// Listener finds the listening socket that would take dst, as the kernel
// picks it (trace.ListenerRank): the same port on dst's address, else on a
// wildcard address of dst's family, else a dual-stack [::] for IPv4.
func (e *NodeEnv) Listener(proto string, dst netip.AddrPort) (trace.Listener, bool) {
	best, rank := -1, 0
	for i, l := range e.listeners {
		ap := e.listenAt[i]
		if !ap.IsValid() || l.Proto != proto || ap.Port() != dst.Port() {
			continue
		}
		if r := trace.ListenerRank(ap.Addr(), l.V6Only, dst.Addr()); r > rank {
			best, rank = i, r
		}
	}
	if best < 0 {
		return trace.Listener{}, false
	}
	return e.listeners[best], true
}

func (e *NodeEnv) PodNode(p trace.PodRef) string { return e.meta.PodNode(p) }

func (e *NodeEnv) HostNetworkPod(proto string, port uint16) (trace.PodRef, bool) {
	return e.meta.HostNetworkPod(proto, port, e.name)
}

func (e *NodeEnv) Service(ref trace.ServiceRef) (trace.Service, bool) { return e.meta.Service(ref) }

func (e *NodeEnv) IsLocal(a netip.Addr) (bool, error) { return e.node.IsLocal(a) }

func (e *NodeEnv) SetMember(name string, lookups []rules.SetLookup) (bool, error) {
	return e.node.SetMember(name, lookups)
}

// NFTRuleset is the snapshot's native nftables tables.
func (e *NodeEnv) NFTRuleset() (*nft.Ruleset, error) { return e.nft, e.nftErr }

// Warnings say what of the snapshot was read but not understood.
func (e *NodeEnv) Warnings() []string {
	if e.nftErr != nil {
		return []string{"nftables ruleset not understood, native rules are not attributed: " + e.nftErr.Error()}
	}
	if e.nft != nil && len(e.nft.Warnings) > 0 {
		return append([]string{fmt.Sprintf("nftables ruleset: %d parts not understood (rules using them are attributed as uncertain)", len(e.nft.Warnings))}, e.nft.Warnings...)
	}
	return nil
}

func (e *NodeEnv) Ruleset(f rules.Family) *rules.Ruleset {
	if f == rules.IPv6 {
		return e.rules6
	}
	return e.rules4
}

func (e *NodeEnv) PodByIP(a netip.Addr, at time.Time) (trace.PodRef, bool) {
	return e.meta.PodByIP(a, at)
}

func (e *NodeEnv) ServiceByAddr(a netip.Addr, port uint16, proto string, at time.Time) (trace.ServiceRef, bool) {
	local, _ := e.node.IsLocal(a)
	return e.meta.ServiceByAddr(a, port, proto, local && !e.kubeIPVS[a], at)
}

// noMetadata is the Metadata of a trace without pods and Services.
type noMetadata struct{}

func (noMetadata) PodByIP(netip.Addr, time.Time) (trace.PodRef, bool) { return trace.PodRef{}, false }
func (noMetadata) PodNode(trace.PodRef) string                        { return "" }
func (noMetadata) ServiceByAddr(netip.Addr, uint16, string, bool, time.Time) (trace.ServiceRef, bool) {
	return trace.ServiceRef{}, false
}
func (noMetadata) Service(trace.ServiceRef) (trace.Service, bool) { return trace.Service{}, false }
func (noMetadata) HostNetworkPod(string, uint16, string) (trace.PodRef, bool) {
	return trace.PodRef{}, false
}
