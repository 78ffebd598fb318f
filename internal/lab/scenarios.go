package lab

import (
	"context"
	"fmt"

	"github.com/tracer-dev/tracer/internal/trace"
)

// Scenarios lists the incidents in the order INCIDENTS.md tells them. Each
// Shows ends with how the scenario runs on a kernel without IPVS, so a
// listing says which kube-proxy mode a run used.
func Scenarios() []Scenario {
	all := scenarios()
	for i := range all {
		all[i].Shows += " Without IPVS: " + all[i].NoIPVS + "."
	}
	return all
}

func scenarios() []Scenario {
	return append(iptablesScenarios(), nftScenarios()...)
}

func iptablesScenarios() []Scenario {
	return []Scenario{
		{
			Name:  "hostport-hijack-clusterip",
			Title: "connecting to mysql-a's ClusterIP lands on mysql-b's hostPort",
			Shows: "seed 000: mysql-b has hostPort 3306 on node-2 (real bridge/host-local/portmap plugins); " +
				"mysql-a's ClusterIP is on kube-ipvs0, so it is LOCAL and portmap's CNI-DN chain DNATs it to mysql-b. " +
				"portmap's jump is moved ahead of KUBE-SERVICES, where portmap <= 0.7.4 put it (CVE-2019-9946), as in the seed's cluster. " +
				"Baseline: another Service and mysql-a's pod IP work.",
			NoIPVS: "runs: the hijack needs no IPVS; the baseline Service runs on kube-proxy iptables-mode KUBE-SVC/KUBE-SEP DNAT chains standing in for the IPVS virtual server",
			Build:  buildHostportClusterIP,
		},
		{
			Name:  "dualstack-hostport-hijack-clusterip",
			Title: "dual-stack: connecting to mysql-a's IPv6 ClusterIP lands on mysql-b's hostPort",
			Shows: "seed 000's IPv6 twin: mysql-a's IPv6 ClusterIP is on kube-ipvs0 too, so it is LOCAL, and portmap (Debian's, iptables backend) " +
				"writes mysql-b's hostPort 3306 into ip6tables as well, whose CNI-DN chain DNATs it to mysql-b's IPv6 address ahead of kube-proxy's IPv6 KUBE-SERVICES. " +
				"Baseline: another Service's IPv6 ClusterIP and mysql-a's IPv6 pod address work.",
			NoIPVS: "runs: the hijack needs no IPVS; the baseline runs on ip6tables KUBE-SVC/KUBE-SEP DNAT chains standing in for IPVS",
			Build:  buildDualStackHostportClusterIP,
		},
		{
			Name:  "hostport-vs-nodeport",
			Title: "a hostPort equal to a NodePort wins, whatever the creation order",
			Shows: "seed 000's nginx experiment: NodePorts 30080 (Service created before the hostPort pod) and 30081 " +
				"(pod created before the Service) are both answered by the hostPort pods: KUBE-SERVICES never ACCEPTs a NodePort, " +
				"so the packet reaches CNI-HOSTPORT-DNAT (current portmap order, appended) before IPVS sees it. Baseline: NodePort 30082 without a hostPort.",
			NoIPVS: "runs: the hijack needs no IPVS; the NodePort virtual servers are stood in for by a KUBE-NODEPORTS DNAT chain kept at the end of nat PREROUTING/OUTPUT, where IPVS would act",
			Build:  buildHostportNodePort,
		},
		{
			Name:  "dualstack-hostport-vs-nodeport",
			Title: "dual-stack: a hostPort equal to a NodePort wins over IPv6 too, whatever the creation order",
			Shows: "seed 000's nginx experiment on the node's IPv6 address: portmap writes the hostPorts into ip6tables' CNI-HOSTPORT-DNAT as into iptables', " +
				"and kube-proxy's IPv6 KUBE-SERVICES never ACCEPTs a NodePort either, so [node IPv6]:30080 and :30081 are answered by the hostPort pods. " +
				"Baseline: [node IPv6]:30082, a NodePort without a hostPort.",
			NoIPVS: "runs: the hijack needs no IPVS; the IPv6 NodePort virtual servers are stood in for by an ip6tables KUBE-NODEPORTS DNAT chain kept at the end of nat PREROUTING/OUTPUT",
			Build:  buildDualStackHostportNodePort,
		},
		{
			Name:  "hostnetwork-vs-hostport",
			Title: "a hostPort :80 bypasses the hostNetwork listener on :80",
			Shows: "seed 002: ingress-agent (hostNetwork) listens on the node's :80 and web-hp has hostPort 80; " +
				"traffic to the node address :80, from outside and from a pod, is DNAT'd to web-hp and never reaches the listener. " +
				"Baseline: the listener's other port works.",
			NoIPVS: "runs unchanged: no kube-proxy is involved",
			Build:  buildHostNetworkHostPort,
		},
		{
			Name:  "dualstack-hostnetwork-vs-hostport",
			Title: "dual-stack: a hostPort :80 bypasses the hostNetwork listener on :80, over IPv6 as over IPv4",
			Shows: "seed 002 on dual-stack nodes: host-local gives every pod an IPv4 and an IPv6 address, and portmap writes its hostPort DNAT " +
				"in ip6tables as in iptables; ingress-agent's listener takes both families on one socket. The node's [IPv6]:80, from outside " +
				"and from a pod, is DNAT'd by portmap's ip6tables rule to web-hp and never reaches the listener, as IPv4 is. Baseline: the listener's other port over IPv6.",
			NoIPVS: "runs unchanged: no kube-proxy is involved",
			Build:  buildHostNetworkHostPortDualStack,
		},
		{
			Name:  "ping-clusterip",
			Title: "ping to a ClusterIP: Destination Port Unreachable from KUBE-IPVS-FILTER",
			Shows: "seed 003: kube-proxy >= 1.26 rejects in filter INPUT anything to a kube-ipvs0 address that is not a service ip,port: " +
				"ICMP echo and TCP to a non-service port. Baseline: TCP to the service port, ping to the pod IP.",
			NoIPVS: "runs: KUBE-IPVS-FILTER is plain filter INPUT; the service port runs on KUBE-SVC/KUBE-SEP DNAT chains standing in for IPVS",
			Build:  buildPingClusterIP,
		},
		{
			Name:  "dualstack-ping-clusterip",
			Title: "dual-stack: ping6 to an IPv6 ClusterIP, ICMPv6 port unreachable from the IPv6 KUBE-IPVS-FILTER",
			Shows: "seed 003's IPv6 twin: kube-proxy's IPv6 proxier (IPVS mode) binds a RequireDualStack Service's IPv6 ClusterIP to kube-ipvs0, fills the KUBE-6- ipsets " +
				"and rejects in ip6tables' filter INPUT what is no service ip,port: ICMPv6 echo and TCP to a non-service port get ICMPv6 port unreachable. " +
				"Baseline: TCP to the service port over IPv6 (and IPv4), ping6 to the pod.",
			NoIPVS: "runs: KUBE-IPVS-FILTER is plain ip6tables filter INPUT; the IPv6 service port runs on ip6tables KUBE-SVC/KUBE-SEP DNAT chains standing in for IPVS",
			Build:  buildDualStackPingClusterIP,
		},
		{
			Name:  "lb-port-outside-cluster",
			Title: "an LB IP port that belongs outside the cluster is refused from pods",
			Shows: "seed 004 part 1: the LoadBalancer IP is on kube-ipvs0 of every node, so in-cluster traffic never leaves the node: " +
				":80 (a virtual server) works, :443 (served by the cloud LB for something outside the cluster) is rejected by KUBE-IPVS-FILTER.",
			NoIPVS: "runs: the rejection is filter INPUT; :80 runs on KUBE-SVC/KUBE-SEP DNAT chains standing in for IPVS",
			Build:  buildLBPortOutside,
		},
		{
			Name:  "dualstack-lb-port-outside-cluster",
			Title: "dual-stack: an IPv6 LB IP port that belongs outside the cluster is refused from pods",
			Shows: "seed 004 part 1's IPv6 twin: the LoadBalancer's IPv6 ingress IP is on kube-ipvs0 of every node too, and kube-proxy's IPv6 proxier lists only its " +
				"virtual server ports in KUBE-6-LOAD-BALANCER: [IPv6]:80 works from a pod, [IPv6]:443 (the cloud LB's, for something outside the cluster) is rejected " +
				"by ip6tables' KUBE-IPVS-FILTER with ICMPv6 port unreachable.",
			NoIPVS: "runs: the rejection is ip6tables filter INPUT; [IPv6]:80 runs on ip6tables KUBE-SVC/KUBE-SEP DNAT chains standing in for IPVS",
			Build:  buildDualStackLBPortOutside,
		},
		{
			Name:      "ipvs-no-endpoint",
			Title:     "an IPVS virtual server without a real server answers port unreachable",
			Shows:     "externalTrafficPolicy=Local before kube-proxy 1.24: node-1 has no local endpoint, so its LB virtual server has no real server and IPVS (ip_vs_leave) sends ICMP port unreachable. Baseline: an ETP=Cluster LB.",
			NeedsIPVS: true,
			NoIPVS:    "skipped: only IPVS itself answers for a virtual server without real servers",
			Build:     buildIPVSNoEndpoint,
		},
		{
			Name:      "dualstack-ipvs-no-endpoint",
			Title:     "dual-stack: an IPv6 IPVS virtual server without a real server answers ICMPv6 port unreachable",
			Shows:     "the ipvs-no-endpoint incident over IPv6: node-1's IPv6 virtual server for the ETP=Local LoadBalancer's IPv6 ingress IP has no real server (kube-proxy before 1.24), so IPVS (ip_vs_leave) answers with ICMPv6 port unreachable. Baseline: an ETP=Cluster LB's IPv6 ingress IP.",
			NeedsIPVS: true,
			NoIPVS:    "skipped: only IPVS itself answers for a virtual server without real servers",
			Build:     buildDualStackIPVSNoEndpoint,
		},
		{
			Name:  "return-path-etp-local",
			Title: "DNAT without SNAT: the reply bypasses the node and the client drops it",
			Shows: "seed 004 part 2, externalTrafficPolicy=Local since kube-proxy 1.24: node-1 has no local endpoint and DNATs to the pod on node-2 without SNAT; " +
				"the pod answers the outside client directly from podIP:8080, the client's stack resets that unknown five-tuple and its connect times out, " +
				"node-1's conntrack entry stays UNREPLIED. Baseline: an ETP=Cluster LB (SNAT).",
			NoIPVS: "runs with the IPVS masquerade forwarding stood in for by an iptables DNAT without SNAT (KUBE-SVC/KUBE-SEP chains), which takes the same return path",
			Build:  buildReturnPath,
		},
		{
			Name:  "dualstack-reject-reset-drop",
			Title: "dual-stack: REJECT tcp-reset, a stack RST and DROP over IPv6 next to healthy IPv6 Service traffic",
			Shows: "the reject-reset-drop incidents over IPv6 on dual-stack nodes: an ip6tables REJECT --reject-with tcp-reset (nf_send_reset6) and DROP " +
				"in a FORWARD policy chain on node-1, a stack RST (tcp_v6_send_reset) from a node port nobody listens on. " +
				"Baseline: a TCP and a UDP (DNS) Service over their IPv6 ClusterIPs.",
			NoIPVS: "runs: the rejects and drops are plain ip6tables; the Services run on ip6tables KUBE-SVC/KUBE-SEP DNAT chains standing in for IPVS",
			Build:  buildDualStackRejectResetDrop,
		},
		{
			Name:  "dualstack-return-path-etp-local",
			Title: "dual-stack: DNAT without SNAT over IPv6, the reply bypasses the node and the client drops it",
			Shows: "seed 004 part 2 over IPv6: the LoadBalancer has an IPv6 ingress IP, node-1 has no local endpoint and DNATs (IPVS masquerading, no SNAT with " +
				"externalTrafficPolicy=Local) to the pod's IPv6 address on node-2; the pod answers the outside client directly, whose stack resets that unknown " +
				"five-tuple, and node-1's IPv6 conntrack entry stays UNREPLIED. Baseline: an ETP=Cluster LB's IPv6 ingress IP (SNAT).",
			NoIPVS: "runs with the IPVS masquerade forwarding stood in for by an ip6tables DNAT without SNAT (KUBE-SVC/KUBE-SEP chains), which takes the same return path",
			Build:  buildDualStackReturnPath,
		},
		{
			Name:  "reject-reset-drop",
			Title: "plain REJECT, stack RST and DROP next to healthy Service traffic",
			Shows: "a REJECT --reject-with tcp-reset and a DROP in a FORWARD policy chain on node-1, a stack RST from a node port nobody listens on; " +
				"Baseline: a TCP Service and a UDP (DNS) Service work.",
			NoIPVS: "runs: the rejects and drops are plain iptables; the Services run on KUBE-SVC/KUBE-SEP DNAT chains standing in for IPVS",
			Build:  buildRejectResetDrop,
		},
	}
}

// Addresses of the two-node cluster every scenario starts from.
const (
	node1IP   = "172.18.0.2"
	node2IP   = "172.18.0.3"
	outsideIP = "172.18.0.100"
)

// twoNodes builds node-1 and node-2 routed to each other's pod CIDR, with
// kube-proxy's IPVS-mode state when kubeProxy is set.
func (c *cluster) twoNodes(kubeProxy bool) (*node, *node, error) {
	n1, err := c.addNode("node-1", node1IP, "10.244.1.0/24")
	if err != nil {
		return nil, nil, err
	}
	n2, err := c.addNode("node-2", node2IP, "10.244.2.0/24")
	if err != nil {
		return nil, nil, err
	}
	if err := c.routeNodes(); err != nil {
		return nil, nil, err
	}
	if kubeProxy {
		for _, n := range c.nodes {
			if err := c.installKubeProxy(n); err != nil {
				return nil, nil, err
			}
		}
	}
	return n1, n2, nil
}

func tcpPort(name string, port, hostPort int) containerPort {
	return containerPort{Name: name, Proto: "tcp", Port: port, HostPort: hostPort}
}

// scenario runs build on a fresh cluster and removes it if build fails.
func scenario(ctx context.Context, env *Env, name string, build func(c *cluster) (*Built, error)) (*Built, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := newCluster(env, name)
	if err != nil {
		return nil, err
	}
	b, err := build(c)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("build %s: %w", name, err)
	}
	return b, nil
}

func buildHostportClusterIP(ctx context.Context, env *Env) (*Built, error) {
	return hostportClusterIP(ctx, env, "hostport-hijack-clusterip", ipv4Attempts)
}

func buildDualStackHostportClusterIP(ctx context.Context, env *Env) (*Built, error) {
	return hostportClusterIP(ctx, env, "dualstack-hostport-hijack-clusterip", ipv6Attempts)
}

// hostportClusterIP is seed 000; with f IPv6 on a dual-stack cluster, its
// attempts over the IPv6 twins of the same Services.
func hostportClusterIP(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodes(true)
		if err != nil {
			return nil, err
		}
		n2.portmapFirst = true
		mysqlA, err := c.addPod(n1, "db-a", "mysql-a", tcpPort("mysql", 3306, 0))
		if err != nil {
			return nil, err
		}
		web, err := c.addPod(n1, "shop", "web", tcpPort("http", 8080, 0))
		if err != nil {
			return nil, err
		}
		mysqlB, err := c.addPod(n2, "db-b", "mysql-b", tcpPort("mysql", 3306, 3306))
		if err != nil {
			return nil, err
		}
		client, err := c.addPod(n2, "shop", "client")
		if err != nil {
			return nil, err
		}
		svcA := &service{namespace: "db-a", name: "mysql-a", typ: "ClusterIP", clusterIP: "10.96.0.10",
			ports: []servicePort{{Name: "mysql", Proto: "tcp", Port: 3306, TargetPort: 3306}}, endpoints: []*pod{mysqlA}}
		svcB := &service{namespace: "db-b", name: "mysql-b", typ: "ClusterIP", clusterIP: "10.96.0.11",
			ports: []servicePort{{Name: "mysql", Proto: "tcp", Port: 3306, TargetPort: 3306}}, endpoints: []*pod{mysqlB}}
		svcWeb := &service{namespace: "shop", name: "web", typ: "ClusterIP", clusterIP: "10.96.0.20",
			ports: []servicePort{{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080}}, endpoints: []*pod{web}}
		for _, s := range []*service{svcA, svcB, svcWeb} {
			if err := c.addService(s); err != nil {
				return nil, err
			}
		}
		return c.built(n2, []attempt{
			f.tcp(client, f.at("10.96.0.10", 3306), HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack,
				Outcome: Connected("mysql-b"),
				Note:    "mysql-a's ClusterIP is local on kube-ipvs0; portmap's DNAT for hostPort 3306 runs first"}),
			f.tcp(client, f.at("10.96.0.20", 80), ServiceDNAT, Expectation{Outcome: Connected("web")}),
			f.tcp(client, f.podAt(mysqlA, 3306), NoDecision, Expectation{Outcome: Connected("mysql-a"),
				Note: "mysql-a itself is healthy"}),
		})
	})
}

func buildHostportNodePort(ctx context.Context, env *Env) (*Built, error) {
	return hostportNodePort(ctx, env, "hostport-vs-nodeport", ipv4Attempts)
}

func buildDualStackHostportNodePort(ctx context.Context, env *Env) (*Built, error) {
	return hostportNodePort(ctx, env, "dualstack-hostport-vs-nodeport", ipv6Attempts)
}

// hostportNodePort is seed 000's nginx experiment, over f.
func hostportNodePort(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodes(true)
		if err != nil {
			return nil, err
		}
		outside, err := c.addOutside("outside", outsideIP, node1IP)
		if err != nil {
			return nil, err
		}
		backends := map[string]*pod{}
		for _, name := range []string{"nginx-a", "nginx-b", "nginx-c"} {
			if backends[name], err = c.addPod(n1, "web", name, tcpPort("http", 8080, 0)); err != nil {
				return nil, err
			}
		}
		nodePortSvc := func(name, ip string, nodePort int) *service {
			return &service{namespace: "web", name: name, typ: "NodePort", clusterIP: ip,
				ports:     []servicePort{{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080, NodePort: nodePort}},
				endpoints: []*pod{backends[name]}}
		}
		// nginx-a's Service exists before the hostPort pod...
		if err := c.addService(nodePortSvc("nginx-a", "10.96.0.80", 30080)); err != nil {
			return nil, err
		}
		hpA, err := c.addPod(n2, "web", "hp-30080", tcpPort("http", 80, 30080))
		if err != nil {
			return nil, err
		}
		// ...nginx-b's hostPort pod exists before its Service.
		hpB, err := c.addPod(n2, "web", "hp-30081", tcpPort("http", 80, 30081))
		if err != nil {
			return nil, err
		}
		for _, s := range []*service{nodePortSvc("nginx-b", "10.96.0.81", 30081), nodePortSvc("nginx-c", "10.96.0.82", 30082)} {
			if err := c.addService(s); err != nil {
				return nil, err
			}
		}
		return c.built(n2, []attempt{
			f.tcp(outside, f.nodeAt(n2, 30080), HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack,
				Outcome: Connected(hpA.name), Note: "Service created first; the hostPort pod still answers"}),
			f.tcp(outside, f.nodeAt(n2, 30081), HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack,
				Outcome: Connected(hpB.name), Note: "hostPort pod created first; it answers too"}),
			f.tcp(outside, f.nodeAt(n2, 30082), ServiceDNAT, Expectation{Outcome: Connected("nginx-c")}),
		})
	})
}

func buildHostNetworkHostPort(ctx context.Context, env *Env) (*Built, error) {
	return hostNetworkVsHostPort(ctx, env, "hostnetwork-vs-hostport", func(c *cluster) (*node, *node, error) { return c.twoNodes(false) })
}

func buildHostNetworkHostPortDualStack(ctx context.Context, env *Env) (*Built, error) {
	return hostNetworkVsHostPort(ctx, env, "dualstack-hostnetwork-vs-hostport", func(c *cluster) (*node, *node, error) {
		c.dualStack = true
		return c.twoNodes(false)
	})
}

// hostNetworkVsHostPort is seed 002 on nodes made by twoNodes: the same
// pods and traffic whichever rule source portmap writes to, and the same
// again over IPv6 when twoNodes makes the cluster dual-stack.
func hostNetworkVsHostPort(ctx context.Context, env *Env, name string, twoNodes func(c *cluster) (*node, *node, error)) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		n1, _, err := twoNodes(c)
		if err != nil {
			return nil, err
		}
		outside, err := c.addOutside("outside", outsideIP, node1IP)
		if err != nil {
			return nil, err
		}
		if _, err := c.addHostNetworkPod(n1, "ingress", "ingress-agent", tcpPort("http", 80, 0), tcpPort("metrics", 9100, 0)); err != nil {
			return nil, err
		}
		webHP, err := c.addPod(n1, "shop", "web-hp", tcpPort("http", 8080, 80))
		if err != nil {
			return nil, err
		}
		client, err := c.addPod(n1, "shop", "client")
		if err != nil {
			return nil, err
		}
		atts := []attempt{
			tcp(outside, node1IP+":80", HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack, Outcome: Connected(webHP.name),
				Note: "the hostNetwork listener on :80 is bypassed"}),
			tcp(client, node1IP+":80", HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack, Outcome: Connected(webHP.name),
				Note: "from a pod too"}),
			tcp(outside, node1IP+":9100", NoDecision, Expectation{Outcome: Connected("ingress-agent")}),
		}
		if c.dualStack {
			f := ipv6Attempts
			atts = append(atts,
				f.tcp(outside, f.nodeAt(n1, 80), HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack, Outcome: Connected(webHP.name),
					Note: "over IPv6: portmap's ip6tables DNAT bypasses the same listener"}),
				f.tcp(client, f.nodeAt(n1, 80), HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack, Outcome: Connected(webHP.name),
					Note: "over IPv6 from a pod too"}),
				f.tcp(outside, f.nodeAt(n1, 9100), NoDecision, Expectation{Outcome: Connected("ingress-agent")}))
		}
		return c.built(n1, atts)
	})
}

func buildPingClusterIP(ctx context.Context, env *Env) (*Built, error) {
	return pingClusterIP(ctx, env, "ping-clusterip", ipv4Attempts)
}

func buildDualStackPingClusterIP(ctx context.Context, env *Env) (*Built, error) {
	return pingClusterIP(ctx, env, "dualstack-ping-clusterip", ipv6Attempts)
}

// pingClusterIP is seed 003 in IPVS mode, over f.
func pingClusterIP(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodes(true)
		if err != nil {
			return nil, err
		}
		ldap, err := c.addPod(n2, "auth", "ldap", tcpPort("ldap", 389, 0))
		if err != nil {
			return nil, err
		}
		client, err := c.addPod(n1, "auth", "debug")
		if err != nil {
			return nil, err
		}
		if err := c.addService(&service{namespace: "auth", name: "ldap", typ: "ClusterIP", clusterIP: "10.96.0.30",
			ports: []servicePort{{Name: "ldap", Proto: "tcp", Port: 389, TargetPort: 389}}, endpoints: []*pod{ldap}}); err != nil {
			return nil, err
		}
		return c.built(n1, []attempt{
			f.icmp(client, f.ip("10.96.0.30"), FilterReject, Expectation{Verdict: trace.VerdictIPVSFilterReject, Outcome: OutcomeUnreachable,
				Note: "ICMP is never a service ip,port"}),
			f.tcp(client, f.at("10.96.0.30", 22), FilterReject, Expectation{Verdict: trace.VerdictIPVSFilterReject, Outcome: OutcomeRefused,
				Note: "22 is not a port of the Service"}),
			f.tcp(client, f.at("10.96.0.30", 389), ServiceDNAT, Expectation{Outcome: Connected("ldap")}),
			f.icmp(client, f.pod(ldap), NoDecision, Expectation{Outcome: OutcomeEchoReply}),
		})
	})
}

func buildLBPortOutside(ctx context.Context, env *Env) (*Built, error) {
	return lbPortOutside(ctx, env, "lb-port-outside-cluster", ipv4Attempts)
}

func buildDualStackLBPortOutside(ctx context.Context, env *Env) (*Built, error) {
	return lbPortOutside(ctx, env, "dualstack-lb-port-outside-cluster", ipv6Attempts)
}

// lbPortOutside is seed 004 part 1, over f.
func lbPortOutside(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodes(true)
		if err != nil {
			return nil, err
		}
		gw, err := c.addPod(n2, "edge", "gateway", tcpPort("http", 8080, 0))
		if err != nil {
			return nil, err
		}
		client, err := c.addPod(n1, "shop", "client")
		if err != nil {
			return nil, err
		}
		if err := c.addService(&service{namespace: "edge", name: "gateway", typ: "LoadBalancer", clusterIP: "10.96.0.50", lbIP: "192.168.1.200",
			ports: []servicePort{{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080, NodePort: 30090}}, endpoints: []*pod{gw}}); err != nil {
			return nil, err
		}
		return c.built(n1, []attempt{
			f.tcp(client, f.at("192.168.1.200", 443), FilterReject, Expectation{Verdict: trace.VerdictIPVSFilterReject, Outcome: OutcomeRefused,
				Note: "443 is served by the cloud LB, not by a virtual server; the LB IP is local on kube-ipvs0"}),
			f.tcp(client, f.at("192.168.1.200", 80), ServiceDNAT, Expectation{Outcome: Connected("gateway")}),
		})
	})
}

// etpLocalShop is what both ETP=Local scenarios share: a client outside
// node-1, pod shop on node-2 (so node-1 has no local endpoint), Service
// shop as an ETP=Local LoadBalancer on lbIP, and shop-any, the same pod
// behind an ETP=Cluster LoadBalancer on 192.168.1.202 for the baseline.
// etpLocalShop is the shop pod on n2 behind two LoadBalancers on lbIP and
// 192.168.1.202: one externalTrafficPolicy=Local, one Cluster (in a
// dual-stack cluster with their IPv6 twins too).
func (c *cluster) etpLocalShop(n2 *node, lbIP string) (*host, *pod, error) {
	outside, err := c.addOutside("outside", outsideIP, node1IP)
	if err != nil {
		return nil, nil, err
	}
	shop, err := c.addPod(n2, "shop", "shop", tcpPort("http", 8080, 0))
	if err != nil {
		return nil, nil, err
	}
	local := &service{namespace: "shop", name: "shop", typ: "LoadBalancer", clusterIP: "10.96.0.60", lbIP: lbIP,
		etpLocal: true, healthCheckPort: 32001,
		ports: []servicePort{{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080, NodePort: 30091}}, endpoints: []*pod{shop}}
	cluster := &service{namespace: "shop", name: "shop-any", typ: "LoadBalancer", clusterIP: "10.96.0.61", lbIP: "192.168.1.202",
		ports: []servicePort{{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080, NodePort: 30092}}, endpoints: []*pod{shop}}
	for _, s := range []*service{local, cluster} {
		if err := c.addService(s); err != nil {
			return nil, nil, err
		}
	}
	return outside, shop, nil
}

func buildIPVSNoEndpoint(ctx context.Context, env *Env) (*Built, error) {
	return ipvsNoEndpoint(ctx, env, "ipvs-no-endpoint", ipv4Attempts)
}

func buildDualStackIPVSNoEndpoint(ctx context.Context, env *Env) (*Built, error) {
	return ipvsNoEndpoint(ctx, env, "dualstack-ipvs-no-endpoint", ipv6Attempts)
}

// ipvsNoEndpoint is a virtual server without real servers, over f.
func ipvsNoEndpoint(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	if !env.IPVS {
		return nil, fmt.Errorf("build %s: %w: %s", name, ErrNeedsIPVS, env.IPVSReason)
	}
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodes(true)
		if err != nil {
			return nil, err
		}
		for _, n := range c.nodes {
			n.kp.before124 = true
			if n.kp6 != nil {
				n.kp6.before124 = true
			}
		}
		outside, _, err := c.etpLocalShop(n2, "192.168.1.201")
		if err != nil {
			return nil, err
		}
		return c.built(n1, []attempt{
			f.tcp(outside, f.at("192.168.1.201", 80), NoRealServer, Expectation{Verdict: trace.VerdictIPVSNoEndpoint, Outcome: OutcomeRefused,
				Note: "the virtual server on node-1 has no real server"}),
			f.tcp(outside, f.at("192.168.1.202", 80), ServiceDNAT, Expectation{Outcome: Connected("shop")}),
		})
	})
}

func buildReturnPath(ctx context.Context, env *Env) (*Built, error) {
	return returnPath(ctx, env, "return-path-etp-local", ipv4Attempts)
}

func buildDualStackReturnPath(ctx context.Context, env *Env) (*Built, error) {
	return returnPath(ctx, env, "dualstack-return-path-etp-local", ipv6Attempts)
}

// returnPath is seed 004 part 2, over f.
func returnPath(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodes(true)
		if err != nil {
			return nil, err
		}
		outside, shop, err := c.etpLocalShop(n2, "192.168.1.200")
		if err != nil {
			return nil, err
		}
		return c.built(n1, []attempt{
			f.tcp(outside, f.at("192.168.1.200", 80), ReturnPath, Expectation{Verdict: trace.VerdictReturnPathMismatch, Outcome: OutcomeTimeout,
				Note: "the pod's SYN-ACK goes straight to the client, which resets it"}),
			f.tcp(outside, f.at("192.168.1.202", 80), ServiceDNAT, Expectation{Outcome: Connected(shop.name)}),
		}, outside.ns)
	})
}

func buildRejectResetDrop(ctx context.Context, env *Env) (*Built, error) {
	return rejectResetDrop(ctx, env, "reject-reset-drop", ipv4Attempts)
}

func buildDualStackRejectResetDrop(ctx context.Context, env *Env) (*Built, error) {
	return rejectResetDrop(ctx, env, "dualstack-reject-reset-drop", ipv6Attempts)
}

// rejectResetDrop: a REJECT, a stack RST and a DROP beside healthy
// Services, over f.
func rejectResetDrop(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodes(true)
		if err != nil {
			return nil, err
		}
		api, err := c.addPod(n2, "backend", "api", tcpPort("https", 8443, 0), tcpPort("admin", 9000, 0), tcpPort("debug", 9001, 0))
		if err != nil {
			return nil, err
		}
		dns, err := c.addPod(n2, "kube-system", "coredns", containerPort{Name: "dns", Proto: "udp", Port: 53})
		if err != nil {
			return nil, err
		}
		client, err := c.addPod(n1, "shop", "client")
		if err != nil {
			return nil, err
		}
		for _, s := range []*service{
			{namespace: "backend", name: "api", typ: "ClusterIP", clusterIP: "10.96.0.40",
				ports: []servicePort{{Name: "https", Proto: "tcp", Port: 443, TargetPort: 8443}}, endpoints: []*pod{api}},
			{namespace: "kube-system", name: "kube-dns", typ: "ClusterIP", clusterIP: "10.96.0.53",
				ports: []servicePort{{Name: "dns", Proto: "udp", Port: 53, TargetPort: 53}}, endpoints: []*pod{dns}},
		} {
			if err := c.addService(s); err != nil {
				return nil, err
			}
		}
		if err := policy(n1, f, f.pod(api)); err != nil {
			return nil, err
		}
		return c.built(n1, []attempt{
			f.tcp(client, f.podAt(api, 9000), PolicyReject, Expectation{Verdict: trace.VerdictRejected, Outcome: OutcomeRefused}),
			f.tcp(client, f.nodeAt(n1, 2222), StackReset, Expectation{Verdict: trace.VerdictReset, Outcome: OutcomeRefused,
				Note: "nothing listens on node-1's :2222: the TCP stack resets"}),
			f.tcp(client, f.podAt(api, 9001), PolicyDrop, Expectation{Verdict: trace.VerdictDropped, Outcome: OutcomeTimeout}),
			f.tcp(client, f.at("10.96.0.40", 443), ServiceDNAT, Expectation{Outcome: Connected("api")}),
			f.udp(client, f.at("10.96.0.53", 53), ServiceDNAT, Expectation{Outcome: Connected(dns.name)}),
		})
	})
}

// policy is a hand-written FORWARD policy on n in f's iptables: api's
// admin port is rejected with a TCP reset, its debug port silently
// dropped.
func policy(n *node, f family, apiIP string) error {
	restore, api := "iptables-restore", apiIP+"/32"
	if f.v6 {
		restore, api = "ip6tables-restore", apiIP+"/128"
	}
	rules := "*filter\n:LAB-POLICY - [0:0]\n" +
		"-A FORWARD -m comment --comment \"lab network policy\" -j LAB-POLICY\n" +
		"-A LAB-POLICY -d " + api + " -p tcp -m comment --comment \"deny backend/api admin\" -m tcp --dport 9000 -j REJECT --reject-with tcp-reset\n" +
		"-A LAB-POLICY -d " + api + " -p tcp -m comment --comment \"drop backend/api debug\" -m tcp --dport 9001 -j DROP\n" +
		"COMMIT\n"
	if err := runStdin(n.ns, rules, restore, "-w", "--noflush"); err != nil {
		return fmt.Errorf("policy on %s: %w", n.name, err)
	}
	return nil
}
