package lab

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// service is a Kubernetes Service and its endpoints.
type service struct {
	namespace, name string
	uid             string
	typ             string // ClusterIP, NodePort or LoadBalancer
	clusterIP       string
	// clusterIP6 is a dual-stack Service's IPv6 ClusterIP
	// (ipFamilyPolicy RequireDualStack); its endpoints' IPv6 addresses
	// are the pods' ip6.
	clusterIP6      string
	lbIP            string
	lbIP6           string // a dual-stack LoadBalancer's IPv6 ingress IP
	etpLocal        bool   // externalTrafficPolicy: Local
	healthCheckPort int
	ports           []servicePort
	endpoints       []*pod
}

type servicePort struct {
	Name       string
	Proto      string // tcp or udp
	Port       int
	TargetPort int
	NodePort   int
}

// portName is kube-proxy's ServicePortName.String(): "ns/name:port".
func (s *service) portName(p servicePort) string {
	return s.namespace + "/" + s.name + ":" + p.Name
}

// kubeProxy is kube-proxy's IPVS-mode state on one node (kube-proxy-ipvs.md).
// Where the kernel has no IPVS, the virtual servers are stood in for by
// kube-proxy iptables-mode KUBE-SVC/KUBE-SEP DNAT chains jumped to exactly
// where IPVS would take the packet: just before KUBE-SERVICES' ACCEPT for
// cluster and load-balancer IPs, and after all of nat PREROUTING/OUTPUT
// (KUBE-NODEPORTS) for NodePorts, since IPVS runs at LOCAL_IN.
type kubeProxy struct {
	n    *node
	ipvs bool
	// v6 is the IPv6 proxier of a dual-stack node (NewDualStackProxier):
	// the IPv6 addresses, ip6tables, and ipsets named KUBE-6-.
	v6 bool
	// before124 reproduces kube-proxy < 1.24: an externalTrafficPolicy=Local
	// virtual server on a node without a local endpoint has no real server.
	before124 bool
	// cidr is the cluster CIDR, filled the ipsets that have entries and
	// portals the substitute's KUBE-SERVICES jumps: what the nat rules are
	// rendered from on each sync (natRules).
	cidr    string
	filled  map[string]bool
	portals []string
	// seps are the substitute's KUBE-SEP chains written so far.
	seps map[string]bool
	// newNAT is the substitute's nat rules since the last sync, in
	// iptables-restore's syntax: one restore for a Service, not one
	// iptables command per rule (each costs a quarter second under the
	// tests/vm guests' TCG, and a Service has dozens).
	newNAT []string
}

// Stand-in chain for the NodePort virtual servers, and its jump's comment.
const (
	standInNodePorts = "KUBE-NODEPORTS"
	standInComment   = "lab stand-in for IPVS NodePort virtual servers (kernel without IPVS)"
)

// ipsets kube-proxy creates, in its order.
var kubeProxyIPSets = []string{
	"KUBE-LOOP-BACK hash:ip,port,ip",
	"KUBE-CLUSTER-IP hash:ip,port",
	"KUBE-EXTERNAL-IP hash:ip,port",
	"KUBE-EXTERNAL-IP-LOCAL hash:ip,port",
	"KUBE-LOAD-BALANCER hash:ip,port",
	"KUBE-LOAD-BALANCER-FW hash:ip,port",
	"KUBE-LOAD-BALANCER-LOCAL hash:ip,port",
	"KUBE-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip",
	"KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net",
	"KUBE-NODE-PORT-TCP bitmap:port",
	"KUBE-NODE-PORT-LOCAL-TCP bitmap:port",
	"KUBE-NODE-PORT-UDP bitmap:port",
	"KUBE-NODE-PORT-LOCAL-UDP bitmap:port",
	"KUBE-NODE-PORT-SCTP-HASH hash:ip,port",
	"KUBE-NODE-PORT-LOCAL-SCTP-HASH hash:ip,port",
	"KUBE-HEALTH-CHECK-NODE-PORT bitmap:port",
	"KUBE-IPVS-IPS hash:ip",
}

// kubeProxyJumps are prepended (-I) by kube-proxy, in this order.
var kubeProxyJumps = [][]string{
	{"nat", "OUTPUT", "kubernetes service portals", "KUBE-SERVICES"},
	{"nat", "PREROUTING", "kubernetes service portals", "KUBE-SERVICES"},
	{"nat", "POSTROUTING", "kubernetes postrouting rules", "KUBE-POSTROUTING"},
	{"filter", "FORWARD", "kubernetes forwarding rules", "KUBE-FORWARD"},
	{"filter", "INPUT", "kubernetes health check rules", "KUBE-NODE-PORT"},
	{"filter", "INPUT", "kube-proxy firewall rules", "KUBE-PROXY-FIREWALL"},
	{"filter", "FORWARD", "kube-proxy firewall rules", "KUBE-PROXY-FIREWALL"},
	{"filter", "INPUT", "kubernetes ipvs access filter", "KUBE-IPVS-FILTER"},
	{"filter", "OUTPUT", "kubernetes ipvs access filter", "KUBE-IPVS-OUT-FILTER"},
}

// jumpRules inserts kubeProxyJumps in their order, as one
// iptables-restore input per table.
func jumpRules() string {
	var b strings.Builder
	for _, table := range []string{"nat", "filter"} {
		fmt.Fprintf(&b, "*%s\n", table)
		for _, j := range kubeProxyJumps {
			if j[0] == table {
				fmt.Fprintf(&b, "-I %s -m comment --comment %q -j %s\n", j[1], j[2], j[3])
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// kubeProxyNATChains are the nat chains kube-proxy's IPVS mode restores on
// every sync (declaring them in iptables-restore flushes them).
var kubeProxyNATChains = []string{"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ"}

// ipsetRules are the nat rules kube-proxy v1.37.2 writes only while their
// ipset is not empty, in its order (pkg/proxy/ipvs/proxier.go
// ipsetWithIptablesChain and the ipset comments of ipset.go): set, chain,
// the rule after "-A chain". The lab has no SCTP Services and no
// LoadBalancer source ranges, whose rules are left out.
var ipsetRules = [][3]string{
	{"KUBE-LOOP-BACK", "KUBE-POSTROUTING", `-m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE`},
	{"KUBE-LOAD-BALANCER", "KUBE-SERVICES", `-m comment --comment "Kubernetes service lb portal" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER`},
	{"KUBE-LOAD-BALANCER-LOCAL", "KUBE-LOAD-BALANCER", `-m comment --comment "Kubernetes service load balancer ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN`},
	{"KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT", `-p tcp -m comment --comment "Kubernetes nodeport TCP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN`},
	{"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT", `-p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ`},
	{"KUBE-NODE-PORT-LOCAL-UDP", "KUBE-NODE-PORT", `-p udp -m comment --comment "Kubernetes nodeport UDP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-UDP dst -j RETURN`},
	{"KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT", `-p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-UDP dst -j KUBE-MARK-MASQ`},
}

// natRules is the nat part of kube-proxy's iptables-restore payload in
// IPVS mode (writeIptablesRules), for the ipsets that now have entries
// and the cluster CIDR cidr. portals are the no-IPVS substitute's jumps to
// its KUBE-SVC chains, which go where IPVS takes over: just before
// KUBE-SERVICES' ACCEPTs.
func natRules(cidr string, filled map[string]bool, portals []string) string {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range kubeProxyNATChains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	rule := func(chain, r string) { fmt.Fprintf(&b, "-A %s %s\n", chain, r) }
	rule("KUBE-SERVICES", "-s 127.0.0.0/8 -j RETURN")
	for _, r := range ipsetRules {
		if filled[r[0]] {
			rule(r[1], r[2])
		}
	}
	if filled["KUBE-CLUSTER-IP"] {
		rule("KUBE-SERVICES", `-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s `+cidr+" -j KUBE-MARK-MASQ")
	}
	rule("KUBE-SERVICES", "-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT")
	rule("KUBE-LOAD-BALANCER", "-j KUBE-MARK-MASQ")
	for _, p := range portals {
		rule("KUBE-SERVICES", p)
	}
	for _, set := range []string{"KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER"} {
		if filled[set] {
			rule("KUBE-SERVICES", "-m set --match-set "+set+" dst,dst -j ACCEPT")
		}
	}
	rule("KUBE-POSTROUTING", "-m mark ! --mark 0x004000/0x004000 -j RETURN")
	rule("KUBE-POSTROUTING", "-j MARK --xor-mark 0x004000")
	rule("KUBE-POSTROUTING", `-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	rule("KUBE-MARK-MASQ", "-j MARK --or-mark 0x004000")
	b.WriteString("COMMIT\n")
	return b.String()
}

// kubeProxyFilterRules is the filter part of the payload, the same on
// every sync for the lab's Services.
const kubeProxyFilterRules = `*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x004000/0x004000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable
COMMIT
`

// installKubeProxy writes kube-proxy's IPVS-mode state into n: kube-ipvs0,
// the ipsets, the rules and (with IPVS) its sysctls.
func (c *cluster) installKubeProxy(n *node) error {
	kp, err := startKubeProxy(n, c.env, clusterCIDR, false)
	if err != nil {
		return err
	}
	n.kp = kp
	if !c.dualStack {
		return nil
	}
	n.kp6, err = startKubeProxy(n, c.env, clusterCIDR6, true)
	return err
}

// startKubeProxy is installKubeProxy for a cluster whose pods are in cidr
// (the rule that masquerades ClusterIP traffic from outside it): the IPv4
// proxier, or with v6 the IPv6 one, which shares kube-ipvs0 and IPVS with
// it.
func startKubeProxy(n *node, env *Env, cidr string, v6 bool) (*kubeProxy, error) {
	kp := &kubeProxy{n: n, ipvs: env.IPVS, v6: v6, cidr: cidr, filled: map[string]bool{}, seps: map[string]bool{}}
	if !v6 {
		kind := "bridge" // left down, it gives the same local routes as dummy
		if env.Dummy {
			kind = "dummy"
		}
		if _, err := n.ns.Run("ip", "link", "add", "kube-ipvs0", "type", kind); err != nil {
			return nil, fmt.Errorf("kube-proxy on %s: create kube-ipvs0: %w", n.name, err)
		}
	}
	var sets strings.Builder
	for _, s := range kubeProxyIPSets {
		name, typ, _ := strings.Cut(s, " ")
		opts := "family inet hashsize 1024 maxelem 65536"
		if v6 {
			opts = "family inet6 hashsize 1024 maxelem 65536"
		}
		if strings.HasPrefix(typ, "bitmap") {
			opts = "range 0-65535"
		}
		fmt.Fprintf(&sets, "create %s %s %s -exist\n", kp.set(name), typ, opts)
	}
	if err := runStdin(n.ns, sets.String(), "ipset", "restore"); err != nil {
		return nil, fmt.Errorf("kube-proxy on %s: create ipsets: %w", n.name, err)
	}
	if err := kp.restore(natRules(cidr, nil, nil) + kubeProxyFilterRules); err != nil {
		return nil, fmt.Errorf("kube-proxy on %s: restore rules: %w", n.name, err)
	}
	if err := kp.restore(jumpRules()); err != nil {
		return nil, fmt.Errorf("kube-proxy on %s: jumps to its chains: %w", n.name, err)
	}
	switch {
	case kp.ipvs && !v6:
		if err := kp.ipvsSysctls(); err != nil {
			return nil, err
		}
	case !kp.ipvs:
		if err := kp.installStandIn(); err != nil {
			return nil, err
		}
	}
	return kp, nil
}

// set is kube-proxy's name of ipset name for this proxier: the IPv6 one
// writes KUBE-6- for KUBE-, cut to ipset's 31 characters
// (pkg/proxy/ipvs/ipset.go NewIPSet).
func (kp *kubeProxy) set(name string) string {
	if !kp.v6 {
		return name
	}
	name = strings.Replace(name, "KUBE-", "KUBE-6-", 1)
	return name[:min(len(name), 31)]
}

// ipv6Rules turns the IPv4 proxier's rules into the IPv6 one's: its
// ipsets, its localhost (writeIptablesRules' loAddr), and REJECT's default
// for ip6tables, which ip6tables-save spells out as iptables-save does
// icmp-port-unreachable.
var ipv6Rules = strings.NewReplacer(
	"-s 127.0.0.0/8 -j RETURN", "-s ::1/128 -j RETURN",
	"--reject-with icmp-port-unreachable", "--reject-with icmp6-port-unreachable")

// restore writes rules (iptables-restore input) with this proxier's
// iptables-restore, without flushing what is there.
func (kp *kubeProxy) restore(rules string) error {
	cmd := "iptables-restore"
	if kp.v6 {
		cmd = "ip6tables-restore"
		rules = ipv6Rules.Replace(rules)
		for _, s := range kubeProxyIPSets {
			name, _, _ := strings.Cut(s, " ")
			rules = strings.ReplaceAll(rules, "--match-set "+name+" ", "--match-set "+kp.set(name)+" ")
		}
	}
	return runStdin(kp.n.ns, rules, cmd, "-w", "--noflush")
}

// iptables is this proxier's iptables command.
func (kp *kubeProxy) iptables() string {
	if kp.v6 {
		return "ip6tables"
	}
	return "iptables"
}

// serviceIP, podIP and lbIP are the addresses of this proxier's family.
func (kp *kubeProxy) serviceIP(s *service) string {
	if kp.v6 {
		return s.clusterIP6
	}
	return s.clusterIP
}

func (kp *kubeProxy) podIP(p *pod) string {
	if kp.v6 {
		return p.ip6
	}
	return p.ip
}

func (kp *kubeProxy) lbIP(s *service) string {
	if kp.v6 {
		return s.lbIP6
	}
	return s.lbIP
}

// host is an address as a one-address prefix.
func (kp *kubeProxy) host(ip string) string {
	if kp.v6 {
		return ip + "/128"
	}
	return ip + "/32"
}

func (kp *kubeProxy) ipvsSysctls() error {
	for _, k := range []string{"net.ipv4.vs.conntrack", "net.ipv4.vs.expire_nodest_conn", "net.ipv4.vs.expire_quiescent_template"} {
		if err := kp.n.ns.Sysctl(k, "1"); err != nil {
			return fmt.Errorf("kube-proxy on %s: %w", kp.n.name, err)
		}
	}
	return nil
}

func (kp *kubeProxy) installStandIn() error {
	if _, err := kp.n.ns.Run(kp.iptables(), "-w", "-t", "nat", "-N", standInNodePorts); err != nil {
		return fmt.Errorf("kube-proxy stand-in on %s: %w", kp.n.name, err)
	}
	return kp.keepStandInLast()
}

// keepStandInLast (re)appends the NodePort stand-in's jumps, so they stay
// after every other nat PREROUTING/OUTPUT rule, portmap's included: IPVS
// sees a packet only once all of nat PREROUTING is done with it.
func (kp *kubeProxy) keepStandInLast() error {
	if kp.ipvs {
		return nil
	}
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		rule := []string{chain, "-m", "comment", "--comment", standInComment, "-m", "addrtype", "--dst-type", "LOCAL", "-j", standInNodePorts}
		if _, err := kp.n.ns.Run(kp.iptables(), append([]string{"-w", "-t", "nat", "-C"}, rule...)...); err == nil {
			if _, err := kp.n.ns.Run(kp.iptables(), append([]string{"-w", "-t", "nat", "-D"}, rule...)...); err != nil {
				return fmt.Errorf("kube-proxy stand-in on %s: %w", kp.n.name, err)
			}
		}
		if _, err := kp.n.ns.Run(kp.iptables(), append([]string{"-w", "-t", "nat", "-A"}, rule...)...); err != nil {
			return fmt.Errorf("kube-proxy stand-in on %s: %w", kp.n.name, err)
		}
	}
	return nil
}

// addService makes the node's kube-proxy serve s: its addresses on
// kube-ipvs0, its ipset entries, and its virtual servers (or stand-ins).
func (kp *kubeProxy) addService(s *service) error {
	if err := kp.bindAddresses(s); err != nil {
		return err
	}
	entries, sets := kp.ipsetEntries(s)
	if err := runStdin(kp.n.ns, entries, "ipset", "restore"); err != nil {
		return fmt.Errorf("kube-proxy on %s: ipset entries of %s: %w", kp.n.name, s.name, err)
	}
	for _, set := range sets {
		kp.filled[set] = true
	}
	for _, p := range s.ports {
		var err error
		if kp.ipvs {
			err = kp.virtualServers(s, p)
		} else {
			err = kp.standInRules(s, p)
		}
		if err != nil {
			return fmt.Errorf("kube-proxy on %s: service %s: %w", kp.n.name, s.portName(p), err)
		}
	}
	return kp.syncNAT()
}

// syncNAT rewrites kube-proxy's nat chains for the ipsets' contents now,
// as each sync of the real one does: the rules of an empty ipset are not
// written.
func (kp *kubeProxy) syncNAT() error {
	if len(kp.newNAT) > 0 {
		rules := "*nat\n" + strings.Join(kp.newNAT, "\n") + "\nCOMMIT\n"
		if err := kp.restore(rules); err != nil {
			return fmt.Errorf("kube-proxy on %s: restore service chains: %w", kp.n.name, err)
		}
		kp.newNAT = nil
	}
	if err := kp.restore(natRules(kp.cidr, kp.filled, kp.portals)); err != nil {
		return fmt.Errorf("kube-proxy on %s: restore nat rules: %w", kp.n.name, err)
	}
	return nil
}

func (kp *kubeProxy) bindAddresses(s *service) error {
	for _, ip := range []string{kp.serviceIP(s), kp.lbIP(s)} {
		if ip == "" {
			continue
		}
		// nodad: kube-proxy's netlink address add is used at once.
		args := []string{"addr", "add", kp.host(ip), "dev", "kube-ipvs0"}
		if kp.v6 {
			args = append(args, "nodad")
		}
		if _, err := kp.n.ns.Run("ip", args...); err != nil {
			return fmt.Errorf("kube-proxy on %s: bind %s to kube-ipvs0: %w", kp.n.name, ip, err)
		}
	}
	return nil
}

// ipsetEntries is the ipset restore input of s's entries, and the sets
// (by their IPv4 proxier's names) it fills.
func (kp *kubeProxy) ipsetEntries(s *service) (string, []string) {
	var b strings.Builder
	var sets []string
	add := func(set, entry string) {
		fmt.Fprintf(&b, "add %s %s -exist\n", kp.set(set), entry)
		sets = append(sets, set)
	}
	lb := kp.lbIP(s)
	for _, ip := range []string{kp.serviceIP(s), lb} {
		if ip != "" {
			add("KUBE-IPVS-IPS", ip)
		}
	}
	for _, p := range s.ports {
		ipPort := func(ip string) string { return ip + "," + p.Proto + ":" + strconv.Itoa(p.Port) }
		add("KUBE-CLUSTER-IP", ipPort(kp.serviceIP(s)))
		if lb != "" {
			add("KUBE-LOAD-BALANCER", ipPort(lb))
			if s.etpLocal {
				add("KUBE-LOAD-BALANCER-LOCAL", ipPort(lb))
			}
		}
		if p.NodePort > 0 {
			proto := strings.ToUpper(p.Proto)
			add("KUBE-NODE-PORT-"+proto, strconv.Itoa(p.NodePort))
			if s.etpLocal {
				add("KUBE-NODE-PORT-LOCAL-"+proto, strconv.Itoa(p.NodePort))
			}
		}
		for _, ep := range s.endpoints {
			if ep.node == kp.n {
				ip := kp.podIP(ep)
				add("KUBE-LOOP-BACK", ip+","+p.Proto+":"+strconv.Itoa(p.TargetPort)+","+ip)
			}
		}
	}
	if s.healthCheckPort > 0 {
		add("KUBE-HEALTH-CHECK-NODE-PORT", strconv.Itoa(s.healthCheckPort))
	}
	return b.String(), sets
}

// externalEndpoints are the real servers of the external (LB, NodePort)
// virtual servers: with externalTrafficPolicy=Local the node's own
// endpoints; when it has none, all endpoints since 1.24 (PR 97081) and
// none before.
func (kp *kubeProxy) externalEndpoints(s *service) []*pod {
	if !s.etpLocal {
		return s.endpoints
	}
	var local []*pod
	for _, ep := range s.endpoints {
		if ep.node == kp.n {
			local = append(local, ep)
		}
	}
	if len(local) > 0 || kp.before124 {
		return local
	}
	return s.endpoints
}

// virtualServers adds the IPVS virtual servers of one service port.
// They go in with one `ipvsadm -R`, which takes the same commands as lines.
func (kp *kubeProxy) virtualServers(s *service, p servicePort) error {
	var b strings.Builder
	for _, args := range kp.ipvsPlan(s, p, kp.nodeAddresses()) {
		b.WriteString(strings.Join(args, " ") + "\n")
	}
	return runStdin(kp.n.ns, b.String(), "ipvsadm", "-R")
}

// ipvsPlan is the ipvsadm commands kube-proxy's IPVS state amounts to for
// one service port: a virtual server for the ClusterIP with every endpoint,
// and for the LB IP and the NodePort on each node address with the
// external endpoints; rr scheduling, masquerading, weight 1.
func (kp *kubeProxy) ipvsPlan(s *service, p servicePort, nodeAddrs []string) [][]string {
	flag := "-t"
	if p.Proto == "udp" {
		flag = "-u"
	}
	var cmds [][]string
	vs := func(addr string, eps []*pod) {
		cmds = append(cmds, []string{"-A", flag, addr, "-s", "rr"})
		for _, ep := range eps {
			cmds = append(cmds, []string{"-a", flag, addr, "-r", hostPort(kp.podIP(ep), p.TargetPort), "-m", "-w", "1"})
		}
	}
	vs(hostPort(kp.serviceIP(s), p.Port), s.endpoints)
	ext := kp.externalEndpoints(s)
	if lb := kp.lbIP(s); lb != "" {
		vs(hostPort(lb, p.Port), ext)
	}
	if p.NodePort > 0 {
		for _, ip := range nodeAddrs {
			vs(hostPort(ip, p.NodePort), ext)
		}
	}
	return cmds
}

// hostPort is "IP:PORT", "[IP]:PORT" for IPv6, as ipvsadm and iptables
// take it.
func hostPort(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

// nodeAddresses are the node's own addresses of the proxier's family
// kube-proxy binds NodePorts to: eth0's, and cni0's gateway when the
// bridge plugin has made it.
func (kp *kubeProxy) nodeAddresses() []string {
	addrs, family := []string{kp.n.ip}, "-4"
	if kp.v6 {
		addrs, family = []string{kp.n.ip6}, "-6"
	}
	out, err := kp.n.ns.Run("ip", family, "-o", "addr", "show", "dev", "cni0", "scope", "global")
	if err != nil {
		return addrs
	}
	for _, f := range strings.Fields(out) {
		if ip, _, ok := strings.Cut(f, "/"); ok && net.ParseIP(ip) != nil {
			addrs = append(addrs, ip)
		}
	}
	return addrs
}

// standInRules are kube-proxy iptables-mode style chains standing in for
// one service port's virtual servers.
func (kp *kubeProxy) standInRules(s *service, p servicePort) error {
	if len(s.endpoints) == 0 {
		return fmt.Errorf("service has no endpoints")
	}
	svcChain := kp.svcChain("KUBE-SVC-", s, p, s.endpoints)
	extChain := svcChain
	if ext := kp.externalEndpoints(s); len(ext) != len(s.endpoints) {
		if len(ext) == 0 {
			return fmt.Errorf("%w: no real server for an externalTrafficPolicy=Local virtual server cannot be stood in for by iptables", ErrNeedsIPVS)
		}
		extChain = kp.svcChain("KUBE-SVL-", s, p, ext)
	}
	name := s.portName(p)
	portal := func(ip, what, chain string) string {
		return fmt.Sprintf("-d %s -p %s -m comment --comment %q -m %s --dport %d -j %s", kp.host(ip), p.Proto, name+" "+what, p.Proto, p.Port, chain)
	}
	kp.portals = append(kp.portals, portal(kp.serviceIP(s), "cluster IP", svcChain))
	if lb := kp.lbIP(s); lb != "" {
		kp.portals = append(kp.portals, portal(lb, "loadbalancer IP", extChain))
	}
	if p.NodePort > 0 {
		kp.nat("-A", standInNodePorts, "-p", p.Proto, "-m", "comment", "--comment", name,
			"-m", p.Proto, "--dport", strconv.Itoa(p.NodePort), "-j", extChain)
	}
	return nil
}

// svcChain writes a KUBE-SVC-style chain spreading over eps, one KUBE-SEP
// chain each, and returns its name. A KUBE-SVL chain jumps to the KUBE-SEP
// chains its KUBE-SVC chain made, as in kube-proxy's iptables mode.
func (kp *kubeProxy) svcChain(prefix string, s *service, p servicePort, eps []*pod) string {
	name := s.portName(p)
	chain := prefix + portProtoHash(name, p.Proto)
	kp.nat("-N", chain)
	for i, ep := range eps {
		dest := hostPort(kp.podIP(ep), p.TargetPort)
		sep := "KUBE-SEP-" + portProtoHash(name, p.Proto+dest)
		kp.sepChain(sep, name, p, kp.podIP(ep), dest)
		jump := []string{"-A", chain, "-m", "comment", "--comment", name + " -> " + dest}
		if left := len(eps) - i; left > 1 {
			jump = append(jump, "-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%.11f", 1/float64(left)))
		}
		kp.nat(append(jump, "-j", sep)...)
	}
	return chain
}

// sepChain writes endpoint chain sep (masquerade the endpoint's own
// traffic, DNAT to dest) unless it exists already.
func (kp *kubeProxy) sepChain(sep, name string, p servicePort, ip, dest string) {
	if kp.seps[sep] {
		return
	}
	kp.nat("-N", sep)
	kp.nat("-A", sep, "-s", kp.host(ip), "-m", "comment", "--comment", name, "-j", "KUBE-MARK-MASQ")
	kp.nat("-A", sep, "-p", p.Proto, "-m", "comment", "--comment", name, "-m", p.Proto, "-j", "DNAT", "--to-destination", dest)
	kp.seps[sep] = true
}

// nat queues an iptables nat command for the next syncNAT. A new chain
// ("-N") is declared the way iptables-restore does; the substitute only
// ever declares chains it has not written before, which a declaration with
// --noflush would empty.
func (kp *kubeProxy) nat(args ...string) {
	if len(args) == 2 && args[0] == "-N" {
		kp.newNAT = append(kp.newNAT, ":"+args[1]+" - [0:0]")
		return
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = a
		if a == "" || strings.ContainsAny(a, " \t\"'\\") {
			quoted[i] = strconv.Quote(a)
		}
	}
	kp.newNAT = append(kp.newNAT, strings.Join(quoted, " "))
}

// portProtoHash is kube-proxy's chain-name hash: base32(sha256(name +
// protocol)), first 16 characters.
func portProtoHash(name, proto string) string {
	sum := sha256.Sum256([]byte(name + proto))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// runStdin runs a command inside ns with stdin.
func runStdin(ns netlab.Namespace, stdin string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := ns.RunCmd(cmd); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// addService registers s in the cluster and on every node with kube-proxy.
func (c *cluster) addService(s *service) error {
	s.uid = newUID()
	if c.dualStack {
		// RequireDualStack: an IPv6 twin of each address.
		s.clusterIP6 = ip6Of(s.clusterIP)
		if s.lbIP != "" {
			s.lbIP6 = ip6Of(s.lbIP)
		}
	}
	for _, n := range c.nodes {
		var err error
		switch {
		case n.kp != nil:
			err = n.kp.addService(s)
			if err == nil && n.kp6 != nil && s.clusterIP6 != "" {
				err = n.kp6.addService(s)
			}
		case n.kpNFT != nil:
			err = n.kpNFT.addService(s)
		}
		if err != nil {
			return err
		}
	}
	c.services = append(c.services, s)
	return nil
}
