package enrich

import (
	"bufio"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

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

// NewNodeEnv builds the Env of node name from snap; meta may be nil (no
// metadata: pods and Services stay unnamed). A snapshot part that does not
// parse is an error naming the part.
func NewNodeEnv(name string, snap *trace.Snapshot, meta Metadata) (*NodeEnv, error) {
	if snap == nil {
		snap = &trace.Snapshot{}
	}
	if meta == nil {
		meta = noMetadata{}
	}
	e := &NodeEnv{name: name, node: rules.NewMemNode(), kubeIPVS: map[netip.Addr]bool{},
		svcPorts: map[netip.Addr][]string{}, ipvs: map[ipvsKey]trace.IPVSService{}, listeners: snap.Listeners, meta: meta,
		attrs: newAttributionCache(), shared: newNameCache()}
	if err := e.loadAddresses(snap); err != nil {
		return nil, err
	}
	if err := e.loadRules(snap.Rules); err != nil {
		return nil, err
	}
	if snap.Ipsets != "" {
		if err := e.node.LoadIPSetSave(strings.NewReader(snap.Ipsets)); err != nil {
			return nil, fmt.Errorf("snapshot ipsets: %w", err)
		}
		e.svcPorts = servicePorts(snap.Ipsets)
	}
	for _, s := range snap.IPVS {
		// An address that does not parse names no service a flow can reach.
		if vip, err := netip.ParseAddrPort(s.Address); err == nil {
			e.ipvs[ipvsKey{s.Proto, vip}] = s
		}
	}
	e.listenAt = make([]netip.AddrPort, len(snap.Listeners))
	for i, l := range snap.Listeners {
		e.listenAt[i], _ = netip.ParseAddrPort(l.Address) // invalid: never matches
	}
	if n := snap.NFTables; n != nil {
		// A ruleset that does not parse leaves native attribution uncertain
		// rather than failing the whole snapshot: the iptables side and
		// everything else still stand.
		e.nft, e.nftErr = nft.Parse(n.JSON, []byte(n.Listing), n.Skip)
		if e.nftErr == nil {
			nftServicePorts(e.nft, e.svcPorts)
		}
	}
	return e, nil
}

// attributions is the env's cache of rule attributions: the env never
// changes, so neither do they.
func (e *NodeEnv) attributions() *attributionCache { return e.attrs }

// names is the env's shared copies of the names it gave flows.
func (e *NodeEnv) names() *nameCache { return e.shared }

// AttributionCacheStats is how many rule attributions the env answered
// from its cache and how many it had to walk the rules for.
func (e *NodeEnv) AttributionCacheStats() (hits, misses uint64) { return e.attrs.stats() }

func (e *NodeEnv) loadAddresses(snap *trace.Snapshot) error {
	locals := snap.LocalRoutes
	if len(locals) == 0 {
		locals = []string{"127.0.0.0/8", "::1/128"}
		for _, a := range snap.Addresses {
			locals = append(locals, a.Address)
		}
	}
	for _, l := range locals {
		p, err := netip.ParsePrefix(l)
		if err != nil {
			a, aerr := netip.ParseAddr(l)
			if aerr != nil {
				return fmt.Errorf("snapshot local address %q: %w", l, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		// An interface address is local as a single address, not its subnet.
		if !slices.Contains(snap.LocalRoutes, l) && p.Addr() != netip.MustParseAddr("127.0.0.0") {
			p = netip.PrefixFrom(p.Addr(), p.Addr().BitLen())
		}
		e.node.Local = append(e.node.Local, p)
	}
	for _, a := range snap.Addresses {
		if a.Interface != "kube-ipvs0" {
			continue
		}
		p, err := netip.ParsePrefix(a.Address)
		if err != nil {
			return fmt.Errorf("snapshot address %q of kube-ipvs0: %w", a.Address, err)
		}
		e.kubeIPVS[p.Addr()] = true
	}
	return nil
}

func (e *NodeEnv) loadRules(tables map[string]string) error {
	var v4, v6 strings.Builder
	for name, text := range tables {
		if strings.HasPrefix(name, "ip6/") {
			v6.WriteString(text + "\n")
		} else {
			v4.WriteString(text + "\n")
		}
	}
	var err error
	if v4.Len() > 0 {
		if e.rules4, err = rules.ParseSaveString(v4.String(), rules.IPv4); err != nil {
			return fmt.Errorf("snapshot rules: %w", err)
		}
	}
	if v6.Len() > 0 {
		if e.rules6, err = rules.ParseSaveString(v6.String(), rules.IPv6); err != nil {
			return fmt.Errorf("snapshot ip6 rules: %w", err)
		}
	}
	return nil
}

// servicePorts reads kube-proxy's service ipsets' members ("IP,proto:port").
func servicePorts(save string) map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	sc := bufio.NewScanner(strings.NewReader(save))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[0] != "add" || !slices.Contains(kubeProxyServiceSets, f[1]) {
			continue
		}
		ip, port, ok := strings.Cut(f[2], ",")
		a, err := netip.ParseAddr(ip)
		if !ok || err != nil {
			continue
		}
		if !slices.Contains(out[a], port) {
			out[a] = append(out[a], port)
		}
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
