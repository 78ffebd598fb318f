package lab

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
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
// The configuration is a single-stack IPv4 cluster's defaults: the
// masquerade bit 14, --cluster-cidr detection of local traffic, and
// --nodeport-addresses=primary (the nftables mode's default), so NodePorts
// are matched on @nodeport-ips holding the node's address; the alpha
// feature KubeProxyNFTablesLocalhostNodePorts is off (its default).
type kubeProxyNFT struct {
	n *node
	// flushed is proxier.flushed: the first sync of a kube-proxy process
	// adds and deletes every base chain, so they are created anew (and
	// registered with netfilter after every other table's chains).
	flushed  bool
	services []*service
	// clusterCIDR (--cluster-cidr) and serviceCIDR
	// (--service-cluster-ip-range) are the cluster's.
	clusterCIDR, serviceCIDR string
}

// Names and settings kube-proxy uses (proxier.go 60-103, 248-271).
const (
	kpTable         = "ip kube-proxy"
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

// nftTx is a transaction in knftables' text form.
type nftTx struct {
	b       strings.Builder
	created map[string]bool // ensureChain's createdChains
}

func newTx() *nftTx { return &nftTx{created: map[string]bool{}} }

func (tx *nftTx) op(format string, args ...any) {
	fmt.Fprintf(&tx.b, format+"\n", args...)
}

// ensureChain is proxier.go's ensureChain (445-460): add and flush once.
func (tx *nftTx) ensureChain(chain string) {
	if tx.created[chain] {
		return
	}
	tx.created[chain] = true
	tx.op("add chain %s %s", kpTable, chain)
	tx.op("flush chain %s %s", kpTable, chain)
}

func (tx *nftTx) rule(chain, rule string) { tx.op("add rule %s %s %s", kpTable, chain, rule) }

func (tx *nftTx) ruleComment(chain, rule, comment string) {
	tx.op("add rule %s %s %s comment %q", kpTable, chain, rule, comment)
}

// installKubeProxyNFT starts kube-proxy in nftables mode on n: its first
// sync, with no Services yet.
func (c *cluster) installKubeProxyNFT(n *node) error {
	n.kpNFT = &kubeProxyNFT{n: n, clusterCIDR: clusterCIDR, serviceCIDR: serviceCIDR}
	return n.kpNFT.start()
}

// start is a kube-proxy process starting: knftables.New (once per
// process, in NewProxier's getNFTablesInterface) and the first sync, a
// full one.
func (kp *kubeProxyNFT) start() error {
	if err := knftablesCheck(kp.n, kpTable); err != nil {
		return fmt.Errorf("kube-proxy (nftables) on %s: %w", kp.n.name, err)
	}
	kp.flushed = false
	return kp.sync(nil)
}

// restart is a new kube-proxy process (an upgrade, an OOM kill): its first
// sync is a full one that re-creates the base chains, which netfilter then
// runs after every base chain of the same priority registered before,
// portmap's included.
func (kp *kubeProxyNFT) restart() error { return kp.start() }

// addService is the partial sync kube-proxy runs when a Service appears.
func (kp *kubeProxyNFT) addService(s *service) error {
	kp.services = append(kp.services, s)
	return kp.sync(s)
}

// sync writes one syncProxyRules transaction: a full sync (setupNFTables
// and every Service) when changed is nil, otherwise the partial sync of
// the changed Service (every Service's elements, which exist already and
// write nothing, and the changed one's chains).
func (kp *kubeProxyNFT) sync(changed *service) error {
	tx := newTx()
	if changed == nil {
		kp.setup(tx)
	}
	for _, s := range kp.services {
		if changed == nil || s == changed {
			for _, p := range s.ports {
				kp.servicePort(tx, s, p)
			}
		}
	}
	if err := runStdin(kp.n.ns, tx.b.String(), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("kube-proxy (nftables) sync on %s: %w", kp.n.name, err)
	}
	return nil
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

// setup is setupNFTables (proxier.go 461-800) for IPv4.
func (kp *kubeProxyNFT) setup(tx *nftTx) {
	tx.op(`add table %s { comment "rules for kube-proxy" ; }`, kpTable)
	if !kp.flushed {
		for _, bc := range kpBaseChains {
			tx.op("add chain %s %s", kpTable, bc[0])
			tx.op("delete chain %s %s", kpTable, bc[0])
		}
		kp.flushed = true
	}
	for _, bc := range kpBaseChains {
		tx.op("add chain %s %s { type %s priority %s ; }", kpTable, bc[0], bc[1], bc[2])
		tx.op("flush chain %s %s", kpTable, bc[0])
	}
	for _, j := range kpJumpChains {
		tx.ensureChain(j[0])
		tx.rule(j[1], strings.TrimSpace(j[2]+" jump "+j[0]))
	}
	for _, chain := range []string{"services", "cluster-ips-check", "masquerading"} {
		tx.ensureChain(chain)
	}
	kp.setupMasquerading(tx)
	kp.setupClusterIPs(tx)
	kp.setupNoEndpoints(tx)
	kp.setupLocalhostNodePorts(tx)
	kp.setupDispatch(tx)
}

// setupMasquerading: proxier.go 521-544.
func (kp *kubeProxyNFT) setupMasquerading(tx *nftTx) {
	tx.op(`add set %s hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; comment "service hairpin connections" ; }`, kpTable)
	tx.rule("masquerading", "mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random")
	tx.rule("masquerading", "ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random")
}

// setupClusterIPs: cluster-ips and cluster-ips-check, proxier.go 546-572.
func (kp *kubeProxyNFT) setupClusterIPs(tx *nftTx) {
	tx.op(`add set %s cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }`, kpTable)
	tx.ruleComment("cluster-ips-check", "ip daddr @cluster-ips reject", "Reject traffic to invalid ports of ClusterIPs")
	tx.ruleComment("cluster-ips-check", "ip daddr { "+kp.serviceCIDR+" } drop", "Drop traffic to unallocated ClusterIPs")
}

// setupNoEndpoints: nodeport-ips and the no-endpoint maps, proxier.go
// 574-657, with --nodeport-addresses=primary.
func (kp *kubeProxyNFT) setupNoEndpoints(tx *nftTx) {
	tx.op(`add set %s nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }`, kpTable)
	tx.op("flush set %s nodeport-ips", kpTable)
	tx.op("add element %s nodeport-ips { %s }", kpTable, kp.n.ip)
	tx.op(`add map %s no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }`, kpTable)
	tx.op(`add map %s no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }`, kpTable)
	tx.op(`add chain %s reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }`, kpTable)
	tx.op("flush chain %s reject-chain", kpTable)
	tx.rule("reject-chain", "reject")
	tx.rule("service-endpoints-check", "ip daddr . meta l4proto . th dport vmap @no-endpoint-services")
	tx.rule("nodeport-endpoints-check", "ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports")
}

// setupLocalhostNodePorts: with the feature off kube-proxy still adds and
// deletes the map, chains and counters (proxier.go 659-705).
func (kp *kubeProxyNFT) setupLocalhostNodePorts(tx *nftTx) {
	tx.op(`add map %s localhost-nodeport-reject-ports { type inet_proto . inet_service : verdict ; comment "localhost NodePorts rejected by kube-proxy" ; }`, kpTable)
	tx.op("delete map %s localhost-nodeport-reject-ports", kpTable)
	for _, proto := range []string{"tcp", "udp", "sctp"} {
		tx.op("add chain %s localhost-nodeport-reject-%s", kpTable, proto)
		tx.op("delete chain %s localhost-nodeport-reject-%s", kpTable, proto)
		tx.op("add counter %s localhost-nodeport-rejected-%s", kpTable, proto)
		tx.op("delete counter %s localhost-nodeport-rejected-%s", kpTable, proto)
	}
}

// setupDispatch: firewall-check and the services chain, proxier.go
// 707-787 (masqueradeAll off, local traffic detected by cluster CIDR).
func (kp *kubeProxyNFT) setupDispatch(tx *nftTx) {
	tx.op(`add map %s firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }`, kpTable)
	tx.ensureChain("firewall-check")
	tx.rule("firewall-check", "ip daddr . meta l4proto . th dport vmap @firewall-ips")
	tx.op(`add map %s service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }`, kpTable)
	tx.op(`add map %s service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }`, kpTable)
	tx.ruleComment("services", "ip daddr @cluster-ips ip saddr != "+kp.clusterCIDR+" "+kpMasqueradeSet, "masquerade clusterIP traffic from outside cluster")
	tx.rule("services", "ip daddr . meta l4proto . th dport vmap @service-ips")
	tx.rule("services", "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports")
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
			tx.op("add element %s hairpin-connections { %s . %s . %s . %d }", kpTable, ep.ip, ep.ip, p.Proto, p.TargetPort)
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
	tx.op("add element %s cluster-ips { %s }", kpTable, s.clusterIP)
	if pp.hasEndpoints {
		tx.op("add element %s service-ips { %s : goto service-%s }", kpTable, key(s.clusterIP), pp.base)
	} else {
		tx.op("add element %s no-endpoint-services { %s comment %q : %s }", kpTable, key(s.clusterIP), comment, pp.internalVerdict)
	}
	if s.lbIP != "" {
		if pp.hasEndpoints {
			tx.op("add element %s service-ips { %s : goto external-%s }", kpTable, key(s.lbIP), pp.base)
		}
		if !pp.hasExternal {
			tx.op("add element %s no-endpoint-services { %s comment %q : %s }", kpTable, key(s.lbIP), comment, pp.extVerdict)
		}
	}
	if p.NodePort == 0 {
		return
	}
	np := p.Proto + " . " + strconv.Itoa(p.NodePort)
	if pp.hasEndpoints {
		tx.op("add element %s service-nodeports { %s : goto external-%s }", kpTable, np, pp.base)
	}
	if !pp.hasExternal {
		tx.op("add element %s no-endpoint-nodeports { %s comment %q : %s }", kpTable, np, comment, pp.extVerdict)
	}
}

// externalChain: the external-HASH chain's rules (proxier.go 1640-1714).
func (kp *kubeProxyNFT) externalChain(tx *nftTx, s *service, pp kpPortPolicy) {
	ext, svc := "external-"+pp.base, "service-"+pp.base
	if !s.etpLocal {
		tx.ruleComment(ext, kpMasqueradeSet, "masquerade")
	} else {
		tx.ruleComment(ext, "ip saddr "+kp.clusterCIDR+" goto "+svc, "short-circuit pod traffic")
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
		tx.rule(chain, fmt.Sprintf("meta l4proto %s dnat to %s", p.Proto, net4(eps[0].ip, p.TargetPort)))
		return
	}
	var elems []string
	for i, ep := range eps {
		elems = append(elems, fmt.Sprintf("%d : %s . %d", i, ep.ip, p.TargetPort))
	}
	tx.rule(chain, fmt.Sprintf("meta l4proto %s dnat ip addr . port to numgen random mod %d map { %s }",
		p.Proto, len(eps), strings.Join(elems, " , ")))
}
