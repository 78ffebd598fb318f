package audit

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/tracer-dev/tracer/internal/nft"
	"github.com/tracer-dev/tracer/internal/predict"
	"github.com/tracer-dev/tracer/internal/trace"
)

// candidate is one connection the node's state promises to deliver.
type candidate struct {
	conn     predict.Conn
	from, to string
	ping     bool // an echo request to a Service address
	outside  bool // the client is outside the cluster
	etpLocal bool // the Service has externalTrafficPolicy=Local
}

// clients are who connects, per address family: a pod on this node, the
// node itself, and a host outside the cluster.
type clients struct {
	pod, node map[bool]netip.Addr
	podName   map[bool]string
	// addrs are all the node's own addresses a client can reach.
	addrs []netip.Addr
}

func clientsOf(node string, snap *trace.Snapshot) clients {
	c := clients{pod: map[bool]netip.Addr{}, node: map[bool]netip.Addr{}, podName: map[bool]string{}, addrs: nodeAddrs(snap)}
	pods := slices.Clone(snap.Pods)
	// A pod with no hostPort of its own is the plainest client.
	slices.SortFunc(pods, func(a, b trace.Pod) int {
		return cmp.Or(cmp.Compare(len(a.HostPorts), len(b.HostPorts)), strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name))
	})
	for _, p := range pods {
		if p.Node != node || p.HostNetwork {
			continue
		}
		for _, s := range p.IPs {
			a, err := netip.ParseAddr(s)
			if _, have := c.pod[a.Is6()]; err == nil && !have {
				c.pod[a.Is6()], c.podName[a.Is6()] = a, "pod "+p.Namespace+"/"+p.Name
			}
		}
	}
	for _, a := range c.addrs {
		if _, have := c.node[a.Is6()]; !have {
			c.node[a.Is6()] = a
		}
	}
	return c
}

// nodeAddrs are the node's own addresses a client can reach it on.
func nodeAddrs(snap *trace.Snapshot) []netip.Addr {
	var out []netip.Addr
	for _, a := range predict.NodeAddrs(snap) {
		out = append(out, a.Addr)
	}
	return out
}

// nodePortAddrs are the node's addresses kube-proxy answers NodePorts
// on: in nftables mode its @nodeport-ips set (its --nodeport-addresses,
// the node's primary addresses by default there); in iptables and IPVS
// mode every local address.
func nodePortAddrs(all []netip.Addr, rs *nft.Ruleset) []netip.Addr {
	if rs == nil {
		return all
	}
	var out []netip.Addr
	found := false
	for _, fam := range []string{"ip", "ip6"} {
		if t := rs.Table(fam, "kube-proxy"); t != nil && t.Sets["nodeport-ips"] != nil {
			found = true
			out = append(out, t.Sets["nodeport-ips"].Addrs()...)
		}
	}
	if !found {
		return all
	}
	return out
}

// candidates lists every connection to check, and notes what cannot be.
func candidates(node string, snap *trace.Snapshot, nft *nft.Ruleset) ([]candidate, []string) {
	cl := clientsOf(node, snap)
	nodePorts := nodePortAddrs(cl.addrs, nft)
	var out []candidate
	var notes []string
	if len(snap.Services) == 0 {
		notes = append(notes, "no Service metadata (--kubeconfig or --metadata, or a trace recorded with them): only host listeners were checked")
	}
	if len(cl.pod) == 0 && len(snap.Services) > 0 {
		notes = append(notes, fmt.Sprintf("no pod of node %q in the metadata: Services were checked from the node and from outside only", node))
	}
	for _, sv := range snap.Services {
		out = append(out, serviceCandidates(sv, cl, nodePorts)...)
	}
	out = append(out, listenerCandidates(snap, cl)...)
	return out, notes
}

func serviceCandidates(sv trace.Service, cl clients, nodePorts []netip.Addr) []candidate {
	var out []candidate
	local := strings.EqualFold(sv.ETP, "Local")
	name := "Service " + sv.Namespace + "/" + sv.Name
	for _, a := range addrs(sv.ClusterIPs) {
		out = append(out, cl.fromPod(a, 0, "icmp", name, candidate{ping: true})...)
	}
	for _, sp := range sv.Ports {
		proto := strings.ToLower(sp.Proto)
		if proto != "tcp" && proto != "udp" && proto != "sctp" {
			continue
		}
		what := fmt.Sprintf("%s port %s", name, portLabel(sp))
		for _, a := range addrs(sv.ClusterIPs) {
			out = append(out, cl.fromPod(a, sp.Port, proto, what, candidate{})...)
			out = append(out, cl.fromNode(a, sp.Port, proto, what)...)
		}
		for _, a := range addrs(append(slices.Clone(sv.External), sv.LBIPs...)) {
			out = append(out, outside(a, sp.Port, proto, what, local))
			out = append(out, cl.fromPod(a, sp.Port, proto, what, candidate{etpLocal: local})...)
		}
		if sp.NodePort != 0 {
			for _, a := range nodePorts {
				out = append(out, outside(a, sp.NodePort, proto, fmt.Sprintf("NodePort of %s", what), local))
			}
		}
	}
	return out
}

func portLabel(sp trace.ServicePort) string {
	if sp.Name != "" {
		return fmt.Sprintf("%d (%s)", sp.Port, sp.Name)
	}
	return fmt.Sprint(sp.Port)
}

// addrs parses a Service's addresses, skipping "None" and the unparsable.
func addrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func dstOf(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

func label(a netip.Addr, port uint16, what string) string {
	ap := dstOf(a, port).String()
	if port == 0 {
		ap = a.String()
	}
	return ap + " (" + what + ")"
}

func (cl clients) fromPod(a netip.Addr, port uint16, proto, what string, c candidate) []candidate {
	src, ok := cl.pod[a.Is6()]
	if !ok {
		return nil
	}
	c.conn = predict.Conn{Proto: proto, Src: src, Dst: dstOf(a, port)}
	c.from, c.to = cl.podName[a.Is6()], label(a, port, what)
	return []candidate{c}
}

func (cl clients) fromNode(a netip.Addr, port uint16, proto, what string) []candidate {
	src, ok := cl.node[a.Is6()]
	if !ok {
		return nil
	}
	return []candidate{{conn: predict.Conn{Proto: proto, Src: src, Dst: dstOf(a, port)}, from: "the node", to: label(a, port, what)}}
}

func outside(a netip.Addr, port uint16, proto, what string, etpLocal bool) candidate {
	return candidate{conn: predict.Conn{Proto: proto, Src: predict.Outside[a.Is6()], Dst: dstOf(a, port)},
		from: "outside", to: label(a, port, what), outside: true, etpLocal: etpLocal}
}

// listenerCandidates: every host listener, from outside and from a pod,
// on each node address of its family (or the one it is bound to).
func listenerCandidates(snap *trace.Snapshot, cl clients) []candidate {
	var out []candidate
	for _, l := range snap.Listeners {
		ap, err := netip.ParseAddrPort(l.Address)
		if err != nil || (l.Proto != "tcp" && l.Proto != "udp") || ap.Addr().IsLoopback() {
			continue
		}
		what := "host listener"
		if l.Process != "" {
			what += " " + l.Process
		}
		for _, a := range cl.addrs {
			if ap.Addr().IsUnspecified() && trace.ListenerRank(ap.Addr(), l.V6Only, a) > 0 || ap.Addr() == a {
				out = append(out, outside(a, ap.Port(), l.Proto, what, false))
				out = append(out, cl.fromPod(a, ap.Port(), l.Proto, what, candidate{})...)
			}
		}
	}
	return out
}
