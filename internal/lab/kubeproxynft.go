package lab

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// kubeProxyNFT is kube-proxy's nftables mode (--proxy-mode=nftables) on
// one node, in the shape the real kube-proxy v1.37.2 writes: every sync is
// the transaction its pkg/proxy/nftables/proxier.go builds (setupNFTables
// and syncProxyRules), written as knftables writes it (one `nft -f -`
// per sync, after knftables.New's `nft --check` of a test table) into the
// node's namespace. Line numbers below are of proxier.go at v1.37.2. (Its
// NFTablesNetlink feature, on by default, makes knftables list objects over
// netlink; transactions still go through `nft -f -`.)
//
// The configuration is a single-stack IPv4 cluster's defaults, as in
// tests/controlplane/kubeproxy's harness: the masquerade bit 14,
// detectLocalMode ClusterCIDR, and --nodeport-addresses=primary (the
// nftables mode's default); the alpha feature
// KubeProxyNFTablesLocalhostNodePorts is off (its default). kube-proxy
// still runs its IPv6 proxier too (NewDualStackProxier), which writes an
// empty `table ip6 kube-proxy`: with no IPv6 node address its NodePorts
// match every local address, and it detects no local traffic and knows no
// service CIDR. On a dual-stack node (dualStackIPv6Proxier) it has the
// node's IPv6 address, cluster CIDR and service CIDR and serves the IPv6
// side of dual-stack Services. TestKubeProxyNFTMatchesRealKubeProxy checks
// the lab writes what the real kube-proxy v1.37.2 wrote
// (internal/nft/testdata), and tests/controlplane/kubeproxy's
// TestStandInNFTablesMatchesKubeProxy(DualStack) holds both shapes against
// the real one running.
type kubeProxyNFT struct {
	n        *node
	services []*service
	v4, v6   *kpFamily
}

// kpFamily is one of kube-proxy's single-stack proxiers, with its own
// table and knftables instance.
type kpFamily struct {
	nft, addr    string // "ip", "ipv4_addr"
	notLocalhost string // matchNotLocalhost
	// nodeIPs are @nodeport-ips; none means every local address
	// (nodePortAddresses.MatchAll).
	nodeIPs []string
	// clusterCIDR ("": no local traffic detector) and serviceCIDR ("": no
	// drop of unallocated ClusterIPs).
	clusterCIDR, serviceCIDR string
	// flushed is proxier.flushed: the first sync of a kube-proxy process
	// adds and deletes every base chain, so they are created anew.
	flushed bool
}

func (f *kpFamily) table() string { return f.nft + " kube-proxy" }

func ipv4Proxier(nodeIP, clusterCIDR, serviceCIDR string) *kpFamily {
	return &kpFamily{nft: "ip", addr: "ipv4_addr", notLocalhost: "ip daddr != 127.0.0.0/8",
		nodeIPs: []string{nodeIP}, clusterCIDR: clusterCIDR, serviceCIDR: serviceCIDR}
}

func ipv6Proxier() *kpFamily {
	return &kpFamily{nft: "ip6", addr: "ipv6_addr", notLocalhost: "ip6 daddr != ::1"}
}

// dualStackIPv6Proxier is the IPv6 proxier on a dual-stack node: it has
// the node's IPv6 address, the IPv6 cluster CIDR and service CIDR, and
// serves the IPv6 side of dual-stack Services.
func dualStackIPv6Proxier(nodeIP6, clusterCIDR6, serviceCIDR6 string) *kpFamily {
	f := ipv6Proxier()
	f.nodeIPs, f.clusterCIDR, f.serviceCIDR = []string{nodeIP6}, clusterCIDR6, serviceCIDR6
	return f
}

// v6 says f is an IPv6 proxier.
func (f *kpFamily) v6() bool { return f.nft == "ip6" }

// serviceIP is s's ClusterIP of f's family ("" when s has none).
func (f *kpFamily) serviceIP(s *service) string {
	if f.v6() {
		return s.clusterIP6
	}
	return s.clusterIP
}

// podIP is an endpoint's address of f's family.
func (f *kpFamily) podIP(p *pod) string {
	if f.v6() {
		return p.ip6
	}
	return p.ip
}

// endpoint is "IP:PORT" as nft writes a DNAT target ("[IP]:PORT").
func (f *kpFamily) endpoint(p *pod, port int) string {
	return net.JoinHostPort(f.podIP(p), strconv.Itoa(port))
}

// Settings kube-proxy uses (proxier.go 60-103, 248-271).
const (
	kpMasqueradeSet = "mark set mark or 0x4000"
	serviceCIDR     = "10.96.0.0/12"
)

// kpBaseChains is nftablesBaseChains (proxier.go 395-409) with knftables'
// priorities as numbers, as knftables writes them (DNATPriority -100,
// FilterPriority 0, SNATPriority 100).
var kpBaseChains = [][3]string{
	{"filter-prerouting-pre-dnat", "filter hook prerouting", "-110"},
	{"filter-output-pre-dnat", "filter hook output", "-110"},
	{"filter-input", "filter hook input", "0"},
	{"filter-forward", "filter hook forward", "0"},
	{"filter-output", "filter hook output", "0"},
	{"nat-prerouting", "nat hook prerouting", "-100"},
	{"nat-output", "nat hook output", "-100"},
	{"nat-postrouting", "nat hook postrouting", "100"},
}

// kpJumpChains is nftablesJumpChains (proxier.go 420-438): destination,
// source, extra match.
var kpJumpChains = [][3]string{
	{"nodeport-endpoints-check", "filter-input", "ct state new"},
	{"service-endpoints-check", "filter-input", "ct state new"},
	{"service-endpoints-check", "filter-forward", "ct state new"},
	{"service-endpoints-check", "filter-output", "ct state new"},
	{"firewall-check", "filter-prerouting-pre-dnat", "ct state new"},
	{"firewall-check", "filter-output-pre-dnat", "ct state new"},
	{"services", "nat-output", ""},
	{"services", "nat-prerouting", ""},
	{"masquerading", "nat-postrouting", ""},
	{"cluster-ips-check", "filter-forward", "ct state new"},
	{"cluster-ips-check", "filter-output", "ct state new"},
}

// nftTx is a transaction of one proxier in knftables' text form.
type nftTx struct {
	f       *kpFamily
	t       string // the table, "ip kube-proxy"
	b       strings.Builder
	created map[string]bool // ensureChain's createdChains
}

func newTx(f *kpFamily) *nftTx { return &nftTx{f: f, t: f.table(), created: map[string]bool{}} }

func (tx *nftTx) op(format string, args ...any) {
	fmt.Fprintf(&tx.b, format+"\n", args...)
}

// ensureChain is proxier.go's ensureChain (445-460): add and flush once.
func (tx *nftTx) ensureChain(chain string) {
	if tx.created[chain] {
		return
	}
	tx.created[chain] = true
	tx.op("add chain %s %s", tx.t, chain)
	tx.op("flush chain %s %s", tx.t, chain)
}

func (tx *nftTx) rule(chain, rule string) { tx.op("add rule %s %s %s", tx.t, chain, rule) }

func (tx *nftTx) ruleComment(chain, rule, comment string) {
	tx.op("add rule %s %s %s comment %q", tx.t, chain, rule, comment)
}

// installKubeProxyNFT starts kube-proxy in nftables mode on n, before any
// Service exists.
func (c *cluster) installKubeProxyNFT(n *node) error {
	n.kpNFT = &kubeProxyNFT{n: n, v4: ipv4Proxier(n.ip, clusterCIDR, serviceCIDR), v6: ipv6Proxier()}
	if c.dualStack {
		n.kpNFT.v6 = dualStackIPv6Proxier(n.ip6, clusterCIDR6, serviceCIDR6)
	}
	return n.kpNFT.start()
}

// start is a kube-proxy process starting: NewDualStackProxier makes the
// IPv4 and the IPv6 proxier, each with its knftables.New (NewProxier's
// getNFTablesInterface), then each runs its first sync, a full one.
func (kp *kubeProxyNFT) start() error {
	for _, f := range []*kpFamily{kp.v4, kp.v6} {
		if err := knftablesCheck(kp.n, f.table()); err != nil {
			return fmt.Errorf("kube-proxy (nftables) on %s: %w", kp.n.name, err)
		}
		f.flushed = false
	}
	for _, f := range []*kpFamily{kp.v4, kp.v6} {
		if err := kp.sync(f, nil); err != nil {
			return err
		}
	}
	return nil
}

// restart is a new kube-proxy process (an upgrade, an OOM kill): its first
// sync is a full one that deletes and re-creates the base chains.
// Netfilter runs a newly registered hook before those of the same
// priority registered earlier, so kube-proxy's nat chains then run before
// portmap's.
func (kp *kubeProxyNFT) restart() error { return kp.start() }

// addService is the partial sync each proxier runs when a Service of its
// family appears (the IPv6 one ignores an IPv4-only Service).
func (kp *kubeProxyNFT) addService(s *service) error {
	kp.services = append(kp.services, s)
	if err := kp.sync(kp.v4, s); err != nil {
		return err
	}
	if s.clusterIP6 == "" {
		return nil
	}
	return kp.sync(kp.v6, s)
}

// sync writes one syncProxyRules transaction of proxier f: a full sync
// (setupNFTables and every Service) when changed is nil, otherwise the
// partial sync of the changed Service (every Service's elements, which
// exist already and write nothing, and the changed one's chains).
func (kp *kubeProxyNFT) sync(f *kpFamily, changed *service) error {
	tx := kp.syncTx(f, changed)
	if err := runStdin(kp.n.ns, tx.b.String(), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("kube-proxy (nftables) sync of %s on %s: %w", f.table(), kp.n.name, err)
	}
	return nil
}

func (kp *kubeProxyNFT) syncTx(f *kpFamily, changed *service) *nftTx {
	tx := newTx(f)
	if changed == nil {
		tx.setup()
	}
	for _, s := range kp.services {
		if f.serviceIP(s) != "" && (changed == nil || s == changed) {
			for _, p := range s.ports {
				kp.servicePort(tx, s, p)
			}
		}
	}
	return tx
}

// knftablesCheck is what knftables.New runs before a program's first
// transaction (knftables v0.0.22 nftables.go newInternal): `nft --check`
// of adding its table with a comment. It changes nothing but takes a
// table handle, so the handles are those the real programs get.
func knftablesCheck(n *node, table string) error {
	if err := runStdin(n.ns, fmt.Sprintf("add table %s { comment \"test\" ; }\n", table), "nft", "--check", "-f", "-"); err != nil {
		return fmt.Errorf("nft --check: %w", err)
	}
	return nil
}

// setup is setupNFTables (proxier.go 461-800).
func (tx *nftTx) setup() {
	tx.op(`add table %s { comment "rules for kube-proxy" ; }`, tx.t)
	if !tx.f.flushed {
		for _, bc := range kpBaseChains {
			tx.op("add chain %s %s", tx.t, bc[0])
			tx.op("delete chain %s %s", tx.t, bc[0])
		}
		tx.f.flushed = true
	}
	for _, bc := range kpBaseChains {
		tx.op("add chain %s %s { type %s priority %s ; }", tx.t, bc[0], bc[1], bc[2])
		tx.op("flush chain %s %s", tx.t, bc[0])
	}
	for _, j := range kpJumpChains {
		tx.ensureChain(j[0])
		tx.rule(j[1], strings.TrimSpace(j[2]+" jump "+j[0]))
	}
	for _, chain := range []string{"services", "cluster-ips-check", "masquerading"} {
		tx.ensureChain(chain)
	}
	tx.setupMasquerading()
	tx.setupClusterIPs()
	tx.setupNoEndpoints()
	tx.setupLocalhostNodePorts()
	tx.setupDispatch()
}

// setupMasquerading: proxier.go 521-544.
func (tx *nftTx) setupMasquerading() {
	a, ip := tx.f.addr, tx.f.nft
	tx.op(`add set %s hairpin-connections { type %s . %s . inet_proto . inet_service ; comment "service hairpin connections" ; }`, tx.t, a, a)
	tx.rule("masquerading", "mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random")
	tx.rule("masquerading", "ct status dnat "+ip+" saddr . "+ip+" daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random")
}

// setupClusterIPs: cluster-ips and cluster-ips-check, proxier.go 546-572.
func (tx *nftTx) setupClusterIPs() {
	tx.op(`add set %s cluster-ips { type %s ; comment "Active ClusterIPs" ; }`, tx.t, tx.f.addr)
	tx.ruleComment("cluster-ips-check", tx.f.nft+" daddr @cluster-ips reject", "Reject traffic to invalid ports of ClusterIPs")
	if tx.f.serviceCIDR != "" {
		tx.ruleComment("cluster-ips-check", tx.f.nft+" daddr { "+tx.f.serviceCIDR+" } drop", "Drop traffic to unallocated ClusterIPs")
	}
}

// setupNoEndpoints: nodeport-ips and the no-endpoint maps, proxier.go
// 574-657.
func (tx *nftTx) setupNoEndpoints() {
	f := tx.f
	tx.op(`add set %s nodeport-ips { type %s ; comment "IPs that accept NodePort traffic" ; }`, tx.t, f.addr)
	if len(f.nodeIPs) == 0 {
		tx.op("delete set %s nodeport-ips", tx.t)
	} else {
		tx.op("flush set %s nodeport-ips", tx.t)
		for _, ip := range f.nodeIPs {
			tx.op("add element %s nodeport-ips { %s }", tx.t, ip)
		}
	}
	tx.op(`add map %s no-endpoint-services { type %s . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }`, tx.t, f.addr)
	tx.op(`add map %s no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }`, tx.t)
	tx.op(`add chain %s reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }`, tx.t)
	tx.op("flush chain %s reject-chain", tx.t)
	tx.rule("reject-chain", "reject")
	tx.rule("service-endpoints-check", f.nft+" daddr . meta l4proto . th dport vmap @no-endpoint-services")
	tx.rule("nodeport-endpoints-check", tx.nodePortMatch()+" meta l4proto . th dport vmap @no-endpoint-nodeports")
}

// nodePortMatch is how the proxier matches a NodePort's address: in
// @nodeport-ips, or (MatchAll) anything but localhost.
func (tx *nftTx) nodePortMatch() string {
	if len(tx.f.nodeIPs) == 0 {
		return tx.f.notLocalhost
	}
	return tx.f.nft + " daddr @nodeport-ips"
}

// setupLocalhostNodePorts: with the feature off kube-proxy still adds and
// deletes the map, chains and counters (proxier.go 659-705).
func (tx *nftTx) setupLocalhostNodePorts() {
	tx.op(`add map %s localhost-nodeport-reject-ports { type inet_proto . inet_service : verdict ; comment "localhost NodePorts rejected by kube-proxy" ; }`, tx.t)
	tx.op("delete map %s localhost-nodeport-reject-ports", tx.t)
	for _, proto := range []string{"tcp", "udp", "sctp"} {
		tx.op("add chain %s localhost-nodeport-reject-%s", tx.t, proto)
		tx.op("delete chain %s localhost-nodeport-reject-%s", tx.t, proto)
		tx.op("add counter %s localhost-nodeport-rejected-%s", tx.t, proto)
		tx.op("delete counter %s localhost-nodeport-rejected-%s", tx.t, proto)
	}
}

// setupDispatch: firewall-check and the services chain, proxier.go
// 707-787 (masqueradeAll off).
func (tx *nftTx) setupDispatch() {
	f := tx.f
	tx.op(`add map %s firewall-ips { type %s . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }`, tx.t, f.addr)
	tx.ensureChain("firewall-check")
	tx.rule("firewall-check", f.nft+" daddr . meta l4proto . th dport vmap @firewall-ips")
	tx.op(`add map %s service-ips { type %s . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }`, tx.t, f.addr)
	tx.op(`add map %s service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }`, tx.t)
	if f.clusterCIDR != "" {
		tx.ruleComment("services", f.nft+" daddr @cluster-ips "+f.nft+" saddr != "+f.clusterCIDR+" "+kpMasqueradeSet, "masquerade clusterIP traffic from outside cluster")
	}
	tx.rule("services", f.nft+" daddr . meta l4proto . th dport vmap @service-ips")
	nodePorts := tx.nodePortMatch()
	if len(f.nodeIPs) == 0 {
		nodePorts = "fib daddr type local " + nodePorts
	}
	tx.rule("services", nodePorts+" meta l4proto . th dport vmap @service-nodeports")
}

// kpChainBase is servicePortChainNameBase (proxier.go 979-1006) with
// hashAndTruncate (957-966): "HASH-ns/name/proto/port", HASH the first 8
// characters of base32(sha256(the rest)).
func kpChainBase(s *service, p servicePort) string {
	name := fmt.Sprintf("%s/%s/%s/%s", s.namespace, s.name, p.Proto, p.Name)
	sum := sha256.Sum256([]byte(name))
	return base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + name
}

// kpPortPolicy is how one Service port's endpoints split on this node
// (proxy.CategorizeEndpoints and the policy chains, proxier.go 1317-1442).
type kpPortPolicy struct {
	base                                 string
	cluster, local                       []*pod
	hasEndpoints, hasExternal            bool
	usesCluster, usesLocal, usesExternal bool
	internalVerdict, extVerdict          string
}

func (kp *kubeProxyNFT) policy(s *service, p servicePort) kpPortPolicy {
	pp := kpPortPolicy{base: kpChainBase(s, p), cluster: s.endpoints, hasEndpoints: len(s.endpoints) > 0}
	if s.etpLocal {
		for _, ep := range s.endpoints {
			if ep.node == kp.n {
				pp.local = append(pp.local, ep)
			}
		}
	}
	pp.hasExternal = pp.hasEndpoints && (!s.etpLocal || len(pp.local) > 0)
	pp.usesCluster = len(pp.cluster) > 0
	pp.usesLocal = s.etpLocal && len(pp.local) > 0
	// ExternallyAccessible: a NodePort, an external IP or an LB IP.
	pp.usesExternal = pp.hasEndpoints && (p.NodePort > 0 || s.lbIP != "")
	switch {
	case !pp.hasEndpoints:
		pp.internalVerdict, pp.extVerdict = "goto reject-chain", "goto reject-chain"
	case !pp.hasExternal:
		pp.extVerdict = "drop"
	}
	return pp
}

// servicePort writes one Service port: its chains and its elements
// (proxier.go 1306-1822, without session affinity, external IPs and
// LoadBalancer source ranges, which the lab does not use).
func (kp *kubeProxyNFT) servicePort(tx *nftTx, s *service, p servicePort) {
	pp := kp.policy(s, p)
	// allLocallyReachableEndpoints is the cluster endpoints: the Local
	// ones are a subset of them (internalTrafficPolicy stays Cluster).
	for _, ep := range pp.cluster {
		if ep.node == kp.n {
			ip := tx.f.podIP(ep)
			tx.op("add element %s hairpin-connections { %s . %s . %s . %d }", tx.t, ip, ip, p.Proto, p.TargetPort)
		}
	}
	if pp.usesCluster {
		tx.ensureChain("service-" + pp.base)
	}
	if pp.usesLocal {
		tx.ensureChain("local-" + pp.base)
	}
	if pp.usesExternal {
		tx.ensureChain("external-" + pp.base)
	}
	kp.elements(tx, s, p, pp)
	if pp.usesExternal {
		kp.externalChain(tx, s, pp)
	}
	if pp.usesCluster {
		kp.endpointDNATs(tx, "service-"+pp.base, p, pp.cluster)
	}
	if pp.usesLocal {
		kp.endpointDNATs(tx, "local-"+pp.base, p, pp.local)
	}
}

// elements: cluster-ips, service-ips, service-nodeports and the
// no-endpoint maps (proxier.go 1444-1638).
func (kp *kubeProxyNFT) elements(tx *nftTx, s *service, p servicePort, pp kpPortPolicy) {
	comment := s.portName(p)
	key := func(ip string) string { return fmt.Sprintf("%s . %s . %d", ip, p.Proto, p.Port) }
	clusterIP := tx.f.serviceIP(s)
	tx.op("add element %s cluster-ips { %s }", tx.t, clusterIP)
	if pp.hasEndpoints {
		tx.op("add element %s service-ips { %s : goto service-%s }", tx.t, key(clusterIP), pp.base)
	} else {
		tx.op("add element %s no-endpoint-services { %s comment %q : %s }", tx.t, key(clusterIP), comment, pp.internalVerdict)
	}
	if s.lbIP != "" && !tx.f.v6() { // the lab's LB IPs are IPv4
		if pp.hasEndpoints {
			tx.op("add element %s service-ips { %s : goto external-%s }", tx.t, key(s.lbIP), pp.base)
		}
		if !pp.hasExternal {
			tx.op("add element %s no-endpoint-services { %s comment %q : %s }", tx.t, key(s.lbIP), comment, pp.extVerdict)
		}
	}
	if p.NodePort == 0 {
		return
	}
	np := p.Proto + " . " + strconv.Itoa(p.NodePort)
	if pp.hasEndpoints {
		tx.op("add element %s service-nodeports { %s : goto external-%s }", tx.t, np, pp.base)
	}
	if !pp.hasExternal {
		tx.op("add element %s no-endpoint-nodeports { %s comment %q : %s }", tx.t, np, comment, pp.extVerdict)
	}
}

// externalChain: the external-HASH chain's rules (proxier.go 1640-1714).
func (kp *kubeProxyNFT) externalChain(tx *nftTx, s *service, pp kpPortPolicy) {
	ext, svc := "external-"+pp.base, "service-"+pp.base
	if !s.etpLocal {
		tx.ruleComment(ext, kpMasqueradeSet, "masquerade")
	} else {
		tx.ruleComment(ext, tx.f.nft+" saddr "+tx.f.clusterCIDR+" goto "+svc, "short-circuit pod traffic")
		tx.ruleComment(ext, "fib saddr type local "+kpMasqueradeSet, "masquerade local traffic")
		tx.ruleComment(ext, "fib saddr type local goto "+svc, "short-circuit local traffic")
	}
	if pp.hasExternal {
		policyChain := svc
		if s.etpLocal {
			policyChain = "local-" + pp.base
		}
		tx.rule(ext, "goto "+policyChain)
	}
}

// endpointDNATs is writeServiceToEndpointDNATs (proxier.go 1923-1972): one
// DNAT for a single endpoint, else one DNAT whose target a numgen map
// picks.
func (kp *kubeProxyNFT) endpointDNATs(tx *nftTx, chain string, p servicePort, eps []*pod) {
	if len(eps) == 1 {
		tx.rule(chain, fmt.Sprintf("meta l4proto %s dnat to %s", p.Proto, tx.f.endpoint(eps[0], p.TargetPort)))
		return
	}
	var elems []string
	for i, ep := range eps {
		elems = append(elems, fmt.Sprintf("%d : %s . %d", i, tx.f.podIP(ep), p.TargetPort))
	}
	tx.rule(chain, fmt.Sprintf("meta l4proto %s dnat %s addr . port to numgen random mod %d map { %s }",
		p.Proto, tx.f.nft, len(eps), strings.Join(elems, " , ")))
}
