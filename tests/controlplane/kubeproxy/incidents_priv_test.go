package kubeproxy

// The seed incidents (../shared/INCIDENTS.md) rebuilt from real objects on
// the real kube-proxy: pods made by the real CNI plugins (tests/cni's
// Runtime, with the port mappings their specs ask for), Services and
// EndpointSlices through the API server, and the live tracer with the
// tracer's ServiceAccount. Seed 003 (ping and a wrong port to a ClusterIP)
// and the Service without endpoints are TestPrivTraceKubeProxyNFT's and
// TestPrivTraceKubeProxyIPTables's; they are not repeated here.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/live/livetest"
	"github.com/tracer-dev/tracer/internal/meta"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/tests/cni"
	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// The incident cluster. The node is the harness's kube-proxy namespace
// (198.51.100.10 on kp0, PodCIDR 10.180.0.0/24) with the CNI bridge cni0
// (10.180.0.1) and the pods host-local numbers from the PodCIDR. Its
// default route leads to the uplink (198.51.100.1, forwarding off), which
// also plays what lies beyond the node: the cloud load balancer's address
// 203.0.113.50 (answering on 80 and 443 itself) and node 2's pod
// 10.180.1.5; it routes this node's PodCIDR back to the node:
//
//	pods (cni0, 10.180.0.0/24) ─ node 198.51.100.10 (kp0) ─ (kp1) 198.51.100.1 uplink
//	                                                               203.0.113.50 "outside"
//	                                                               10.180.1.5 edge/local-a (node 2)
const (
	incNode2       = "trki-node-2"
	incNode2IP     = "198.51.100.20"
	incNode2CIDR   = "10.180.1.0/24"
	incRemotePodIP = "10.180.1.5"
	incOutsideIP   = "203.0.113.50" // edge/lb's LoadBalancer ingress, and the load balancer itself
	incLocalLBIP   = "203.0.113.51" // edge/local's LoadBalancer ingress

	mysqlClusterIP = "172.30.0.30"
	mysqlPort      = 3306
	npClusterIP    = "172.30.0.31"
	npNodePort     = 30123 // web/np's NodePort, and web/hp-np's hostPort
	agentPort      = 9080  // web/agent's hostNetwork port, and web/hp-agent's hostPort
	lbClusterIP    = "172.30.0.40"
	lbNodePort     = 30400
	localClusterIP = "172.30.0.41"
	localNodePort  = 30500
	appPort        = 8080 // every web and edge pod's container port
	outsidePort    = 443  // served by the load balancer, outside the cluster
)

// incPod is a pod the CNI plugins make on this node: its spec's ports
// (with hostPorts) become the portmap's runtimeConfig; each container port
// gets a TCP server answering with the pod's ns/name.
type incPod struct {
	ns, name, app string
	ports         []corev1.ContainerPort
}

func (p incPod) key() string { return p.ns + "/" + p.name }

var incPods = []incPod{
	{"shop", "client", "client", nil},
	{"db", "mysql-a", "mysql-a", []corev1.ContainerPort{{Name: "mysql", ContainerPort: mysqlPort}}},
	// Seed 000: mysql-B's hostPort is mysql-A's Service port.
	{"db", "mysql-b", "mysql-b", []corev1.ContainerPort{{Name: "mysql", ContainerPort: mysqlPort, HostPort: mysqlPort}}},
	{"web", "np-a", "np", []corev1.ContainerPort{{Name: "http", ContainerPort: appPort}}},
	// Seed 000's nginx experiment: a hostPort equal to a NodePort.
	{"web", "hp-np", "hp-np", []corev1.ContainerPort{{Name: "http", ContainerPort: appPort, HostPort: npNodePort}}},
	// Seed 002: a hostPort equal to a hostNetwork listener's port.
	{"web", "hp-agent", "hp-agent", []corev1.ContainerPort{{Name: "http", ContainerPort: appPort, HostPort: agentPort}}},
	{"edge", "lb-a", "lb", []corev1.ContainerPort{{Name: "http", ContainerPort: appPort}}},
}

// portmapFlavour is the CNI portmap a cluster's node runs.
type portmapFlavour struct {
	name    string // "debian-1.1.1" or the release
	version string // for cphelper.EnsurePortmap; "" is Debian's
	backend string // "" (iptables) or "nftables"
	// anyDst: the prerouting jump has no locality check (nftables
	// backend v1.6 to v1.8), so a ClusterIP on a hostPort's port is
	// captured too.
	anyDst bool
}

var (
	portmapDebian = portmapFlavour{name: "debian-1.1.1"}
	portmapV110   = portmapFlavour{name: "v1.10.0", version: "v1.10.0", backend: "nftables"}
	portmapV18    = portmapFlavour{name: "v1.8.0", version: "v1.8.0", backend: "nftables", anyDst: true}
)

// TestPrivIncidentsIPTables rebuilds seeds 000, 002 and 004 on kube-proxy
// v1.37.2 in iptables mode with Debian's CNI plugins (bridge, host-local,
// portmap 1.1.1's iptables backend), and healthy traffic of every Service
// type; see runIncidents.
func TestPrivIncidentsIPTables(t *testing.T) {
	runIncidents(t, IPTables, portmapDebian)
}

// TestPrivIncidentsNFT is the same on kube-proxy in nftables mode with
// portmap v1.10.0's nftables backend (`fib daddr type local`).
func TestPrivIncidentsNFT(t *testing.T) {
	runIncidents(t, NFTables, portmapV110)
}

// TestPrivIncidentsNFTPortmapV18 is the same with portmap v1.8.0's
// nftables backend, whose prerouting jump has no locality check
// (CVE-2025-67499): there mysql-B's hostPort hijacks mysql-A's ClusterIP.
func TestPrivIncidentsNFTPortmapV18(t *testing.T) {
	runIncidents(t, NFTables, portmapV18)
}

// TestPrivIncidentsIPVS is the same on kube-proxy in ipvs mode with
// Debian's portmap: kube-ipvs0 makes every ClusterIP and LB IP an address
// of the node, so seed 000's hostPort takes mysql-a's ClusterIP, seed
// 004's LB IP port 443 is refused by KUBE-IPVS-FILTER, and an outside
// client's NodePort connection to edge/local is forwarded to node 2
// without SNAT. Only where the kernel has IPVS: the tests/vm guests.
func TestPrivIncidentsIPVS(t *testing.T) {
	skipOtherIPVSGuests(t)
	runIncidents(t, IPVS, portmapDebian)
}

// runIncidents starts one cluster (control plane, kube-proxy in mode, the
// CNI pods with pm's portmap, the uplink, the tracer's metadata), then
// runs the incidents on each tier ("best", and "netfilter": BPF netfilter
// links only) with runTier. The node's rules must be the same at the end,
// and the host's conntrack settings and rulesets unchanged.
func runIncidents(t *testing.T, mode Mode, pm portmapFlavour) {
	skipShort(t)
	skipIncidentsInVM(t)
	SkipUnlessPrivileged(t)
	requireTools(t, "conntrack", "sysctl", "ss")
	if mode == IPVS {
		SkipUnlessIPVS(t)
		requireTools(t, "ipvsadm", "curl")
	}
	checkHostUnchanged(t, mode)
	t0 := time.Now()
	c := startIncidentCluster(t, mode, pm)
	t.Logf("cluster (%s mode, portmap %s), CNI pods, kube-proxy rules and metadata ready in %s", mode, pm.name, time.Since(t0).Round(time.Millisecond))
	before := c.ruleset(t)
	for _, tier := range livetest.Tiers {
		t.Run(tier.Name, func(t *testing.T) {
			tier.SkipWithoutLinks(t)
			if tier.Only != nil && mode == IPVS {
				t.Skip("IPVS's decisions (ip_vs_conn_new, ip_vs_leave) have no BPF netfilter rung in internal/loader's ladders: the netfilter tier cannot see them")
			}
			if tier.Only != nil && os.Getenv("TRACER_VM") != "" {
				t.Skip("a tests/vm guest runs the incidents on tier best only (minutes per tier under TCG)")
			}
			c.runTier(t, tier)
		})
	}
	if now := c.ruleset(t); now != before {
		t.Errorf("the node's rules changed during the test; the rules checked were read before:\nbefore:\n%s\nnow:\n%s", before, now)
	}
	t.Logf("whole test %s", time.Since(t0).Round(time.Millisecond))
}

// vmIncidentTest is the one iptables or nftables incident test a
// tests/vm guest runs (on vmKernel, see skipOtherVMKernels);
// vmIPVSIncidentTest runs on every guest kernel, the only place IPVS is.
const (
	vmIncidentTest     = "TestPrivIncidentsIPTables"
	vmIPVSIncidentTest = "TestPrivIncidentsIPVS"
)

// skipIncidentsInVM keeps the VM matrix to one iptables or nftables
// incident cluster: under TCG each takes 2 to 3.5 minutes (a 6.12 run:
// NFT 207 s, NFTPortmapV18 162 s), and what the guest's kernel adds, the
// fentry tier, is the same for all three.
func skipIncidentsInVM(t *testing.T) {
	t.Helper()
	if os.Getenv("TRACER_VM") != "" && t.Name() != vmIncidentTest && t.Name() != vmIPVSIncidentTest {
		t.Skipf("a tests/vm guest runs one iptables or nftables incident cluster, %s (each takes minutes under TCG; the fentry tier it adds is the same for all three)", vmIncidentTest)
	}
}

// incCluster is a running incident cluster.
type incCluster struct {
	mode   Mode
	pm     portmapFlavour
	kp     *KubeProxy
	node   netlab.Namespace
	uplink netlab.Namespace
	admin  kubernetes.Interface
	md     livetest.Config
	// pods by ns/name: their network namespace and the address host-local gave.
	pods map[string]*runningPod

	// ipvs mode: KUBE-IPVS-FILTER's REJECT as iptables-save prints it, and
	// the client endpoints of the connections IPVS translated (its
	// connection entry named the real server).
	ipvsReject string
	viaIPVS    map[string]bool
	// retried are refused attempts made again (see rejectAttempt).
	retried []attemptResult
}

type runningPod struct {
	incPod
	netns netlab.Namespace
	ip    string
}

// ip is the address of pod key ("ns/name").
func (c *incCluster) ip(key string) string {
	p, ok := c.pods[key]
	if !ok {
		panic("no pod " + key)
	}
	return p.ip
}

func startIncidentCluster(t *testing.T, mode Mode, pm portmapFlavour) *incCluster {
	t.Helper()
	pluginPath := []string{cni.DebianPluginDir}
	if pm.version != "" {
		bin, err := cphelper.EnsurePortmap(pm.version, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		pluginPath = append([]string{filepath.Dir(bin)}, pluginPath...)
	}
	cp := cphelper.StartWith(t, cphelper.Options{ServiceCIDR: FixtureServiceCIDR})
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	// Generous: under TCG kube-proxy's first ipvs-mode sync alone took
	// over a minute (see startTraceCluster).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := cphelper.ApplyFile(ctx, admin, rbacManifest(t)); err != nil {
		t.Fatalf("apply deploy/rbac.yaml: %v", err)
	}
	for _, n := range []struct{ name, ip, cidr string }{{DefaultNodeName, DefaultNodeIP, DefaultPodCIDR}, {incNode2, incNode2IP, incNode2CIDR}} {
		if err := EnsureNode(ctx, admin, n.name, n.ip, n.cidr); err != nil {
			t.Fatal(err)
		}
	}
	if err := createIncidentServices(ctx, admin); err != nil {
		t.Fatal(err)
	}
	kp := Start(t, cp, Options{Mode: mode})
	c := &incCluster{mode: mode, pm: pm, kp: kp, node: netlab.Namespace{Name: kp.Netns}, admin: admin, pods: map[string]*runningPod{}, viaIPVS: map[string]bool{}}

	prefix := "trki-" + strings.ReplaceAll(pm.name, ".", "")
	if mode == IPVS {
		prefix = "trkiv-" + strings.ReplaceAll(pm.name, ".", "")
	}
	lab, err := netlab.New(fmt.Sprintf("%s-%d", prefix, os.Getpid()%10000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("remove pod namespaces: %v", err)
		}
	})
	c.setupUplink(t, lab)
	c.createPods(t, ctx, lab, pluginPath)
	if err := createIncidentEndpoints(ctx, admin, c); err != nil {
		t.Fatal(err)
	}
	c.serveHostNetwork(t, ctx)
	if _, err := kp.WaitSynced(ctx, c.synced()...); err != nil {
		t.Fatal(err)
	}
	if mode == IPVS {
		filter := c.kp.iptablesSave(t, "filter", false)
		c.ipvsReject = findSaved(t, savedRules(filter), filter, "KUBE-IPVS-FILTER", "--match-set KUBE-IPVS-IPS dst", "-j REJECT").text
	}
	c.md = c.metadata(t, cp)
	return c
}

// podCIDR is the node's PodCIDR as the Node object has it: host-local's
// range.
func (c *incCluster) podCIDR(t *testing.T, ctx context.Context) string {
	t.Helper()
	n, err := c.admin.CoreV1().Nodes().Get(ctx, DefaultNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read node %s: %v", DefaultNodeName, err)
	}
	if n.Spec.PodCIDR == "" {
		t.Fatalf("node %s has no PodCIDR", DefaultNodeName)
	}
	return n.Spec.PodCIDR
}

// setupUplink moves the harness's kp1 into the uplink namespace with the
// gateway's, the load balancer's and node 2's pod's addresses, and routes
// the node's traffic through it. The uplink forwards nothing (ip_forward
// 0: a new namespace takes the host's value, so it is set) and routes this
// node's PodCIDR back to the node, as a fabric routing pod CIDRs does.
func (c *incCluster) setupUplink(t *testing.T, lab *netlab.Lab) {
	t.Helper()
	uplink, err := lab.Namespace("uplink")
	if err != nil {
		t.Fatal(err)
	}
	c.uplink = uplink
	if err := uplink.Sysctl("net.ipv4.ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	nsRun(t, c.node, "ip", "link", "set", "kp1", "netns", uplink.Name)
	for _, a := range []string{uplinkGW + "/24", incOutsideIP + "/32", incRemotePodIP + "/32"} {
		nsRun(t, uplink, "ip", "addr", "add", a, "dev", "kp1")
	}
	nsRun(t, uplink, "ip", "link", "set", "kp1", "up")
	nsRun(t, uplink, "ip", "route", "add", DefaultPodCIDR, "via", DefaultNodeIP, "dev", "kp1")
	if err := c.node.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	nsRun(t, c.node, "ip", "route", "add", "default", "via", uplinkGW, "dev", "kp0")
	// Replies between pods on the bridge are bridged: conntrack undoes a
	// Service's DNAT on them only with br_netfilter's bridge-nf-call-iptables,
	// which a Kubernetes node has on (it is per namespace).
	if v := strings.TrimSpace(nsRun(t, c.node, "cat", "/proc/sys/net/bridge/bridge-nf-call-iptables")); v != "1" {
		if err := c.node.Sysctl("net.bridge.bridge-nf-call-iptables", "1"); err != nil {
			t.Fatal(err)
		}
	}
	serveTCP(t, uplink, net.JoinHostPort(incOutsideIP, strconv.Itoa(outsidePort)), "outside:443")
	serveTCP(t, uplink, net.JoinHostPort(incOutsideIP, "80"), "outside:80")
	serveTCP(t, uplink, net.JoinHostPort(incRemotePodIP, strconv.Itoa(appPort)), "edge/local-a")
}

// createPods does for each pod what the scheduler, the kubelet and the
// runtime would: the Pod bound to this node, its sandbox's network
// namespace, CNI ADD with the port mappings of its spec, its address
// written into its status, and its servers.
func (c *incCluster) createPods(t *testing.T, ctx context.Context, lab *netlab.Lab, pluginPath []string) {
	t.Helper()
	rt := &cni.Runtime{Node: c.node, Path: pluginPath, List: cni.NodeNetwork{
		Name: "trki", Bridge: "cni0", Subnet: c.podCIDR(t, ctx), DataDir: t.TempDir(), PortmapBackend: c.pm.backend,
	}.ConfList()}
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace shop: %v", err)
	}
	for _, p := range incPods {
		pod, err := c.admin.CoreV1().Pods(p.ns).Create(ctx, podObject(p, DefaultNodeName), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod %s: %v", p.key(), err)
		}
		netns, err := lab.Namespace(p.ns + "-" + p.name)
		if err != nil {
			t.Fatal(err)
		}
		sb := cni.PodSandbox{ContainerID: sandboxID(), NetNS: netns.Path(), Mappings: cni.PortMappingsOf(pod)}
		res, err := rt.Add(sb)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := rt.Del(sb); err != nil {
				t.Errorf("cni del %s: %v", p.key(), err)
			}
		})
		ip := res.IP.Addr().String()
		if err := writePodStatus(ctx, c.admin, pod, ip, DefaultNodeIP); err != nil {
			t.Fatal(err)
		}
		c.pods[p.key()] = &runningPod{incPod: p, netns: netns, ip: ip}
		for _, port := range p.ports {
			serveTCP(t, netns, net.JoinHostPort(ip, strconv.Itoa(int(port.ContainerPort))), p.key())
		}
		t.Logf("pod %s: %s (sandbox %s, port mappings %+v)", p.key(), res.IP, sb.ContainerID[:12], sb.Mappings)
	}
	// Node 2's pod lives beyond the uplink; only its objects are here.
	remote := incPod{"edge", "local-a", "local", []corev1.ContainerPort{{Name: "http", ContainerPort: appPort}}}
	pod, err := c.admin.CoreV1().Pods(remote.ns).Create(ctx, podObject(remote, incNode2), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", remote.key(), err)
	}
	if err := writePodStatus(ctx, c.admin, pod, incRemotePodIP, incNode2IP); err != nil {
		t.Fatal(err)
	}
}

// serveHostNetwork runs seed 002's hostNetwork DaemonSet pod web/agent: a
// listener on the node's every address, port agentPort, in the node's
// namespace, and its Pod object (hostNetwork, so its address is the
// node's and the API server sets its hostPort to the container port).
func (c *incCluster) serveHostNetwork(t *testing.T, ctx context.Context) {
	t.Helper()
	serveTCP(t, c.node, net.JoinHostPort("0.0.0.0", strconv.Itoa(agentPort)), "web/agent")
	p := incPod{"web", "agent", "agent", []corev1.ContainerPort{{Name: "http", ContainerPort: agentPort}}}
	obj := podObject(p, DefaultNodeName)
	obj.Spec.HostNetwork = true
	pod, err := c.admin.CoreV1().Pods(p.ns).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", p.key(), err)
	}
	if hp := pod.Spec.Containers[0].Ports[0].HostPort; hp != agentPort {
		t.Fatalf("hostNetwork pod %s: the API server gave hostPort %d, want %d", p.key(), hp, agentPort)
	}
	if err := writePodStatus(ctx, c.admin, pod, DefaultNodeIP, DefaultNodeIP); err != nil {
		t.Fatal(err)
	}
}

func podObject(p incPod, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: map[string]string{"app": p.app}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "c", Image: "registry.invalid/app:1", Ports: p.ports,
		}}},
	}
}

// writePodStatus writes what the kubelet reports once the sandbox is up.
func writePodStatus(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, ip, hostIP string) error {
	pod.Status.Phase = corev1.PodRunning
	pod.Status.HostIP, pod.Status.HostIPs = hostIP, []corev1.HostIP{{IP: hostIP}}
	pod.Status.PodIP, pod.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", Image: "registry.invalid/app:1", Ready: true,
		ContainerID: "containerd://" + sandboxID(),
		State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if _, err := c.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("write pod %s/%s status: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// sandboxID is a random 64-hex-digit id, the form containerd gives
// sandboxes and containers.
func sandboxID() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("read random sandbox id: %v", err))
	}
	return hex.EncodeToString(b)
}

// incService is a Service of the incident cluster and the pods (ns/name)
// its EndpointSlice lists.
type incService struct {
	svc       *corev1.Service
	lbIP      string
	endpoints []string
}

func incServices() []incService {
	svc := func(ns, name, ip string, typ corev1.ServiceType, port, target, nodePort int32, app string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{
				Type: typ, ClusterIP: ip, ClusterIPs: []string{ip}, Selector: map[string]string{"app": app},
				Ports: []corev1.ServicePort{{Name: portName(port), Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(target), NodePort: nodePort}},
			},
		}
	}
	local := svc("edge", "local", localClusterIP, corev1.ServiceTypeLoadBalancer, 80, appPort, localNodePort, "local")
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	ext := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "ext"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "lb.example.invalid"},
	}
	return []incService{
		{svc: svc("db", "mysql-a", mysqlClusterIP, corev1.ServiceTypeClusterIP, mysqlPort, mysqlPort, 0, "mysql-a"), endpoints: []string{"db/mysql-a"}},
		{svc: svc("web", "np", npClusterIP, corev1.ServiceTypeNodePort, 80, appPort, npNodePort, "np"), endpoints: []string{"web/np-a"}},
		{svc: svc("edge", "lb", lbClusterIP, corev1.ServiceTypeLoadBalancer, 80, appPort, lbNodePort, "lb"), lbIP: incOutsideIP, endpoints: []string{"edge/lb-a"}},
		{svc: local, lbIP: incLocalLBIP, endpoints: []string{"edge/local-a"}},
		{svc: ext},
	}
}

func portName(port int32) string {
	if port == mysqlPort {
		return "mysql"
	}
	return "http"
}

// createIncidentServices creates the Services (before kube-proxy starts)
// and writes the LoadBalancer ingress IPs a cloud controller would.
func createIncidentServices(ctx context.Context, c kubernetes.Interface) error {
	for _, ns := range []string{"db", "web", "edge"} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	for _, s := range incServices() {
		created, err := c.CoreV1().Services(s.svc.Namespace).Create(ctx, s.svc, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create service %s/%s: %w", s.svc.Namespace, s.svc.Name, err)
		}
		if s.lbIP == "" {
			continue
		}
		created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: s.lbIP}}
		if _, err := c.CoreV1().Services(s.svc.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("write service %s/%s ingress: %w", s.svc.Namespace, s.svc.Name, err)
		}
	}
	return nil
}

// createIncidentEndpoints writes each Service's EndpointSlice, as the
// endpointslice controller would, from the pods' objects.
func createIncidentEndpoints(ctx context.Context, c kubernetes.Interface, cl *incCluster) error {
	for _, s := range incServices() {
		if len(s.endpoints) == 0 {
			continue
		}
		p := s.svc.Spec.Ports[0]
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.svc.Namespace, Name: s.svc.Name + "-x1",
				Labels: map[string]string{discoveryv1.LabelServiceName: s.svc.Name, discoveryv1.LabelManagedBy: "tracer-test"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), Port: ptr.To(p.TargetPort.IntVal)}},
		}
		for _, key := range s.endpoints {
			ns, name, _ := strings.Cut(key, "/")
			pod, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("read pod %s: %w", key, err)
			}
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{pod.Status.PodIP},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				NodeName:   ptr.To(pod.Spec.NodeName),
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: name, UID: pod.UID},
			})
		}
		if _, err := c.DiscoveryV1().EndpointSlices(s.svc.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create endpointslice %s/%s: %w", s.svc.Namespace, slice.Name, err)
		}
	}
	return nil
}

// synced are what the node's ruleset shows once kube-proxy has DNATs
// (ipvs mode: real servers) to every endpoint and portmap its hostPorts.
// In ipvs mode edge/local's virtual servers have node 2's pod as real
// server: with no local endpoint, kube-proxy ≥ 1.24 gives them every
// endpoint (pkg/proxy/ipvs syncEndpoint, onlyNodeLocalEndpoints); its
// KUBE-IPVS-FILTER REJECT comes at the end of the sync.
func (c *incCluster) synced() []string {
	dnat := "-j DNAT --to-destination "
	switch c.mode {
	case NFTables:
		dnat = "dnat to "
	case IPVS:
		dnat = "-> "
	}
	var want []string
	for _, to := range []string{
		net.JoinHostPort(c.ip("db/mysql-a"), strconv.Itoa(mysqlPort)),
		net.JoinHostPort(c.ip("web/np-a"), strconv.Itoa(appPort)),
		net.JoinHostPort(c.ip("edge/lb-a"), strconv.Itoa(appPort)),
		net.JoinHostPort(incRemotePodIP, strconv.Itoa(appPort)),
	} {
		want = append(want, dnat+to)
	}
	if c.mode == IPVS {
		// The hairpin MASQUERADE comes only with a sync that has local
		// endpoints (ipset KUBE-LOOP-BACK not empty): without it an older
		// sync's REJECT matched while the real servers were new (5.10).
		want = append(want, fmt.Sprintf("TCP  %s:%d rr", incLocalLBIP, 80), fmt.Sprintf("TCP  %s:%d rr", DefaultNodeIP, localNodePort),
			"-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT",
			"--match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE")
	}
	return want
}

// metadata is the tracer's index with its ServiceAccount's token, once it
// knows every pod and Service of the test.
func (c *incCluster) metadata(t *testing.T, cp *cphelper.ControlPlane) livetest.Config {
	t.Helper()
	mctx, mcancel := context.WithCancel(context.Background())
	t.Cleanup(mcancel)
	idx, err := meta.NewFromKubeconfig(mctx, cp.KubeconfigFor(cp.TracerToken()), DefaultNodeName)
	if err != nil {
		t.Fatalf("metadata index: %v", err)
	}
	last := netip.MustParseAddr(c.ip(incPods[len(incPods)-1].key()))
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		_, found := idx.PodByIP(last, time.Now())
		_, _, lb := idx.ServiceByAddr(netip.MustParseAddr(incLocalLBIP), 80, "tcp", false, time.Time{})
		_, hostNet := idx.HostNetworkPod("tcp", agentPort, DefaultNodeName)
		if idx.Synced() && found && lb && hostNet {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("metadata index not synced after 30 s (synced %v, warnings %q)", idx.Synced(), idx.Warnings())
		}
	}
	return livetest.Config{NodeName: DefaultNodeName, Metadata: enrich.NewIndexMetadata(idx), MetadataSnapshot: idx.Snapshot, MetadataWarnings: idx.Warnings}
}

// runTier makes each incident's connections on a fresh live pipeline
// (subtests truth/…), and after the flows' linger checks the tracer's
// report of each (subtests tracer/…) and that no other flow has a verdict
// but ok.
func (c *incCluster) runTier(t *testing.T, tier livetest.Tier) {
	tr := c.startTracing(t, tier)
	incs := c.incidents()
	t.Run("truth", func(t *testing.T) {
		for _, inc := range incs {
			t.Run(inc.name, func(t *testing.T) { inc.attempt(t) })
		}
	})
	tr.Stop(t)
	t.Run("tracer", func(t *testing.T) {
		for _, inc := range incs {
			t.Run(inc.name, func(t *testing.T) { inc.check(t, tr) })
		}
	})
	var failing []attemptResult
	for _, inc := range incs {
		failing = append(failing, inc.failing()...)
	}
	checkNoFalseAlarm(t, tr, failing...)
}

// startTracing starts the live pipeline on the node for tier. The
// netfilter tier is skipped where NAT cannot be seen through BPF
// netfilter links: every incident here is a NAT decision.
func (c *incCluster) startTracing(t *testing.T, tier livetest.Tier) *livetest.Tracing {
	t.Helper()
	cfg := c.md
	cfg.Only = tier.Only
	tr := livetest.Start(t, c.node, cfg)
	if v := tr.Via(event.HookNFNat); tier.Only != nil && v != event.ViaNetfilter {
		t.Skipf("NAT cannot be seen via the netfilter tier on this kernel (via %s): it needs 6.4+", v)
	}
	for _, hp := range tr.P.Plan() {
		t.Logf("hook %s via %s", hp.Hook, hp.Via)
	}
	return tr
}

// ruleset is the node's rules, without counters: iptables-save of nat
// and filter (iptables and ipvs modes), or nft's whole ruleset.
func (c *incCluster) ruleset(t *testing.T) string {
	t.Helper()
	if c.mode != NFTables {
		var b strings.Builder
		for _, table := range []string{"nat", "filter"} {
			out, err := c.kp.Exec("iptables-save", "-t", table)
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(ruleLines(out) + "\n")
		}
		return b.String()
	}
	out, err := c.kp.Exec("nft", "-a", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	return out
}
