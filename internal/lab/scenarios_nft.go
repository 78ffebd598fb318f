package lab

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// noIPVSNFT is how every nftables scenario runs without IPVS: unchanged.
const noIPVSNFT = "runs unchanged: kube-proxy's nftables mode and portmap's nftables backend use no IPVS"

// nftScenarios are the incidents as they happen on nodes whose kube-proxy
// runs in nftables mode (v1.37.2's tables) and whose portmap uses its
// nftables backend (v1.10.0's or v1.8.0's table). Their names start with
// "nft-" because a scenario's name may not extend another's with a dash
// (netlab's cleanup of one would remove the other's namespaces).
func nftScenarios() []Scenario {
	return []Scenario{
		{
			Name:  "nft-hostport-hijack-clusterip-v1.8",
			Title: "portmap v1.8 (nftables) takes a ClusterIP and a pod IP routed through the node",
			Shows: "seed 000 on an nftables node: mysql-b has hostPort 3306 on node-2, whose portmap v1.8.0 nftables backend jumps from prerouting to hostports with no locality check (CVE-2025-67499). " +
				"ClusterIPs are not local in nftables mode, yet mysql-a's ClusterIP and mysql-a's own pod IP, routed through node-2, are DNAT'd to mysql-b: cni_hostport's table was created after kube-proxy's, so netfilter runs its prerouting chain first at the shared priority -100. " +
				"Baseline: another Service (kube-proxy's DNAT) and a ping to mysql-a.",
			NoIPVS: noIPVSNFT,
			Build:  buildNFTHostportClusterIP,
		},
		{
			Name:  "nft-hostport-outside-v1.8",
			Title: "portmap v1.8 (nftables) takes a pod's connection to a database outside the cluster",
			Shows: "CVE-2025-67499: a pod on node-2 connects to a database outside the cluster on :3306 and lands on mysql-b, whose hostPort 3306 portmap v1.8.0 maps for every destination. " +
				"Baseline: the database's other port, and mysql-b's hostPort on node-2's own address, used as intended.",
			NoIPVS: noIPVSNFT,
			Build:  buildNFTHostportOutside,
		},
		{
			Name:  "dualstack-nft-hostport-outside-v1.8",
			Title: "dual-stack: portmap v1.8 (nftables) takes a pod's IPv6 connection to a database outside the cluster",
			Shows: "CVE-2025-67499 over IPv6: portmap v1.8.0 maps mysql-b's hostPort 3306 in `table ip6 cni_hostport` for every destination too, so a pod's connection to the outside database's IPv6 address :3306 lands on mysql-b. " +
				"Baseline: the database's other port over IPv6, and mysql-b's hostPort on node-2's own IPv6 address.",
			NoIPVS: noIPVSNFT,
			Build:  buildDualStackNFTHostportOutside,
		},
		{
			Name:  "nft-hostport-vs-nodeport",
			Title: "a hostPort (portmap v1.10, nftables) equal to a NodePort wins on the node's address",
			Shows: "seed 000's nginx experiment on an nftables node: NodePort 30080 and hostPort 30080 on node-2. Both nat chains, kube-proxy's nat-prerouting and cni_hostport's prerouting (v1.10.0: `fib daddr type local`), have priority -100; " +
				"netfilter runs the one registered last first, here portmap's, created after kube-proxy started: what the kernel did (the DNAT target) decides which rule took it. Baseline: NodePort 30082 without a hostPort.",
			NoIPVS: noIPVSNFT,
			Build: func(ctx context.Context, env *Env) (*Built, error) {
				return buildNFTHostportNodePort(ctx, env, false, ipv4Attempts)
			},
		},
		{
			Name:  "dualstack-nft-hostport-vs-nodeport",
			Title: "dual-stack: a hostPort (portmap v1.10, nftables) equal to a NodePort wins on the node's IPv6 address",
			Shows: "nft-hostport-vs-nodeport over IPv6: portmap writes the hostPort into `table ip6 cni_hostport` and kube-proxy's IPv6 proxier the NodePort into `table ip6 kube-proxy`; " +
				"the ip6 family's prerouting hooks are a list of their own, where cni_hostport's, created after kube-proxy started, also runs first at priority -100. Baseline: NodePort 30082 on the node's IPv6 address.",
			NoIPVS: noIPVSNFT,
			Build: func(ctx context.Context, env *Env) (*Built, error) {
				return buildNFTHostportNodePort(ctx, env, false, ipv6Attempts)
			},
		},
		{
			Name:  "nft-nodeport-vs-hostport-restart",
			Title: "after a kube-proxy restart the same NodePort wins over the hostPort",
			Shows: "nft-hostport-vs-nodeport after kube-proxy restarted on node-2: its first sync deletes and re-creates its base chains (proxier.go setupNFTables), so netfilter now runs nat-prerouting before cni_hostport's prerouting at the same priority, " +
				"and NodePort 30080 reaches its Service's pod while hostPort 30080 is shadowed: healthy for the Service, and the tracer must name kube-proxy's rule, not portmap's, from the kernel's DNAT target.",
			NoIPVS:  noIPVSNFT,
			Healthy: true,
			Build: func(ctx context.Context, env *Env) (*Built, error) {
				return buildNFTHostportNodePort(ctx, env, true, ipv4Attempts)
			},
		},
		{
			Name:  "dualstack-nft-nodeport-vs-hostport-restart",
			Title: "dual-stack: after a kube-proxy restart the same NodePort wins over the hostPort on the node's IPv6 address",
			Shows: "nft-nodeport-vs-hostport-restart over IPv6: the restarted kube-proxy re-creates the base chains of `table ip6 kube-proxy` too, so the ip6 family's nat-prerouting now runs before cni_hostport's prerouting " +
				"and [node IPv6]:30080 reaches its Service's pod; the tracer must name kube-proxy's ip6 rule from the kernel's DNAT target.",
			NoIPVS:  noIPVSNFT,
			Healthy: true,
			Build: func(ctx context.Context, env *Env) (*Built, error) {
				return buildNFTHostportNodePort(ctx, env, true, ipv6Attempts)
			},
		},
		{
			Name:   "nft-hostnetwork-vs-hostport",
			Title:  "a hostPort :80 (portmap v1.10, nftables) bypasses the hostNetwork listener on :80",
			Shows:  "seed 002 with portmap's nftables backend: traffic to node-1's address :80, from outside and from a pod, is DNAT'd to web-hp by cni_hostport and never reaches ingress-agent's listener. Baseline: the listener's other port.",
			NoIPVS: noIPVSNFT,
			Build:  buildNFTHostNetworkHostPort,
		},
		{
			Name:   "dualstack-nft-hostnetwork-vs-hostport",
			Title:  "dual-stack: a hostPort :80 (portmap v1.10, nftables) bypasses the hostNetwork listener on :80 over IPv6 too",
			Shows:  "nft-hostnetwork-vs-hostport on dual-stack nodes: portmap writes the hostPort into `table ip6 cni_hostport` too, whose `fib daddr type local` takes the node's own IPv6 address: [node IPv6]:80, from outside and from a pod, is DNAT'd to web-hp and never reaches ingress-agent's dual-stack listener. Baseline: the listener's other port over IPv6.",
			NoIPVS: noIPVSNFT,
			Build:  buildDualStackNFTHostNetworkHostPort,
		},
		{
			Name:  "nft-ping-clusterip",
			Title: "ping and a wrong port to a ClusterIP: rejected by kube-proxy's cluster-ips-check",
			Shows: "seed 003 on an nftables node: kube-proxy's cluster-ips-check (filter-forward, after DNAT) rejects what still goes to a ClusterIP, ICMP echo and TCP to a port no Service has, " +
				"and drops traffic to an address of the service CIDR that no Service has. Baseline: TCP to the service port, ping to the pod IP.",
			NoIPVS: noIPVSNFT,
			Build:  buildNFTPingClusterIP,
		},
		{
			Name:  "dualstack-nft-hostport-hijack-clusterip-v1.8",
			Title: "dual-stack: connecting to mysql-a's IPv6 ClusterIP lands on mysql-b's hostPort",
			Shows: "seed 000's IPv6 twin on dual-stack nftables nodes: portmap v1.8.0 writes mysql-b's hostPort 3306 into ip6 cni_hostport too " +
				"(as the real plugin does for a pod's IPv6 address), whose prerouting has no locality check and runs before kube-proxy's ip6 nat-prerouting: " +
				"mysql-a's IPv6 ClusterIP and mysql-a's own IPv6 address are DNAT'd to mysql-b. Baseline: another Service's IPv6 ClusterIP, ping6 to mysql-a.",
			NoIPVS: noIPVSNFT,
			Build:  buildDualStackNFTHostportClusterIP,
		},
		{
			Name:  "dualstack-nft-ping-clusterip",
			Title: "dual-stack: ping6 and a wrong port to an IPv6 ClusterIP, rejected by the ip6 kube-proxy table",
			Shows: "seed 003's IPv6 twin on dual-stack nftables nodes: a RequireDualStack Service has a ClusterIP of each family, and kube-proxy's IPv6 proxier " +
				"writes `table ip6 kube-proxy`, whose cluster-ips-check rejects ICMPv6 echo (ICMPv6 port unreachable) and TCP to a port no Service has, and drops " +
				"an address of the IPv6 service CIDR that no Service has. Baseline: TCP to the service port over each family, ping6 to the pod.",
			NoIPVS: noIPVSNFT,
			Build:  buildDualStackNFTPingClusterIP,
		},
		{
			Name:  "nft-service-no-endpoint",
			Title: "a Service without endpoints is rejected, a Local NodePort without a local endpoint dropped",
			Shows: "kube-proxy nftables mode's no-endpoint-services element (`goto reject-chain`, commented with the Service) refuses a ClusterIP without endpoints; " +
				"an externalTrafficPolicy=Local NodePort on a node without a local endpoint is a `drop` element of no-endpoint-nodeports, so the outside client times out. Baseline: the same pod behind an ETP=Cluster NodePort.",
			NoIPVS: noIPVSNFT,
			Build:  buildNFTServiceNoEndpoint,
		},
		{
			Name:  "dualstack-nft-service-no-endpoint",
			Title: "dual-stack: an IPv6 ClusterIP without endpoints is rejected, an IPv6 Local NodePort without a local endpoint dropped",
			Shows: "nft-service-no-endpoint over IPv6: kube-proxy's IPv6 proxier writes the Service's IPv6 ClusterIP into `table ip6 kube-proxy`'s no-endpoint-services " +
				"(`goto reject-chain`, answered with ICMPv6 port unreachable), and the ETP=Local NodePort on node-1's IPv6 address into no-endpoint-nodeports as a `drop`. " +
				"Baseline: the same pod behind an ETP=Cluster NodePort on node-1's IPv6 address, and the Local Service's IPv6 ClusterIP.",
			NoIPVS: noIPVSNFT,
			Build:  buildDualStackNFTServiceNoEndpoint,
		},
		{
			Name:  "nft-healthy-service",
			Title: "healthy ClusterIP, NodePort and DNS traffic through kube-proxy's numgen DNAT",
			Shows: "no incident: a ClusterIP with three endpoints and a NodePort with two, where kube-proxy v1.37.2 DNATs with one rule whose target a numgen map picks, and a DNS Service with one; " +
				"every connection must be ok, name the endpoint the kernel chose, and raise no alarm.",
			NoIPVS:  noIPVSNFT,
			Healthy: true,
			Build:   buildNFTHealthyService,
		},
		{
			Name:  "dualstack-nft-healthy-service",
			Title: "dual-stack: healthy IPv6 ClusterIP, NodePort and DNS traffic through kube-proxy's numgen DNAT in `table ip6 kube-proxy`",
			Shows: "nft-healthy-service over IPv6: kube-proxy's IPv6 proxier DNATs the RequireDualStack Services' IPv6 ClusterIPs and the NodePort on node-1's IPv6 address with its numgen map; " +
				"every connection must be ok, name the endpoint the kernel chose, and raise no alarm.",
			NoIPVS:  noIPVSNFT,
			Healthy: true,
			Build:   buildDualStackNFTHealthyService,
		},
		{
			Name:  "nft-reject-reset-drop",
			Title: "a native nftables REJECT and DROP, a stack RST, next to healthy Service traffic",
			Shows: "reject-reset-drop on an nftables node: the lab's network policy is a native `table inet lab-policy` (counting its rules) in node-1's forward hook, rejecting with a TCP reset and dropping; " +
				"a stack RST from a node port nobody listens on. Baseline: a TCP Service and a UDP (DNS) Service through kube-proxy's nftables mode.",
			NoIPVS: noIPVSNFT,
			Build:  buildNFTRejectResetDrop,
		},
		{
			Name:  "dualstack-nft-reject-reset-drop",
			Title: "dual-stack: a native nftables REJECT and DROP over IPv6, a stack RST, next to healthy IPv6 Service traffic",
			Shows: "nft-reject-reset-drop over IPv6: the lab's `table inet lab-policy` rejects api's IPv6 admin port with a TCP reset (nf_send_reset6) and drops its debug port; " +
				"node-1's TCP stack resets a port nobody listens on over IPv6. Baseline: a TCP and a UDP (DNS) Service over their IPv6 ClusterIPs, through `table ip6 kube-proxy`.",
			NoIPVS: noIPVSNFT,
			Build:  buildDualStackNFTRejectResetDrop,
		},
	}
}

// uplink is the LAN's router: an nftables node routes what is not its own
// or a pod's there, as a real node does, so a ClusterIP, no local address
// in nftables mode, is forwarded and meets kube-proxy's filter-forward.
const uplink = "172.18.0.1"

// twoNodesNFT builds node-1 and node-2 routed to each other's pod CIDR
// and by default to the uplink, with portmap's nftables backend of
// release pm for hostPorts and, with kubeProxy, kube-proxy's nftables mode
// started before any pod.
func (c *cluster) twoNodesNFT(kubeProxy bool, pm string) (*node, *node, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, nil, fmt.Errorf("nftables scenarios need nft: %w (install nftables)", err)
	}
	n1, n2, err := c.twoNodes(false)
	if err != nil {
		return nil, nil, err
	}
	if err := bridgeNetfilter(n1.ns); err != nil {
		return nil, nil, err
	}
	for _, n := range c.nodes {
		n.portmapNFT = pm
		if _, err := n.ns.Run("ip", "route", "add", "default", "via", uplink); err != nil {
			return nil, nil, fmt.Errorf("route %s via %s: %w", n.name, uplink, err)
		}
		if c.dualStack {
			if _, err := n.ns.Run("ip", "-6", "route", "add", "default", "via", ip6Of(uplink)); err != nil {
				return nil, nil, fmt.Errorf("route %s via %s: %w", n.name, ip6Of(uplink), err)
			}
		}
		if kubeProxy {
			if err := c.installKubeProxyNFT(n); err != nil {
				return nil, nil, err
			}
		}
	}
	return n1, n2, nil
}

func (c *cluster) addServices(svcs ...*service) error {
	for _, s := range svcs {
		if err := c.addService(s); err != nil {
			return err
		}
	}
	return nil
}

func clusterIPService(namespace, name, ip string, port servicePort, eps ...*pod) *service {
	return &service{namespace: namespace, name: name, typ: "ClusterIP", clusterIP: ip, ports: []servicePort{port}, endpoints: eps}
}

func buildNFTHostportClusterIP(ctx context.Context, env *Env) (*Built, error) {
	return nftHostportClusterIP(ctx, env, "nft-hostport-hijack-clusterip-v1.8", ipv4Attempts)
}

func buildDualStackNFTHostportClusterIP(ctx context.Context, env *Env) (*Built, error) {
	return nftHostportClusterIP(ctx, env, "dualstack-nft-hostport-hijack-clusterip-v1.8", ipv6Attempts)
}

// nftHostportClusterIP is seed 000 on nftables nodes with portmap v1.8.0,
// over f (portmap's and kube-proxy's ip6 tables on a dual-stack cluster).
func nftHostportClusterIP(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodesNFT(true, PortmapV180)
		if err != nil {
			return nil, err
		}
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
		mysql := servicePort{Name: "mysql", Proto: "tcp", Port: 3306, TargetPort: 3306}
		if err := c.addServices(clusterIPService("db-a", "mysql-a", "10.96.0.10", mysql, mysqlA),
			clusterIPService("db-b", "mysql-b", "10.96.0.11", mysql, mysqlB),
			clusterIPService("shop", "web", "10.96.0.20", servicePort{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080}, web)); err != nil {
			return nil, err
		}
		return c.built(n2, []attempt{
			f.tcp(client, f.at("10.96.0.10", 3306), HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack, Outcome: Connected("mysql-b"),
				Note: "portmap v1.8's prerouting has no locality check and runs before kube-proxy's nat-prerouting"}),
			f.tcp(client, f.podAt(mysqlA, 3306), HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack, Outcome: Connected("mysql-b"),
				Note: "mysql-a's own pod IP, only routed through node-2, is taken too"}),
			f.tcp(client, f.at("10.96.0.20", 80), ServiceDNAT, Expectation{Outcome: Connected("web"),
				Note: "no hostPort has port 80: kube-proxy's chain runs next and DNATs"}),
			f.icmp(client, f.pod(mysqlA), NoDecision, Expectation{Outcome: OutcomeEchoReply}),
		})
	})
}

func buildNFTHostportOutside(ctx context.Context, env *Env) (*Built, error) {
	return nftHostportOutside(ctx, env, "nft-hostport-outside-v1.8", ipv4Attempts)
}

func buildDualStackNFTHostportOutside(ctx context.Context, env *Env) (*Built, error) {
	return nftHostportOutside(ctx, env, "dualstack-nft-hostport-outside-v1.8", ipv6Attempts)
}

// nftHostportOutside is CVE-2025-67499's outside destination, over f.
func nftHostportOutside(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		_, n2, err := c.twoNodesNFT(true, PortmapV180)
		if err != nil {
			return nil, err
		}
		// The database answers pods on node-2 straight back to node-2.
		db, err := c.addOutside("db", outsideIP, node2IP)
		if err != nil {
			return nil, err
		}
		if err := c.serve(db.ns, "outside-db", []containerPort{tcpPort("mysql", 3306, 0), tcpPort("postgres", 5432, 0)}); err != nil {
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
		return c.built(n2, []attempt{
			f.tcp(client, f.at(outsideIP, 3306), HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack, Outcome: Connected(mysqlB.name),
				Note: "the database outside the cluster is never reached: hostPort 3306 is mapped for every destination"}),
			f.tcp(client, f.at(outsideIP, 5432), NoDecision, Expectation{Outcome: Connected("outside-db")}),
			f.tcp(db, f.nodeAt(n2, 3306), HostportDNAT, Expectation{Outcome: Connected(mysqlB.name),
				Note: "the hostPort on node-2's own address, as intended"}),
		})
	})
}

// buildNFTHostportNodePort is seed 000's nginx experiment on nftables
// nodes over f, after a kube-proxy restart on node-2 when restart.
func buildNFTHostportNodePort(ctx context.Context, env *Env, restart bool, f family) (*Built, error) {
	name := "nft-hostport-vs-nodeport"
	if restart {
		name = "nft-nodeport-vs-hostport-restart"
	}
	if f.v6 {
		name = "dualstack-" + name
	}
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodesNFT(true, PortmapV1100)
		if err != nil {
			return nil, err
		}
		outside, err := c.addOutside("outside", outsideIP, node1IP)
		if err != nil {
			return nil, err
		}
		nginxA, err := c.addPod(n1, "web", "nginx-a", tcpPort("http", 8080, 0))
		if err != nil {
			return nil, err
		}
		nginxC, err := c.addPod(n1, "web", "nginx-c", tcpPort("http", 8080, 0))
		if err != nil {
			return nil, err
		}
		hp, err := c.addPod(n2, "web", "hp-30080", tcpPort("http", 80, 30080))
		if err != nil {
			return nil, err
		}
		nodePortSvc := func(name, ip string, nodePort int, ep *pod) *service {
			return &service{namespace: "web", name: name, typ: "NodePort", clusterIP: ip,
				ports: []servicePort{{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080, NodePort: nodePort}}, endpoints: []*pod{ep}}
		}
		if err := c.addServices(nodePortSvc("nginx-a", "10.96.0.80", 30080, nginxA), nodePortSvc("nginx-c", "10.96.0.82", 30082, nginxC)); err != nil {
			return nil, err
		}
		first := f.tcp(outside, f.nodeAt(n2, 30080), HostportDNAT, Expectation{Verdict: trace.VerdictHostportHijack, Outcome: Connected(hp.name),
			Note: "cni_hostport's prerouting was registered after kube-proxy's nat-prerouting, so netfilter runs it first"})
		if restart {
			if err := n2.kpNFT.restart(); err != nil {
				return nil, err
			}
			first = f.tcp(outside, f.nodeAt(n2, 30080), ServiceDNAT, Expectation{Outcome: Connected(nginxA.name),
				Note: "kube-proxy's re-created nat-prerouting now runs first; the hostPort is shadowed"})
		}
		return c.built(n2, []attempt{first,
			f.tcp(outside, f.nodeAt(n2, 30082), ServiceDNAT, Expectation{Outcome: Connected(nginxC.name)}),
		})
	})
}

func buildNFTHostNetworkHostPort(ctx context.Context, env *Env) (*Built, error) {
	return hostNetworkVsHostPort(ctx, env, "nft-hostnetwork-vs-hostport", func(c *cluster) (*node, *node, error) {
		return c.twoNodesNFT(false, PortmapV1100)
	})
}

func buildDualStackNFTHostNetworkHostPort(ctx context.Context, env *Env) (*Built, error) {
	return hostNetworkVsHostPort(ctx, env, "dualstack-nft-hostnetwork-vs-hostport", func(c *cluster) (*node, *node, error) {
		c.dualStack = true
		return c.twoNodesNFT(false, PortmapV1100)
	})
}

func buildNFTPingClusterIP(ctx context.Context, env *Env) (*Built, error) {
	return nftPingClusterIP(ctx, env, "nft-ping-clusterip", ipv4Attempts)
}

func buildDualStackNFTPingClusterIP(ctx context.Context, env *Env) (*Built, error) {
	return nftPingClusterIP(ctx, env, "dualstack-nft-ping-clusterip", ipv6Attempts)
}

// nftPingClusterIP is seed 003 on nftables nodes, over f (kube-proxy's
// ip6 table on a dual-stack cluster).
func nftPingClusterIP(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodesNFT(true, "")
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
		if err := c.addService(clusterIPService("auth", "ldap", "10.96.0.30", servicePort{Name: "ldap", Proto: "tcp", Port: 389, TargetPort: 389}, ldap)); err != nil {
			return nil, err
		}
		return c.built(n1, []attempt{
			f.icmp(client, f.ip("10.96.0.30"), ClusterIPReject, Expectation{Verdict: trace.VerdictClusterIPReject, Outcome: OutcomeUnreachable,
				Note: "ICMP is never a Service's protocol"}),
			f.tcp(client, f.at("10.96.0.30", 22), ClusterIPReject, Expectation{Verdict: trace.VerdictClusterIPReject, Outcome: OutcomeRefused,
				Note: "22 is not a port of the Service"}),
			f.tcp(client, f.at("10.96.0.99", 80), ClusterIPDrop, Expectation{Verdict: trace.VerdictClusterIPReject, Outcome: OutcomeTimeout,
				Note: "no Service has that address: cluster-ips-check drops the service CIDR's unallocated addresses"}),
			f.tcp(client, f.at("10.96.0.30", 389), ServiceDNAT, Expectation{Outcome: Connected("ldap")}),
			f.icmp(client, f.pod(ldap), NoDecision, Expectation{Outcome: OutcomeEchoReply}),
		})
	})
}

func buildNFTServiceNoEndpoint(ctx context.Context, env *Env) (*Built, error) {
	return nftServiceNoEndpoint(ctx, env, "nft-service-no-endpoint", ipv4Attempts)
}

func buildDualStackNFTServiceNoEndpoint(ctx context.Context, env *Env) (*Built, error) {
	return nftServiceNoEndpoint(ctx, env, "dualstack-nft-service-no-endpoint", ipv6Attempts)
}

// nftServiceNoEndpoint is kube-proxy nftables mode's Services without
// (local) endpoints, over f.
func nftServiceNoEndpoint(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodesNFT(true, "")
		if err != nil {
			return nil, err
		}
		client, err := c.addPod(n1, "shop", "client")
		if err != nil {
			return nil, err
		}
		outside, shop, err := c.etpLocalShop(n2, "192.168.1.200")
		if err != nil {
			return nil, err
		}
		// cart's selector matches no ready pod.
		if err := c.addService(clusterIPService("shop", "cart", "10.96.0.70", servicePort{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080})); err != nil {
			return nil, err
		}
		return c.built(n1, []attempt{
			f.tcp(client, f.at("10.96.0.70", 80), NoEndpointReject, Expectation{Verdict: trace.VerdictServiceNoEndpoint, Outcome: OutcomeRefused,
				Note: "cart has no endpoints: its element of no-endpoint-services goes to reject-chain"}),
			f.tcp(outside, f.nodeAt(n1, 30091), NoEndpointDrop, Expectation{Verdict: trace.VerdictServiceNoEndpoint, Outcome: OutcomeTimeout,
				Note: "shop is externalTrafficPolicy=Local and node-1 runs none of its endpoints"}),
			f.tcp(outside, f.nodeAt(n1, 30092), ServiceDNAT, Expectation{Outcome: Connected(shop.name)}),
			f.tcp(client, f.at("10.96.0.60", 80), ServiceDNAT, Expectation{Outcome: Connected(shop.name),
				Note: "the Local policy is external only: the ClusterIP uses every endpoint"}),
		})
	})
}

func buildNFTHealthyService(ctx context.Context, env *Env) (*Built, error) {
	return nftHealthyService(ctx, env, "nft-healthy-service", ipv4Attempts)
}

func buildDualStackNFTHealthyService(ctx context.Context, env *Env) (*Built, error) {
	return nftHealthyService(ctx, env, "dualstack-nft-healthy-service", ipv6Attempts)
}

// nftHealthyService is healthy traffic through kube-proxy's nftables
// mode, over f.
func nftHealthyService(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodesNFT(true, "")
		if err != nil {
			return nil, err
		}
		outside, err := c.addOutside("outside", outsideIP, node1IP)
		if err != nil {
			return nil, err
		}
		var cats []*pod
		for i, n := range []*node{n2, n2, n1} {
			p, err := c.addPod(n, "shop", fmt.Sprintf("catalog-%d", i), tcpPort("http", 8080, 0))
			if err != nil {
				return nil, err
			}
			cats = append(cats, p)
		}
		dns, err := c.addPod(n2, "kube-system", "coredns", containerPort{Name: "dns", Proto: "udp", Port: 53})
		if err != nil {
			return nil, err
		}
		client, err := c.addPod(n1, "shop", "client")
		if err != nil {
			return nil, err
		}
		if err := c.addServices(clusterIPService("shop", "catalog", "10.96.0.90", servicePort{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080}, cats...),
			&service{namespace: "shop", name: "catalog-public", typ: "NodePort", clusterIP: "10.96.0.91",
				ports: []servicePort{{Name: "http", Proto: "tcp", Port: 80, TargetPort: 8080, NodePort: 30093}}, endpoints: cats[:2]},
			clusterIPService("kube-system", "kube-dns", "10.96.0.53", servicePort{Name: "dns", Proto: "udp", Port: 53, TargetPort: 53}, dns)); err != nil {
			return nil, err
		}
		anyOf := func(pods []*pod) Expectation {
			var names []string
			for _, p := range pods {
				names = append(names, p.name)
			}
			return Expectation{OneOf: names, Outcome: connectedToOneOf(names)}
		}
		var atts []attempt
		for range 4 {
			atts = append(atts, f.tcp(client, f.at("10.96.0.90", 80), ServiceDNAT, anyOf(cats)))
		}
		for range 2 {
			atts = append(atts, f.tcp(outside, f.nodeAt(n1, 30093), ServiceDNAT, anyOf(cats[:2])))
		}
		atts = append(atts, f.udp(client, f.at("10.96.0.53", 53), ServiceDNAT, Expectation{Outcome: Connected(dns.name)}))
		return c.built(n1, atts)
	})
}

func buildNFTRejectResetDrop(ctx context.Context, env *Env) (*Built, error) {
	return nftRejectResetDrop(ctx, env, "nft-reject-reset-drop", ipv4Attempts)
}

func buildDualStackNFTRejectResetDrop(ctx context.Context, env *Env) (*Built, error) {
	return nftRejectResetDrop(ctx, env, "dualstack-nft-reject-reset-drop", ipv6Attempts)
}

// nftRejectResetDrop is rejectResetDrop with a native nftables policy and
// kube-proxy's nftables mode, over f.
func nftRejectResetDrop(ctx context.Context, env *Env, name string, f family) (*Built, error) {
	return scenario(ctx, env, name, func(c *cluster) (*Built, error) {
		c.dualStack = f.v6
		n1, n2, err := c.twoNodesNFT(true, "")
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
		if err := c.addServices(clusterIPService("backend", "api", "10.96.0.40", servicePort{Name: "https", Proto: "tcp", Port: 443, TargetPort: 8443}, api),
			clusterIPService("kube-system", "kube-dns", "10.96.0.53", servicePort{Name: "dns", Proto: "udp", Port: 53, TargetPort: 53}, dns)); err != nil {
			return nil, err
		}
		if err := policyNFT(n1, f, f.pod(api)); err != nil {
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

// policyNFT is the lab's own network policy as a native table on n, the
// counterpart of policy's LAB-POLICY chain: api's admin port (at apiIP,
// of f) is rejected with a TCP reset, its debug port silently dropped. It
// is the lab's own program, so its rules count packets, as LAB-POLICY's
// do.
func policyNFT(n *node, f family, apiIP string) error {
	daddr := "ip daddr "
	if f.v6 {
		daddr = "ip6 daddr "
	}
	rules := "table inet " + labPolicyTable + " {\n" +
		"\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n" +
		"\t\tjump " + labPolicyTable + " comment \"lab network policy\"\n\t}\n" +
		"\tchain " + labPolicyTable + " {\n" +
		"\t\t" + daddr + apiIP + " tcp dport 9000 counter reject with tcp reset comment \"deny backend/api admin\"\n" +
		"\t\t" + daddr + apiIP + " tcp dport 9001 counter drop comment \"drop backend/api debug\"\n\t}\n}\n"
	if err := runStdin(n.ns, rules, "nft", "-f", "-"); err != nil {
		return fmt.Errorf("policy on %s: %w", n.name, err)
	}
	n.policyNFT = true
	return nil
}

// bridgeNetfilter checks that ns's bridges pass their traffic through
// netfilter (net.bridge.bridge-nf-call-iptables, per namespace since 5.3).
func bridgeNetfilter(ns netlab.Namespace) error {
	out, err := ns.Run("cat", "/proc/sys/net/bridge/bridge-nf-call-iptables")
	if err != nil {
		return fmt.Errorf("%w: /proc/sys/net/bridge/bridge-nf-call-iptables is not there (modprobe br_netfilter)", ErrNeedsBridgeNetfilter)
	}
	if strings.TrimSpace(out) != "1" {
		return fmt.Errorf("%w: net.bridge.bridge-nf-call-iptables is %s in the node's namespace", ErrNeedsBridgeNetfilter, strings.TrimSpace(out))
	}
	return nil
}
