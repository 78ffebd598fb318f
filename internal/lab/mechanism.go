package lab

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Mechanism is how the node must have handled an attempt for the scenario
// to have shown what it claims. The lab proves it from the node's own
// counters and tables (Proof) before the tracer's report is compared.
type Mechanism string

const (
	// NoDecision: healthy traffic no DNAT, IPVS, REJECT or DROP touches;
	// the kernel makes no decision the tracer reports.
	NoDecision Mechanism = "no-decision"
	// ServiceDNAT: kube-proxy sent it to a backend (a KUBE-SEP DNAT rule of
	// the iptables stand-in, or an IPVS connection to a real server).
	ServiceDNAT Mechanism = "service-dnat"
	// HostportDNAT: a DNAT rule of a portmap CNI-DN chain, and no IPVS
	// virtual server counted the connection.
	HostportDNAT Mechanism = "hostport-dnat"
	// FilterReject: KUBE-IPVS-FILTER's REJECT, answered with an ICMP error.
	FilterReject Mechanism = "kube-ipvs-filter-reject"
	// PolicyReject and PolicyDrop: the lab's LAB-POLICY chain.
	PolicyReject Mechanism = "policy-reject"
	PolicyDrop   Mechanism = "policy-drop"
	// StackReset: no rule decided; the node's TCP stack sent a reset.
	StackReset Mechanism = "stack-reset"
	// NoRealServer: an IPVS virtual server without real servers, and the
	// node sent an ICMP error; KUBE-IPVS-FILTER did not reject it.
	NoRealServer Mechanism = "ipvs-no-real-server"
	// ReturnPath: kube-proxy DNAT'd it without SNAT, conntrack never saw a
	// reply, and the client reset the reply it did not expect.
	ReturnPath Mechanism = "return-path"
	// ClusterIPReject and ClusterIPDrop: kube-proxy nftables mode's
	// cluster-ips-check rejected a ClusterIP's port no Service has, or
	// dropped an address of the service CIDR no Service has.
	ClusterIPReject Mechanism = "cluster-ips-check-reject"
	ClusterIPDrop   Mechanism = "cluster-ips-check-drop"
	// NoEndpointReject and NoEndpointDrop: an element of kube-proxy
	// nftables mode's no-endpoint-services or no-endpoint-nodeports sent
	// it to reject-chain (no endpoint) or dropped it (Local policy, no
	// local endpoint).
	NoEndpointReject Mechanism = "no-endpoint-reject"
	NoEndpointDrop   Mechanism = "no-endpoint-drop"
)

// silentDrop says the node frees the packet and answers nothing: no ICMP
// error, no reset. Before 5.17 kfree_skb carries no reason, so such a drop
// looks like any other free and leaves the tracer nothing to report,
// whatever verdict its rule would have earned.
func (m Mechanism) silentDrop() bool {
	switch m {
	case PolicyDrop, ClusterIPDrop, NoEndpointDrop:
		return true
	}
	return false
}

// prove fills e.Proof from the counters around the attempt and the node's
// conntrack entry, and lists in e.Unproven whatever the mechanism needs
// that the node does not show.
func (c *cluster) prove(e *Expectation, before, after counters, ct *CTEntry) {
	p := &e.Proof
	rules := hits(before, after)
	vss := ipvsHits(after, e.Proto, e.Src)
	if len(vss) > 0 {
		p.IPVS = &vss[0]
	}
	p.Conntrack = ct
	p.NodeResets = after.snmp["Tcp:OutRsts"] - before.snmp["Tcp:OutRsts"]
	p.NodeUnreach = after.snmp["Icmp:OutDestUnreachs"] - before.snmp["Icmp:OutDestUnreachs"] +
		after.snmp["Icmp6:OutDestUnreachs"] - before.snmp["Icmp6:OutDestUnreachs"]
	p.ClientResets = after.clientResets - before.clientResets
	if name, ok := strings.CutPrefix(e.Saw, Connected("")); ok {
		p.AnsweredBy = c.podByName(name)
	}
	p.Service = c.serviceAt(e.Proto, e.Dst)
	p.DstPod = p.AnsweredBy
	if p.DstPod == "" && ct != nil {
		p.DstPod = c.podAt(hostOf(ct.ReplySrc))
	}
	if p.DstPod == "" {
		p.DstPod = c.podAt(hostOf(e.Dst))
	}
	if after.nft != nil {
		e.Unproven = c.proveNFT(e, before, after)
		return
	}
	var missing []string
	need := func(ok bool, what string, args ...any) {
		if !ok {
			missing = append(missing, fmt.Sprintf(what, args...))
		}
	}
	pick := func(table, chainPrefix, target string) {
		var found []RuleHit
		for _, r := range rules {
			if r.Table == table && strings.HasPrefix(r.Chain, chainPrefix) && strings.Contains(r.Text+" ", " -j "+target+" ") {
				found = append(found, r)
			}
		}
		need(len(found) == 1, "exactly one %s rule in %s %s* counted the attempt (found %d)", target, table, chainPrefix, len(found))
		if len(found) == 1 {
			p.Rule = &found[0]
		}
	}
	serviceDNAT := func() {
		if p.IPVS != nil {
			need(p.IPVS.Real != "", "IPVS connected it through virtual server %s to a real server", p.IPVS.Virtual)
			return
		}
		pick("nat", "KUBE-SEP-", "DNAT")
	}
	need(len(vss) <= 1, "at most one IPVS connection is the attempt's (%d are)", len(vss))
	switch e.Mechanism {
	case NoDecision:
		need(len(rules) == 0 && p.IPVS == nil, "no DNAT, REJECT or DROP rule counted it and IPVS has no connection of it (found: %s)", describeHits(rules, p.IPVS))
	case ServiceDNAT:
		serviceDNAT()
	case HostportDNAT:
		pick("nat", "CNI-DN-", "DNAT")
		need(p.IPVS == nil, "IPVS has no connection of it (found: %s)", describeHits(nil, p.IPVS))
		if p.Rule != nil {
			p.Owner = c.portmapOwner(after, p.Rule.Family, p.Rule.Chain)
			need(p.Owner != "", "portmap's CNI-HOSTPORT-DNAT jump to %s names the sandbox of a lab pod", p.Rule.Chain)
		}
	case FilterReject:
		pick("filter", "KUBE-IPVS-FILTER", "REJECT")
		need(p.NodeUnreach > 0, "the node sent an ICMP destination unreachable")
	case PolicyReject:
		pick("filter", "LAB-POLICY", "REJECT")
	case PolicyDrop:
		pick("filter", "LAB-POLICY", "DROP")
	case StackReset:
		need(len(rules) == 0, "no DNAT, REJECT or DROP rule counted it (counted: %s)", describeHits(rules, nil))
		need(p.NodeResets > 0, "the node's TCP stack sent a reset (Tcp OutRsts)")
	case NoRealServer:
		vs, reals := c.virtualServer(after, e.Proto, e.Dst)
		need(vs && reals == 0, "ipvsadm lists virtual server %s without real servers", e.Dst)
		if vs && reals == 0 {
			p.IPVS = &IPVSHit{Virtual: e.Dst}
		}
		need(!slices.ContainsFunc(rules, func(r RuleHit) bool { return r.Table == "filter" }),
			"no REJECT or DROP rule counted it (counted: %s)", describeHits(rules, nil))
		need(p.NodeUnreach > 0, "the node sent an ICMP destination unreachable")
	case ReturnPath:
		serviceDNAT()
		need(ct != nil && ct.Unreplied, "the node's conntrack entry is UNREPLIED (conntrack -L: %s)", describeCT(ct))
		need(p.ClientResets > 0, "the client's TCP stack sent a reset (Tcp OutRsts)")
	default:
		need(false, "unknown mechanism %q", e.Mechanism)
	}
	e.Unproven = missing
}

func describeHits(rules []RuleHit, vs *IPVSHit) string {
	var parts []string
	for _, r := range rules {
		parts = append(parts, fmt.Sprintf("%s %q", r.Table, r.Text))
	}
	if vs != nil {
		parts = append(parts, "virtual server "+vs.Virtual)
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

func describeCT(ct *CTEntry) string {
	if ct == nil {
		return "no entry"
	}
	return fmt.Sprintf("%s %v reply %s -> %s", ct.State, ct.Flags, ct.ReplySrc, ct.ReplyDst)
}

// portmapComment is the comment portmap puts on its CNI-HOSTPORT-DNAT jump.
var portmapComment = regexp.MustCompile(`dnat name: \\?"[^"\\]*\\?" id: \\?"([0-9a-f]+)\\?"`)

// portmapOwner finds the pod whose sandbox id portmap wrote on the
// CNI-HOSTPORT-DNAT rule that jumps to chain, in the node's own rules.
func (c *cluster) portmapOwner(after counters, family, chain string) string {
	for k := range after.rules {
		if k.family != family || k.table != "nat" || !strings.HasPrefix(k.text, "-A CNI-HOSTPORT-DNAT ") || !strings.HasSuffix(k.text, " -j "+chain) {
			continue
		}
		m := portmapComment.FindStringSubmatch(k.text)
		if m == nil {
			continue
		}
		for _, p := range c.pods {
			if p.sandboxID == m[1] {
				return p.namespace + "/" + p.name
			}
		}
	}
	return ""
}

// virtualServer says whether ipvsadm lists proto dst and how many real
// servers it has.
func (c *cluster) virtualServer(after counters, proto, dst string) (bool, int) {
	key := proto + " " + dst
	ok := after.ipvs[key]
	reals := 0
	for k := range after.ipvs {
		if strings.HasPrefix(k, key+" ") {
			reals++
		}
	}
	return ok, reals
}

func (c *cluster) podByName(name string) string {
	for _, p := range c.pods {
		if p.name == name {
			return p.namespace + "/" + p.name
		}
	}
	return ""
}

// podAt names the pod with address ip, a pod of its own namespace before a
// hostNetwork one (which shares its node's address).
func (c *cluster) podAt(ip string) string {
	found := ""
	for _, p := range c.pods {
		if p.ip != ip && (p.ip6 == "" || p.ip6 != ip) {
			continue
		}
		if !p.hostNetwork {
			return p.namespace + "/" + p.name
		}
		found = p.namespace + "/" + p.name
	}
	return found
}

// serviceAt names the Service whose ClusterIP or LB IP is dst's address,
// or whose NodePort dst is on a node's address.
func (c *cluster) serviceAt(proto, dst string) string {
	ip, port := hostOf(dst), portOf(dst)
	for _, s := range c.services {
		if ip == s.clusterIP || ip != "" && (ip == s.clusterIP6 || ip == s.lbIP || ip == s.lbIP6) {
			return s.namespace + "/" + s.name
		}
	}
	for _, n := range c.nodes {
		if n.ip != ip && (n.ip6 == "" || n.ip6 != ip) {
			continue
		}
		for _, s := range c.services {
			for _, sp := range s.ports {
				if sp.NodePort > 0 && sp.NodePort == port && sp.Proto == proto {
					return s.namespace + "/" + s.name
				}
			}
		}
	}
	return ""
}

func hostOf(endpoint string) string {
	if h, _, err := net.SplitHostPort(endpoint); err == nil {
		return h
	}
	return endpoint
}

func portOf(endpoint string) int {
	_, p, err := net.SplitHostPort(endpoint)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}
