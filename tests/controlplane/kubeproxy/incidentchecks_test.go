package kubeproxy

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/live/livetest"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// incident is one seed incident's connections: attempt makes them and
// checks the node's and the client's truth, check the tracer's report of
// them after the linger, failing lists those whose flow is not ok.
type incident struct {
	name    string
	attempt func(t *testing.T)
	check   func(t *testing.T, tr *livetest.Tracing)
	failing func() []attemptResult
}

func none() []attemptResult { return nil }

// incidents are the seed incidents of the cluster, and healthy traffic of
// every Service type.
func (c *incCluster) incidents() []incident {
	return []incident{
		c.clusterIPHostPort(),
		c.nodePortHostPort(),
		c.hostNetworkHostPort(),
		c.lbPortOutside(),
		c.etpLocalRemote(),
		c.healthy(),
	}
}

// clusterIPHostPort is seed 000: db/mysql-b's hostPort 3306 is the port
// of db/mysql-a's ClusterIP. A ClusterIP is no address of an iptables or
// nftables node, so portmap's locality check (Debian's `--dst-type LOCAL`,
// v1.9+'s `fib daddr type local`) lets it pass to kube-proxy and mysql-a
// answers; v1.8.0's nftables backend checks nothing and mysql-b answers.
// In ipvs mode kube-ipvs0 makes the ClusterIP local, so the locality
// check matches, and which runs first decides (see ipvsPortmapFirst):
// Debian's portmap appends its PREROUTING jump after kube-proxy's
// KUBE-SERVICES, whose ACCEPT of the ClusterIP's exact ip,port (ipset
// KUBE-CLUSTER-IP) ends nat prerouting, and mysql-a answers; but the
// ClusterIP on a port that is no Service port (agentPort, web/hp-agent's
// hostPort) falls through to CNI-HOSTPORT-DNAT and web/hp-agent answers
// instead of KUBE-IPVS-FILTER refusing it (INCIDENTS.md: "Even with the
// fixed order").
func (c *incCluster) clusterIPHostPort() incident {
	var a, other attemptResult
	dst := net.JoinHostPort(mysqlClusterIP, strconv.Itoa(mysqlPort))
	return incident{
		name: "seed000-clusterip-hostport",
		attempt: func(t *testing.T) {
			a = c.connect(t, "clusterip", c.pods["shop/client"].netns, c.ip("shop/client"), dst)
			want := "db/mysql-a"
			if c.pm.anyDst || c.mode == IPVS && c.ipvsPortmapFirst(t) {
				want = "db/mysql-b"
			}
			if a.answer != want {
				t.Errorf("%s → %s: %s answered, want %s (portmap %s)", a.src, dst, a.answer, want, c.pm.name)
			}
			if c.mode == IPVS {
				other = c.connect(t, "clusterip other port", c.pods["shop/client"].netns, c.ip("shop/client"), net.JoinHostPort(mysqlClusterIP, strconv.Itoa(agentPort)))
				if other.answer != "web/hp-agent" {
					t.Errorf("%s → %s: %s answered, want the hostPort pod web/hp-agent", other.src, other.dst, other.answer)
				}
			}
		},
		check: func(t *testing.T, tr *livetest.Tracing) {
			if c.mode == IPVS {
				c.checkHijack(t, tr, other, "db/mysql-a", "Service db/mysql-a", "kube-ipvs0")
			}
			if a.answer == "db/mysql-b" {
				facts := []string{"Service db/mysql-a"}
				if c.mode == IPVS {
					facts = append(facts, "kube-ipvs0")
				}
				c.checkHijack(t, tr, a, "db/mysql-a", facts...)
				return
			}
			c.checkOK(t, tr, a, "db/mysql-a")
		},
		failing: func() []attemptResult {
			return append(c.ifHijacked(a, "db/mysql-b"), c.ifHijacked(other, "web/hp-agent")...)
		},
	}
}

// ipvsPortmapFirst: in the node's nat PREROUTING (iptables-save) portmap's
// jump to CNI-HOSTPORT-DNAT comes before kube-proxy's to KUBE-SERVICES.
func (c *incCluster) ipvsPortmapFirst(t *testing.T) bool {
	t.Helper()
	kube, cni := -1, -1
	for i, r := range savedRules(c.kp.iptablesSave(t, "nat", false)) {
		switch {
		case r.chain != "PREROUTING":
		case strings.HasSuffix(r.text, "-j KUBE-SERVICES"):
			kube = i
		case strings.HasSuffix(r.text, "-j CNI-HOSTPORT-DNAT"):
			cni = i
		}
	}
	if kube < 0 || cni < 0 {
		t.Fatalf("nat PREROUTING of the node lacks kube-proxy's (%d) or portmap's (%d) jump", kube, cni)
	}
	t.Logf("nat PREROUTING: portmap's jump %s kube-proxy's", map[bool]string{true: "before", false: "after"}[cni < kube])
	return cni < kube
}

// nodePortHostPort is seed 000's nginx experiment: web/hp-np's hostPort is
// web/np's NodePort, on the node's address. Which wins is the node's: the
// test takes it from the server that answered, and the tracer must name
// that one.
func (c *incCluster) nodePortHostPort() incident {
	var a attemptResult
	dst := net.JoinHostPort(DefaultNodeIP, strconv.Itoa(npNodePort))
	return incident{
		name: "seed000-nodeport-hostport",
		attempt: func(t *testing.T) {
			a = c.connect(t, "nodeport", c.pods["shop/client"].netns, c.ip("shop/client"), dst)
			if a.answer != "web/np-a" && a.answer != "web/hp-np" {
				t.Errorf("%s → %s: %q answered, want web/np-a (the NodePort) or web/hp-np (the hostPort)", a.src, dst, a.answer)
			}
			t.Logf("%s mode, portmap %s: the %s wins", c.mode, c.pm.name, map[bool]string{true: "hostPort", false: "NodePort"}[a.answer == "web/hp-np"])
		},
		check: func(t *testing.T, tr *livetest.Tracing) {
			if a.answer == "web/hp-np" {
				c.checkHijack(t, tr, a, "web/np", "Service web/np")
				return
			}
			c.checkOK(t, tr, a, "web/np")
		},
		failing: func() []attemptResult { return c.ifHijacked(a, "web/hp-np") },
	}
}

// hostNetworkHostPort is seed 002: the hostNetwork pod web/agent listens
// on the node's port agentPort and web/hp-agent has it as hostPort. The
// DNAT in prerouting comes first: hp-agent answers, the listener never
// sees the connection.
func (c *incCluster) hostNetworkHostPort() incident {
	var a attemptResult
	dst := net.JoinHostPort(DefaultNodeIP, strconv.Itoa(agentPort))
	return incident{
		name: "seed002-hostnetwork-hostport",
		attempt: func(t *testing.T) {
			if out := nsRun(t, c.node, "ss", "-Hltn", "sport = :"+strconv.Itoa(agentPort)); !strings.Contains(out, "LISTEN") {
				t.Fatalf("web/agent's listener on :%d is not in the node's sockets: %q", agentPort, out)
			}
			a = c.connect(t, "hostnetwork", c.pods["shop/client"].netns, c.ip("shop/client"), dst)
			if a.answer != "web/hp-agent" {
				t.Errorf("%s → %s: %s answered, want the hostPort pod web/hp-agent", a.src, dst, a.answer)
			}
		},
		check: func(t *testing.T, tr *livetest.Tracing) {
			c.checkHijack(t, tr, a, "", fmt.Sprintf("the host listener on 0.0.0.0:%d (hostNetwork pod web/agent)", agentPort))
		},
		failing: func() []attemptResult { return []attemptResult{a} },
	}
}

// lbPortOutside is seed 004's first half: edge/lb's LoadBalancer IP is
// also the cloud load balancer's address, which serves 443 for something
// outside the cluster. On an iptables or nftables node the LB IP is no
// local address: port 80 (the Service's) is DNAT'd to edge/lb-a in the
// cluster, and 443 leaves the node and the load balancer answers; IPVS
// mode's refusal does not happen (lbPortRefused is ipvs mode's).
func (c *incCluster) lbPortOutside() incident {
	if c.mode == IPVS {
		return c.lbPortRefused()
	}
	var svc, out attemptResult
	client := c.pods["shop/client"]
	return incident{
		name: "seed004-lb-port-outside",
		attempt: func(t *testing.T) {
			svc = c.connect(t, "lb:80", client.netns, client.ip, net.JoinHostPort(incOutsideIP, "80"))
			if svc.answer != "edge/lb-a" {
				t.Errorf("LB IP port 80: %s answered, want edge/lb-a (kube-proxy takes the LB IP in the cluster)", svc.answer)
			}
			out = c.connect(t, "lb:443", client.netns, client.ip, net.JoinHostPort(incOutsideIP, strconv.Itoa(outsidePort)))
			if out.answer != "outside:443" {
				t.Errorf("LB IP port 443: %s answered, want the load balancer itself (outside:443)", out.answer)
			}
		},
		check: func(t *testing.T, tr *livetest.Tracing) {
			c.checkOK(t, tr, svc, "edge/lb")
			checkNoRejection(t, tr, out)
		},
		failing: none,
	}
}

// lbPortRefused is seed 004's first half as the incident had it, in ipvs
// mode: the LB IP is bound on kube-ipvs0, so a pod's connection to it
// never leaves the node. Port 80 is edge/lb's virtual server (edge/lb-a
// answers); 443, which the load balancer serves outside the cluster, is
// refused by KUBE-IPVS-FILTER: the client gets ECONNREFUSED from an ICMP
// port unreachable, and the REJECT counts the SYN.
func (c *incCluster) lbPortRefused() incident {
	var svc, out attemptResult
	client := c.pods["shop/client"]
	dst := net.JoinHostPort(incOutsideIP, strconv.Itoa(outsidePort))
	return incident{
		name: "seed004-lb-port-outside",
		attempt: func(t *testing.T) {
			svc = c.connect(t, "lb:80", client.netns, client.ip, net.JoinHostPort(incOutsideIP, "80"))
			if svc.answer != "edge/lb-a" {
				t.Errorf("LB IP port 80: %s answered, want edge/lb-a (IPVS's virtual server on kube-ipvs0)", svc.answer)
			}
			out = c.kp.rejectAttempt(t, c.node, c.ipvsReject, "lb:443", func() attemptResult {
				return refusedFrom(t, "lb:443", client.netns, client.ip, dst)
			}, 1, true, func(a attemptResult) { c.retried = append(c.retried, a) })
		},
		check: func(t *testing.T, tr *livetest.Tracing) {
			c.checkOK(t, tr, svc, "edge/lb")
			f := c.flowOf(t, tr, out)
			if f == nil {
				return
			}
			if r := f.Rule; r == nil || r.NFTables() || r.Table != "filter" || r.Chain != "KUBE-IPVS-FILTER" || r.Text != c.ipvsReject || r.Uncertain != "" {
				t.Errorf("%s: rule %+v, want filter %q", out.what, r, c.ipvsReject)
			}
			checkRejectFlowFacts(t, f, out, trace.VerdictIPVSFilterReject, "edge/lb", "KUBE-IPVS-FILTER", "kube-ipvs0",
				fmt.Sprintf("tcp port %d", outsidePort), "LoadBalancer IP of Service edge/lb")
		},
		failing: func() []attemptResult { return append([]attemptResult{out}, c.retried...) },
	}
}

// etpLocalRemote is seed 004's second half: edge/local has
// externalTrafficPolicy Local and its only endpoint on node 2. A pod's
// connection to its LB IP or NodePort is short-circuited to the cluster
// endpoints and answered from node 2, back through this node (no return
// path mismatch: the node is the pod's gateway). A client outside the
// cluster is dropped on this node, which has no local endpoint. In ipvs
// mode (kube-proxy ≥ 1.24) the virtual servers of a Service with no local
// endpoint get every endpoint, and KUBE-NODE-PORT-LOCAL-TCP skips the
// masquerade: the outside client's connection is forwarded to node 2's
// pod with its own source, no answer comes back through this node, and
// the client times out (here the uplink plays both the client and node 2:
// the forwarded SYN reaches it from one of its own addresses).
func (c *incCluster) etpLocalRemote() incident {
	var lb, np, outside attemptResult
	client := c.pods["shop/client"]
	nodePort := net.JoinHostPort(DefaultNodeIP, strconv.Itoa(localNodePort))
	return incident{
		name: "seed004-etp-local-remote",
		attempt: func(t *testing.T) {
			lb = c.connect(t, "local lb", client.netns, client.ip, net.JoinHostPort(incLocalLBIP, "80"))
			np = c.connect(t, "local nodeport", client.netns, client.ip, nodePort)
			for _, a := range []attemptResult{lb, np} {
				if a.answer != "edge/local-a" {
					t.Errorf("%s: %s answered, want node 2's edge/local-a", a.what, a.answer)
				}
			}
			if c.mode == IPVS {
				outside = c.unrepliedAttempt(t, "outside client", c.uplink, uplinkGW, nodePort, net.JoinHostPort(incRemotePodIP, strconv.Itoa(appPort)))
				return
			}
			outside = c.droppedAttempt(t, "outside client", c.uplink, uplinkGW, nodePort, fmt.Sprintf(`"edge/local:http has no local endpoints"`))
		},
		check: func(t *testing.T, tr *livetest.Tracing) {
			c.checkOK(t, tr, lb, "edge/local")
			c.checkOK(t, tr, np, "edge/local")
			if c.mode == IPVS {
				c.checkReturnPath(t, tr, outside, "edge/local")
				return
			}
			if tr.Via(event.HookKfreeSkb) == event.ViaNone {
				// No drop is seen on this tier (BPF netfilter links only):
				// the tracer cannot know, but must not call it ok.
				fs := tr.FlowsOf("tcp", outside.src, outside.dst)
				for _, f := range fs {
					if f.Verdict == trace.VerdictOK {
						t.Errorf("%s: the node dropped it, but the tracer says ok: %s", outside.what, f.Explanation)
					}
				}
				t.Logf("%s: kfree_skb not attached on this tier: %d flows", outside.what, len(fs))
				return
			}
			f := c.flowOf(t, tr, outside)
			if f == nil {
				return
			}
			if f.Verdict != trace.VerdictServiceNoEndpoint || f.Service.Key() != "edge/local" ||
				!strings.Contains(f.Explanation, "Local traffic policy") || !strings.Contains(f.Explanation, "node "+DefaultNodeName) {
				t.Errorf("%s: verdict %s, service %+v: %s; want service-no-endpoint for edge/local's Local policy on %s", outside.what, f.Verdict, f.Service, f.Explanation, DefaultNodeName)
			}
		},
		failing: func() []attemptResult { return []attemptResult{outside} },
	}
}

// healthy is working traffic of every Service type: ClusterIP and
// NodePort of edge/lb (its LoadBalancer IP is lbPortOutside's), and an
// ExternalName Service, which kube-proxy has nothing to do with: it
// writes no rule for it and no flow may name it.
func (c *incCluster) healthy() incident {
	var cip, np attemptResult
	client := c.pods["shop/client"]
	return incident{
		name: "healthy-service-types",
		attempt: func(t *testing.T) {
			cip = c.connect(t, "clusterip", client.netns, client.ip, net.JoinHostPort(lbClusterIP, "80"))
			np = c.connect(t, "nodeport", client.netns, client.ip, net.JoinHostPort(DefaultNodeIP, strconv.Itoa(lbNodePort)))
			for _, a := range []attemptResult{cip, np} {
				if a.answer != "edge/lb-a" {
					t.Errorf("%s: %s answered, want edge/lb-a", a.what, a.answer)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ext, err := c.admin.CoreV1().Services("edge").Get(ctx, "ext", metav1.GetOptions{})
			if err != nil || ext.Spec.Type != corev1.ServiceTypeExternalName {
				t.Errorf("edge/ext in the API server: %+v, %v; want an ExternalName Service", ext, err)
			}
			if rs := c.ruleset(t); strings.Contains(rs, "edge/ext") {
				t.Errorf("kube-proxy wrote rules for the ExternalName Service edge/ext:\n%s", rs)
			}
		},
		check: func(t *testing.T, tr *livetest.Tracing) {
			c.checkOK(t, tr, cip, "edge/lb")
			c.checkOK(t, tr, np, "edge/lb")
			for _, f := range tr.All() {
				if f.Service.Key() == "edge/ext" {
					t.Errorf("flow %s %s → %s names the ExternalName Service edge/ext", f.Proto, f.Orig.Src, f.Orig.Dst)
				}
			}
		},
		failing: none,
	}
}

func (c *incCluster) ifHijacked(a attemptResult, hostPortPod string) []attemptResult {
	if a.answer == hostPortPod {
		return []attemptResult{a}
	}
	return nil
}

// serverAddr is where the server that wrote answer listens: the address
// the node's conntrack must have the reply from.
func (c *incCluster) serverAddr(answer string) string {
	switch answer {
	case "outside:443":
		return net.JoinHostPort(incOutsideIP, strconv.Itoa(outsidePort))
	case "outside:80":
		return net.JoinHostPort(incOutsideIP, "80")
	case "edge/local-a":
		return net.JoinHostPort(incRemotePodIP, strconv.Itoa(appPort))
	case "web/agent":
		return net.JoinHostPort(DefaultNodeIP, strconv.Itoa(agentPort))
	}
	p, ok := c.pods[answer]
	if !ok || len(p.ports) == 0 {
		return ""
	}
	return net.JoinHostPort(p.ip, strconv.Itoa(int(p.ports[0].ContainerPort)))
}

// connect makes one TCP connection from ns's address from to dst and
// checks the node's truth: the node's conntrack has the reply from the
// server that answered, and, in iptables mode, the one nat DNAT rule to
// that server counts one more packet and every other DNAT rule none (no
// DNAT rule moves when the answer came from the address dialled). In ipvs
// mode see checkIPVSPath.
func (c *incCluster) connect(t *testing.T, what string, ns netlab.Namespace, from, dst string) attemptResult {
	t.Helper()
	var before, ipvsBefore map[string]int64
	if c.mode != NFTables {
		before = packetCounts(t, c.kp.iptablesSave(t, "nat", true))
	}
	if c.mode == IPVS {
		ipvsBefore = c.kp.ipvsStats(t)
	}
	src, answer, err := fetchTCP(ns, from, dst)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	a := attemptResult{what, "tcp", src, dst, answer}
	server := c.serverAddr(answer)
	if server == "" {
		t.Fatalf("%s: %s → %s: unknown server %q answered", what, src, dst, answer)
	}
	reply, err := conntrackReplySource(c.node, "tcp", src, dst)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if reply != server {
		t.Errorf("%s: %s → %s: %s answered, but the node's conntrack has the reply from %s", what, src, dst, answer, reply)
	}
	if pod, ok := c.apiPodByIP(t, strings.Split(server, ":")[0]); ok && pod != answer {
		t.Errorf("%s: %s answered from %s, which the API server says is pod %s", what, answer, server, pod)
	}
	switch c.mode {
	case IPTables:
		c.checkDNATCounts(t, a, before, server, server != a.dst)
	case IPVS:
		c.checkIPVSPath(t, a, before, ipvsBefore, server)
	}
	t.Logf("%s: %s → %s answered by %s; conntrack reply from %s", what, src, dst, answer, reply)
	return a
}

// checkIPVSPath: in ipvs mode a connection is translated by IPVS or by a
// DNAT rule (portmap's). By IPVS: its one connection entry (`ipvsadm
// -Lnc`) names the real server that answered, the virtual server's
// counters gained one connection there and none at its other real
// servers, and no DNAT rule counted it. Else IPVS has no entry of it, the
// virtual server at the address dialled (if there is one) counted no
// connection, and checkDNATCounts.
func (c *incCluster) checkIPVSPath(t *testing.T, a attemptResult, natBefore, before map[string]int64, server string) {
	t.Helper()
	reals, listing, err := c.kp.ipvsConnReals(a.proto, a.src, a.dst)
	if err != nil {
		t.Fatalf("%s: %v", a.what, err)
	}
	via := len(reals) > 0
	if via {
		c.viaIPVS[a.src] = true
		if len(reals) != 1 || reals[0] != server {
			t.Errorf("%s: %s → %s answered by %s (%s), but IPVS's connection entries have real servers %v:\n%s", a.what, a.src, a.dst, a.answer, server, reals, listing)
		}
		c.checkIPVSCounts(t, a, before, c.kp.ipvsStatsMoved(t, a.proto, a.dst, before), server)
	} else if hasVirtual(before, a.proto, a.dst) {
		// Nothing moves when IPVS was bypassed, so there is no state to
		// wait for: two estimator periods (2 s, ip_vs_est.c) have passed.
		time.Sleep(4 * time.Second)
		c.checkIPVSCounts(t, a, before, c.kp.ipvsStats(t), "")
	}
	c.checkDNATCounts(t, a, natBefore, server, server != a.dst && !via)
	t.Logf("%s: IPVS connection entries %v", a.what, reals)
}

// hasVirtual: the IPVS counters have a real server of proto virtual.
func hasVirtual(stats map[string]int64, proto, virtual string) bool {
	for k := range stats {
		if strings.HasPrefix(k, proto+" "+virtual+" -> ") {
			return true
		}
	}
	return false
}

// checkIPVSCounts: the real server real of the virtual server a.dst
// counted one connection more, every other real server of it none.
func (c *incCluster) checkIPVSCounts(t *testing.T, a attemptResult, before, after map[string]int64, real string) {
	t.Helper()
	prefix := a.proto + " " + a.dst + " -> "
	seen := false
	for k, n := range after {
		r, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		want := int64(0)
		if r == real {
			want, seen = 1, true
		}
		if d := n - before[k]; d != want {
			t.Errorf("%s: %s → %s answered by %s, but IPVS counted %d connections for real server %s of %s, want %d", a.what, a.src, a.dst, a.answer, d, r, a.dst, want)
		}
	}
	if real != "" && !seen {
		t.Errorf("%s: IPVS has no real server %s for %s %s", a.what, real, a.proto, a.dst)
	}
}

// unrepliedAttempt connects from ns's address from to dst, which IPVS
// forwards to real (node 2's pod) without SNAT, whose answer does not come
// back through the node: the client times out without an ICMP error, the
// node's conntrack entry stays unreplied with the reply expected from
// real, and IPVS's connection entry and counters name real.
func (c *incCluster) unrepliedAttempt(t *testing.T, what string, ns netlab.Namespace, from, dst, real string) attemptResult {
	t.Helper()
	before := c.kp.ipvsStats(t)
	icmp := icmpDestUnreachs(t, ns)
	src, answer, err := fetchTCP(ns, from, dst)
	if !isTimeout(err) {
		t.Errorf("%s: %s → %s: %v (read %q), want no answer (a timeout)", what, src, dst, err, answer)
	}
	if d := icmpDestUnreachs(t, ns) - icmp; d != 0 {
		t.Errorf("%s: the client counted %d ICMP destination unreachable errors, want none", what, d)
	}
	a := attemptResult{what, "tcp", src, dst, ""}
	shost, sport, _ := net.SplitHostPort(src)
	dhost, dport, _ := net.SplitHostPort(dst)
	reply, err := conntrackReply(c.node, "tcp", src+" → "+dst+" unreplied", "[UNREPLIED] ",
		"--orig-src", shost, "--orig-port-src", sport, "--orig-dst", dhost, "--orig-port-dst", dport)
	if err != nil {
		t.Errorf("%s: %v", what, err)
	} else if reply != real {
		t.Errorf("%s: the node's conntrack expects the reply from %s, want %s", what, reply, real)
	}
	if r, err := c.kp.ipvsConnReal("tcp", src, dst); err != nil || r != real {
		t.Errorf("%s: IPVS's connection entry: real server %q (%v), want %s", what, r, err, real)
	}
	c.checkIPVSCounts(t, a, before, c.kp.ipvsStatsMoved(t, "tcp", dst, before), real)
	t.Logf("%s: %s → %s: %v; conntrack unreplied, reply expected from %s", what, src, dst, err, reply)
	return a
}

// checkReturnPath checks the flow of an unrepliedAttempt:
// return-path-mismatch, the Service, node 2's pod as the destination, and
// why (its node, externalTrafficPolicy Local).
func (c *incCluster) checkReturnPath(t *testing.T, tr *livetest.Tracing, a attemptResult, service string) {
	t.Helper()
	f := c.flowOf(t, tr, a)
	if f == nil {
		return
	}
	if f.Verdict != trace.VerdictReturnPathMismatch {
		t.Errorf("%s: verdict %s, want %s: %s", a.what, f.Verdict, trace.VerdictReturnPathMismatch, f.Explanation)
	}
	if f.Service.Key() != service {
		t.Errorf("%s: service %+v, want %s", a.what, f.Service, service)
	}
	if got, want := f.DstPod.Key(), "edge/local-a"; got != want {
		t.Errorf("%s: dst_pod %q, want %q (the real server IPVS chose)", a.what, got, want)
	}
	for _, fact := range []string{"node " + incNode2, "externalTrafficPolicy=Local", net.JoinHostPort(incRemotePodIP, strconv.Itoa(appPort))} {
		if !strings.Contains(f.Explanation, fact) {
			t.Errorf("%s: explanation lacks %q: %s", a.what, fact, f.Explanation)
		}
	}
}

// checkDNATCounts: the DNAT rule to server counted one packet if byRule,
// all others none.
func (c *incCluster) checkDNATCounts(t *testing.T, a attemptResult, before map[string]int64, server string, byRule bool) {
	t.Helper()
	after := packetCounts(t, c.kp.iptablesSave(t, "nat", true))
	moved := 0
	for text, n := range after {
		if jumpOf(text) != "DNAT" {
			continue
		}
		want := int64(0)
		if strings.HasSuffix(text, "--to-destination "+server) && byRule {
			want, moved = 1, moved+1
		}
		if d := n - before[text]; d != want {
			t.Errorf("%s: %s → %s answered by %s, but %s counted %d packets, want %d", a.what, a.src, a.dst, a.answer, text, d, want)
		}
	}
	if byRule && moved != 1 {
		t.Errorf("%s: %d DNAT rules to %s in the node's nat table, want one", a.what, moved, server)
	}
}

// droppedAttempt connects from ns's address from to dst, which the node
// must drop: the client times out without an ICMP error, the node keeps
// no conntrack entry of it (a packet dropped in filter never confirms
// one), and, in iptables mode, the filter rule with comment counts it.
func (c *incCluster) droppedAttempt(t *testing.T, what string, ns netlab.Namespace, from, dst, comment string) attemptResult {
	t.Helper()
	var before map[string]int64
	synced := func() bool { return false }
	if c.mode == IPTables {
		// The DROP sits in KUBE-EXTERNAL-SERVICES, which every sync
		// rewrites, zeroing its counter.
		synced = c.kp.countedWindow(t)
		before = packetCounts(t, c.kp.iptablesSave(t, "filter", true))
	}
	icmp := icmpDestUnreachs(t, ns)
	src, answer, err := fetchTCP(ns, from, dst)
	if !isTimeout(err) {
		t.Errorf("%s: %s → %s: %v (read %q), want no answer (a timeout)", what, src, dst, err, answer)
	}
	if d := icmpDestUnreachs(t, ns) - icmp; d != 0 {
		t.Errorf("%s: the client counted %d ICMP destination unreachable errors, want none", what, d)
	}
	if _, err := conntrackReplySource(c.node, "tcp", src, dst); err == nil || !strings.Contains(err.Error(), "0 conntrack entries") {
		t.Errorf("%s: the node's conntrack: %v; want no entry for %s → %s", what, err, src, dst)
	}
	if c.mode == IPTables && synced() {
		t.Errorf("%s: kube-proxy synced during %s → %s, which resets the DROP's counter: the count cannot be checked", what, src, dst)
	} else if c.mode == IPTables {
		after := packetCounts(t, c.kp.iptablesSave(t, "filter", true))
		found := 0
		for text, n := range after {
			if !strings.Contains(text, comment) || !strings.Contains(text, "--dport "+strings.Split(dst, ":")[1]) {
				continue
			}
			found++
			if d := n - before[text]; d < 1 {
				t.Errorf("%s: %s counted %d packets, want at least one (the SYN and its retransmissions)", what, text, d)
			}
		}
		if found != 1 {
			t.Errorf("%s: %d filter rules with %s for port %s, want one", what, found, comment, dst)
		}
	}
	t.Logf("%s: %s → %s: %v", what, src, dst, err)
	return attemptResult{what, "tcp", src, dst, ""}
}

// apiPodByIP is the pod (not hostNetwork) the API server has at ip.
func (c *incCluster) apiPodByIP(t *testing.T, ip string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := c.admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	for _, p := range pods.Items {
		if !p.Spec.HostNetwork && p.Status.PodIP == ip {
			return p.Namespace + "/" + p.Name, true
		}
	}
	return "", false
}

// ruleID is a rule as the node lists it: the table and chain, the handle
// (nftables), and its text.
type ruleID struct {
	family, table, chain string
	handle               uint64
	text                 string
}

// dnatRuleTo is the one rule of the node that DNATs to addr (ip:port):
// kube-proxy's endpoint DNAT or portmap's hostPort DNAT, read from
// iptables-save's nat table or `nft -a list ruleset`.
func (c *incCluster) dnatRuleTo(t *testing.T, addr string) ruleID {
	t.Helper()
	var found []ruleID
	if c.mode != NFTables {
		nat := c.kp.iptablesSave(t, "nat", false)
		for _, r := range savedRules(nat) {
			if strings.HasSuffix(r.text, "-j DNAT --to-destination "+addr) {
				found = append(found, ruleID{table: "nat", chain: r.chain, text: r.text})
			}
		}
	} else {
		for _, r := range nftAllRules(c.ruleset(t)) {
			if dnatTo(r.text, addr) {
				found = append(found, r)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d rules DNAT to %s on the node, want one: %+v", len(found), addr, found)
	}
	return found[0]
}

var dnatToRE = regexp.MustCompile(`\bdnat (?:ip )?to (\S+)`)

func dnatTo(text, addr string) bool {
	m := dnatToRE.FindStringSubmatch(text)
	return m != nil && m[1] == addr
}

var nftTableRE = regexp.MustCompile(`^table (\S+) (\S+) \{`)

// nftAllRules are the rules of every table of `nft -a list ruleset`.
func nftAllRules(listing string) []ruleID {
	var rules []ruleID
	var family, table, chain string
	for _, line := range strings.Split(listing, "\n") {
		l := strings.TrimSpace(line)
		if m := nftTableRE.FindStringSubmatch(l); m != nil {
			family, table, chain = m[1], m[2], ""
			continue
		}
		if name, ok := strings.CutPrefix(l, "chain "); ok {
			chain, _, _ = strings.Cut(name, " ")
			continue
		}
		m := nftHandleRE.FindStringSubmatch(l)
		if chain == "" || m == nil || strings.HasPrefix(l, "set ") || strings.HasPrefix(l, "map ") {
			continue
		}
		h, err := strconv.ParseUint(m[2], 10, 64)
		if err != nil {
			continue
		}
		rules = append(rules, ruleID{family: family, table: table, chain: chain, handle: h, text: m[1]})
	}
	return rules
}

// ruleIs compares the flow's rule with the node's.
func ruleIs(r *trace.Rule, want ruleID) bool {
	if r == nil || r.Text != want.text || r.Chain != want.chain || r.Table != want.table || r.Uncertain != "" {
		return false
	}
	if want.family == "" {
		return !r.NFTables()
	}
	return r.NFTables() && r.Family == want.family && r.Handle == want.handle
}

// checkOK checks the flow of a connection answered as the Service
// intends: ok, the rule that DNAT'd it to the server that answered (none
// when it was not translated; IPVS's event when IPVS did), the client and
// the answering pods, the Service.
func (c *incCluster) checkOK(t *testing.T, tr *livetest.Tracing, a attemptResult, service string) {
	t.Helper()
	f := c.flowOf(t, tr, a)
	if f == nil {
		return
	}
	if f.Verdict != trace.VerdictOK {
		t.Errorf("%s %s: verdict %s, want ok: %s", a.what, a.src, f.Verdict, f.Explanation)
	}
	server := c.serverAddr(a.answer)
	switch {
	case c.viaIPVS[a.src]:
		checkIPVSEvent(t, f, a, server)
	case server != a.dst:
		if want := c.dnatRuleTo(t, server); !ruleIs(f.Rule, want) {
			t.Errorf("%s %s: rule %+v, want %+v", a.what, a.src, f.Rule, want)
		}
	}
	c.checkNames(t, f, a, service)
}

// checkIPVSEvent: the flow has an ipvs event from the virtual server the
// client addressed to real, the real server IPVS's connection entry named
// (masquerading).
func checkIPVSEvent(t *testing.T, f *trace.Flow, a attemptResult, real string) {
	t.Helper()
	i := slices.IndexFunc(f.Events, func(e trace.Event) bool { return e.Kind == trace.KindIPVS })
	if i < 0 {
		t.Errorf("%s %s: no ipvs event in %s", a.what, a.src, livetest.EventList(f.Events))
	} else if e := f.Events[i]; e.Virtual != a.dst || e.To != real || e.Forward != "masq" {
		t.Errorf("%s %s: ipvs event virtual %q to %q (%s), want virtual %s to real server %s (masq)", a.what, a.src, e.Virtual, e.To, e.Forward, a.dst, real)
	}
}

// checkHijack checks a flow a hostPort took: hostport-hijack by portmap's
// DNAT to the pod that answered, that pod named as the rule's owner and
// the flow's destination, the client, the Service (if service), and what
// was bypassed (facts).
func (c *incCluster) checkHijack(t *testing.T, tr *livetest.Tracing, a attemptResult, service string, facts ...string) {
	t.Helper()
	f := c.flowOf(t, tr, a)
	if f == nil {
		return
	}
	if f.Verdict != trace.VerdictHostportHijack {
		t.Errorf("%s %s: verdict %s, want %s: %s", a.what, a.src, f.Verdict, trace.VerdictHostportHijack, f.Explanation)
	}
	want := c.dnatRuleTo(t, c.serverAddr(a.answer))
	if !ruleIs(f.Rule, want) {
		t.Errorf("%s %s: rule %+v, want portmap's %+v", a.what, a.src, f.Rule, want)
	}
	if r := f.Rule; r == nil || r.Owner == nil || r.Owner.Pod == nil || r.Owner.Pod.Key() != a.answer {
		t.Errorf("%s %s: rule owner %+v, want pod %s", a.what, a.src, ruleOwner(r), a.answer)
	}
	facts = append(facts, "pod "+a.answer, want.text)
	if c.mode == NFTables && service != "" {
		// Why portmap's DNAT came before kube-proxy's for a Service's address.
		facts = append(facts, "priority dstnat")
	}
	for _, fact := range facts {
		if !strings.Contains(f.Explanation, fact) {
			t.Errorf("%s %s: explanation lacks %q: %s", a.what, a.src, fact, f.Explanation)
		}
	}
	c.checkNames(t, f, a, service)
}

func ruleOwner(r *trace.Rule) *trace.Owner {
	if r == nil {
		return nil
	}
	return r.Owner
}

func (c *incCluster) flowOf(t *testing.T, tr *livetest.Tracing, a attemptResult) *trace.Flow {
	t.Helper()
	if a.src == "" {
		t.Errorf("%s: the attempt failed (see truth/…): no flow to check", a.what)
		return nil
	}
	f := tr.FlowOf(t, a.proto, a.src, a.dst)
	if f != nil {
		t.Logf("%s %s → %s: %s; events %s; %s", a.what, a.src, a.dst, f.Verdict, livetest.EventList(f.Events), f.Explanation)
	}
	return f
}

// checkNames: src_pod is the client's pod (none for a client outside the
// cluster), dst_pod the pod that answered (none for a server outside),
// the Service the one addressed ("" for none), and a DNAT event when the
// connection was translated.
func (c *incCluster) checkNames(t *testing.T, f *trace.Flow, a attemptResult, service string) {
	t.Helper()
	srcIP, _, _ := net.SplitHostPort(a.src)
	wantSrc, _ := c.apiPodByIP(t, srcIP)
	if got := f.SrcPod.Key(); got != wantSrc {
		t.Errorf("%s %s: src_pod %q, want %q", a.what, a.src, got, wantSrc)
	}
	server := c.serverAddr(a.answer)
	wantDst, _ := c.apiPodByIP(t, strings.Split(server, ":")[0])
	if got := f.DstPod.Key(); got != wantDst {
		t.Errorf("%s %s: dst_pod %q, but %s answered (API: %q)", a.what, a.src, got, a.answer, wantDst)
	}
	if gotSvc := f.Service.Key(); gotSvc != service {
		t.Errorf("%s %s: service %q, want %q", a.what, a.src, gotSvc, service)
	}
	dnat := slices.ContainsFunc(f.Events, func(e trace.Event) bool { return e.Kind == trace.KindDNAT })
	if want := server != a.dst && !c.viaIPVS[a.src]; dnat != want {
		t.Errorf("%s %s: dnat event %v, but the reply came from %s for %s (translated by IPVS: %v)", a.what, a.src, dnat, server, a.dst, c.viaIPVS[a.src])
	}
}
