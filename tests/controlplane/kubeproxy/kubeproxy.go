// Package kubeproxy runs the real kube-proxy (built by cphelper from
// k8s.io/kubernetes, the version tests/controlplane/build pins) in
// nftables, iptables or ipvs mode against a test control plane, inside a network
// namespace of its own, so tests can read the rulesets a real kube-proxy
// writes without touching the host's.
//
// It is a package of its own rather than part of cphelper because it needs
// root and the ip, nft and iptables commands, and creates network
// namespaces; cphelper stays what every control-plane test can use as an
// ordinary user.
//
// How kube-proxy reaches the API server: kube-apiserver listens on the
// host's 127.0.0.1, which a fresh network namespace cannot reach (its
// loopback is its own). The test process opens a TCP listener on
// 127.0.0.1:<the API server's port> inside the namespace (one thread
// enters the namespace only to create the socket; the socket stays there)
// and relays every connection to the API server from the host side. So the
// kubeconfig is the same as on the host (same URL, TLS verified against
// the test CA, whose certificate names 127.0.0.1) and nothing is added to
// the host: no veth end, address, route or rule, and the API server keeps
// listening on loopback only.
//
// What kube-proxy could change outside its namespace, and why it does not
// here (read in k8s.io/kubernetes v1.37.2 cmd/kube-proxy/app and
// pkg/proxy):
//   - conntrack.SetSysctls (pkg/proxy/conntrack/sysctls.go, called from
//     platformSetup in server_linux.go) writes nf_conntrack_max, which is
//     global, and /sys/module/nf_conntrack/parameters/hashsize, also global,
//     when maxPerCore > 0; and the TCP/UDP timeouts and tcp_be_liberal (per
//     namespace) when they are set. The config file sets maxPerCore 0, min
//     0, every timeout 0s and tcpBeLiberal false, which skips every write.
//     These must be in the config file: with --config, kube-proxy ignores
//     the other command-line flags (Options.Complete replaces the parsed
//     flags with the file's config; only --hostname-override and logging
//     flags still apply). The v1alpha1 defaults otherwise are maxPerCore
//     32768, min 131072, established 24h, close-wait 1h.
//   - platformCleanup (server_linux.go) in nftables mode runs
//     ipvs.CleanupLeftovers, which starts with `modprobe -va ip_vs`
//     (pkg/proxy/ipvs/cleanup.go): loading a module is host-wide. kube-proxy
//     runs with a PATH whose first entry holds a `modprobe` that refuses, so
//     that cleanup stops there, as it does on a node without IPVS. (The
//     kernel can still autoload modules itself when a rule needs one; the
//     test machine's kernel has no module support.)
//   - iptables mode sets net.ipv4.conf.all.route_localnet (per namespace:
//     the namespace's own) and only reads nf_conntrack_tcp_be_liberal.
//   - The ipvs proxier's sysctls (net/ipv4/vs/*, ip_forward, arp_*) are
//     never reached in nftables or iptables mode.
//   - ipvs mode (pkg/proxy/ipvs: NewProxier, CanUseIPVSProxier,
//     syncProxyRules) writes net/ipv4/vs/conntrack,
//     vs/expire_nodest_conn, vs/expire_quiescent_template, ip_forward and,
//     with strictARP, conf/all/arp_ignore and arp_announce
//     (vs/conn_reuse_mode only on kernels before 5.9): all of them per
//     network namespace, so the namespace's own. It creates the dummy link
//     kube-ipvs0, its ipsets and its IPVS virtual servers (a probe server
//     198.51.100.0:20000 first) there too: links, ipsets and the IPVS table
//     are per namespace. The IPVS timeouts (ipvsadm --set) are left alone
//     (tcpTimeout, tcpFinTimeout and udpTimeout 0s). It loads no module
//     itself (no modprobe in v1.37.2's ipvs path), but the kernel
//     autoloads ip_vs (generic netlink family IPVS), the scheduler's
//     ip_vs_rr, dummy, ip_set and its set types: module loading is
//     host-wide, which is why the tests load those before they read the
//     host (preloadModulesInVM) and why ReadHost reads the host's IPVS
//     table, ipsets, vs/* and arp_* sysctls, ip_vs's module parameter and
//     whether a kube-ipvs0 appeared among the host's links.
//   - oomScoreAdj writes kube-proxy's own /proc/self/oom_score_adj; the
//     config sets 0.
//
// ReadHost and HostState.Diff let a test check all of that from outside.
package kubeproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// Mode is kube-proxy's proxy mode.
type Mode string

// The modes the harness runs.
const (
	NFTables Mode = "nftables"
	IPTables Mode = "iptables"
	// IPVS needs a kernel with IPVS (the tests/vm guests; see SkipUnlessIPVS).
	IPVS Mode = "ipvs"
)

// Defaults of Options.
const (
	DefaultNodeName    = "trkp-node"
	DefaultNodeIP      = "198.51.100.10" // TEST-NET-2, on a veth inside the namespace
	DefaultClusterCIDR = "10.180.0.0/16"
	DefaultPodCIDR     = "10.180.0.0/24" // this node's part of the cluster CIDR
	// A dual-stack node's IPv6 twins (Options.DualStack).
	DefaultNodeIP6      = "2001:db8:100::10" // the documentation prefix, beside DefaultNodeIP on kp0
	DefaultClusterCIDR6 = "fd00:10:180::/56"
	DefaultPodCIDR6     = "fd00:10:180::/64"
)

// Options say how to run kube-proxy. The zero value runs nftables mode with
// the defaults above.
type Options struct {
	Mode        Mode
	NodeName    string
	NodeIP      string // IPv4, written as the Node's InternalIP and put on kp0 in the namespace
	ClusterCIDR string
	PodCIDR     string
	// DualStack gives the node an IPv6 address and pod CIDR beside the
	// IPv4 ones, and kube-proxy an IPv6 cluster CIDR: its IPv6 proxier then
	// has node IPs (for NodePorts) and tells pod traffic from outside
	// traffic, as on a dual-stack node. The control plane needs an IPv6
	// Service range too (cphelper.Options.ServiceCIDR).
	DualStack    bool
	NodeIP6      string // default DefaultNodeIP6 when DualStack
	ClusterCIDR6 string
	PodCIDR6     string
	// Verbosity is kube-proxy's -v (default 2: one line per sync).
	Verbosity int
	// Binary is the kube-proxy to run (default the one cphelper builds,
	// cphelper.Binaries.KubeProxy). Another version must accept the same
	// v1alpha1 config file (1.29 and later do).
	Binary string
}

func (o *Options) defaults() {
	if o.Mode == "" {
		o.Mode = NFTables
	}
	if o.NodeName == "" {
		o.NodeName = DefaultNodeName
	}
	if o.NodeIP == "" {
		o.NodeIP = DefaultNodeIP
	}
	if o.ClusterCIDR == "" {
		o.ClusterCIDR = DefaultClusterCIDR
	}
	if o.PodCIDR == "" {
		o.PodCIDR = DefaultPodCIDR
	}
	if o.Verbosity == 0 {
		o.Verbosity = 2
	}
	if o.DualStack {
		o.NodeIP6 = cmp.Or(o.NodeIP6, DefaultNodeIP6)
		o.ClusterCIDR6 = cmp.Or(o.ClusterCIDR6, DefaultClusterCIDR6)
		o.PodCIDR6 = cmp.Or(o.PodCIDR6, DefaultPodCIDR6)
	}
}

// nodeIPs are the Node's InternalIPs, IPv4 first (the primary family).
func (o Options) nodeIPs() []string {
	if o.DualStack {
		return []string{o.NodeIP, o.NodeIP6}
	}
	return []string{o.NodeIP}
}

// podCIDRs are the Node's pod CIDRs, in the order of nodeIPs.
func (o Options) podCIDRs() []string {
	if o.DualStack {
		return []string{o.PodCIDR, o.PodCIDR6}
	}
	return []string{o.PodCIDR}
}

// clusterCIDRs is kube-proxy's clusterCIDR: one per family, separated by a
// comma.
func (o Options) clusterCIDRs() string {
	if o.DualStack {
		return o.ClusterCIDR + "," + o.ClusterCIDR6
	}
	return o.ClusterCIDR
}

// KubeProxy is one kube-proxy process in its network namespace.
type KubeProxy struct {
	tb   testing.TB
	opts Options
	// Netns is the network namespace's name (NetnsPrefix and random hex).
	Netns string
	dir   string
	log   string
	fwd   *forwarder

	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	started time.Time

	// admin writes the Node; unallocatedDrops are the rules nftables mode
	// writes for the Service ranges, one per family (see WaitSynced);
	// fullSyncs counts the full syncs the harness asked for.
	admin            kubernetes.Interface
	unallocatedDrops []string
	fullSyncs        int
}

// SkipUnlessPrivileged skips tb, with the reason, unless the process can
// create network namespaces and the commands the harness uses exist.
func SkipUnlessPrivileged(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("runs kube-proxy in a network namespace of its own (ip netns add, nft, iptables): needs root")
	}
	for _, c := range []string{"ip", "nft", "iptables-save", "ip6tables-save"} {
		if _, err := exec.LookPath(c); err != nil {
			tb.Skipf("needs the %s command: %v", c, err)
		}
	}
}

// SkipUnlessIPVS skips tb on a kernel without IPVS, outside the tests/vm
// guests: the build host's kernel has no CONFIG_IP_VS. It does not load
// ip_vs to find out (loading a module changes the host). In a guest, where
// the tests load ip_vs before they read the host, it never skips: a guest
// kernel without IPVS must fail the test, not pass it by testing nothing.
func SkipUnlessIPVS(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("ipset"); err != nil {
		tb.Skipf("kube-proxy's ipvs mode needs the ipset command: %v", err)
	}
	if os.Getenv("TRACER_VM") != "" {
		return
	}
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		tb.Skipf("kube-proxy's ipvs mode needs IPVS, which this kernel does not have loaded (%v); the tests/vm guests (5.10, 6.1, 6.12) run it", err)
	}
}

// SyncTimeout bounds a wait for kube-proxy's rules: 60 s, and 3 minutes in
// a tests/vm guest, where its nftables mode took 15 s for its first sync of
// the fixture on an idle 6.12 guest (the iptables mode 7 s), and a busier
// CI guest is slower still.
func SyncTimeout() time.Duration {
	if os.Getenv("TRACER_VM") != "" {
		return 3 * time.Minute
	}
	return 60 * time.Second
}

// Start creates the Node object (or takes the existing one), a fresh
// network namespace with the node IP on a veth pair inside it, a relay to
// cp's API server and runs kube-proxy there. It returns once the process
// runs; use WaitSynced for its rules. Everything is stopped and removed
// when the test ends. Call it from the test goroutine.
func Start(tb testing.TB, cp *cphelper.ControlPlane, opts Options) *KubeProxy {
	tb.Helper()
	SkipUnlessPrivileged(tb)
	opts.defaults()
	switch opts.Mode {
	case NFTables, IPTables:
	case IPVS:
		SkipUnlessIPVS(tb)
	default:
		tb.Fatalf("kube-proxy mode %q: the harness runs %s, %s and %s", opts.Mode, NFTables, IPTables, IPVS)
	}
	bin := opts.Binary
	if bin == "" {
		bin = cp.Binaries().KubeProxy
	}
	if bin == "" {
		tb.Fatal("kube-proxy binary: not built (cphelper.Binaries.KubeProxy is empty)")
	}
	drops, err := unallocatedDrops(cp.ServiceCIDR())
	if err != nil {
		tb.Fatal(err)
	}
	kp := &KubeProxy{tb: tb, opts: opts, Netns: newNetnsName(), dir: tb.TempDir(), unallocatedDrops: drops}
	kp.log = filepath.Join(kp.dir, "kube-proxy.log")

	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		tb.Fatalf("admin client: %v", err)
	}
	kp.admin = admin
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureNodeOf(ctx, admin, opts); err != nil {
		tb.Fatal(err)
	}

	tb.Cleanup(kp.cleanup)
	if err := kp.setupNetns(); err != nil {
		tb.Fatal(err)
	}
	apiAddr := "127.0.0.1:" + strconv.Itoa(cp.Port())
	l, err := listenIn(kp.Netns, apiAddr)
	if err != nil {
		tb.Fatalf("api server relay: %v", err)
	}
	kp.fwd = newForwarder(l, apiAddr)

	cfgPath := filepath.Join(kp.dir, "kube-proxy.yaml")
	if err := os.WriteFile(cfgPath, []byte(configYAML(opts, cp.KubeconfigFor(cp.AdminToken()))), 0o600); err != nil {
		tb.Fatalf("write kube-proxy config: %v", err)
	}
	shim, err := writeModprobeShim(kp.dir)
	if err != nil {
		tb.Fatal(err)
	}
	if err := kp.start(bin, cfgPath, shim); err != nil {
		tb.Fatal(err)
	}
	return kp
}

// EnsureNode creates Node name with InternalIP ip and pod CIDR podCIDR, or
// leaves an existing one as it is. kube-proxy reads its node IPs from it.
func EnsureNode(ctx context.Context, c kubernetes.Interface, name, ip, podCIDR string) error {
	return ensureNode(ctx, c, name, []string{ip}, []string{podCIDR})
}

// EnsureNodeOf is EnsureNode for the node opts describe (the defaults
// filled in): on a dual-stack node, an InternalIP and a pod CIDR of each
// family.
func EnsureNodeOf(ctx context.Context, c kubernetes.Interface, opts Options) error {
	opts.defaults()
	return ensureNode(ctx, c, opts.NodeName, opts.nodeIPs(), opts.podCIDRs())
}

func ensureNode(ctx context.Context, c kubernetes.Interface, name string, ips, podCIDRs []string) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Spec:       corev1.NodeSpec{PodCIDR: podCIDRs[0], PodCIDRs: podCIDRs},
	}
	created, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	created.Status.Addresses = nil
	for _, ip := range ips {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("write node %s addresses: %w", name, err)
	}
	return nil
}

// configYAML is kube-proxy's config file. Every field that would make
// kube-proxy write a global setting is set to leave it alone (see the
// package comment); mode, clusterCIDR and hostnameOverride are here
// because with --config the equivalent flags are ignored. The ipvs
// section (read in ipvs mode only) is a MetalLB-style node's: scheduler rr,
// so that consecutive connections go to each endpoint in turn, and
// strictARP true, which MetalLB and kube-vip require in ipvs mode (the
// default, false, answers ARP for every kube-ipvs0 address on every
// interface); the timeouts 0s keep the kernel's.
func configYAML(o Options, kubeconfig string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
mode: %s
hostnameOverride: %s
detectLocalMode: ClusterCIDR
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  tcpBeLiberal: false
  udpTimeout: 0s
  udpStreamTimeout: 0s
ipvs:
  scheduler: rr
  strictARP: true
  tcpTimeout: 0s
  tcpFinTimeout: 0s
  udpTimeout: 0s
`, kubeconfig, o.Mode, o.NodeName, o.clusterCIDRs())
}

// writeModprobeShim writes dir/bin/modprobe, which refuses to load
// anything, and returns dir/bin.
func writeModprobeShim(dir string) (string, error) {
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", fmt.Errorf("create modprobe shim: %w", err)
	}
	script := "#!/bin/sh\necho \"modprobe $*: refused in the kube-proxy test namespace (modules are host-wide)\" >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(bin, "modprobe"), []byte(script), 0o755); err != nil {
		return "", fmt.Errorf("write modprobe shim: %w", err)
	}
	return bin, nil
}

func (kp *KubeProxy) setupNetns() error {
	if _, err := run("ip", "netns", "add", kp.Netns); err != nil {
		return fmt.Errorf("create network namespace: %w", err)
	}
	cidr := kp.opts.NodeIP + "/24"
	steps := [][]string{
		{"link", "set", "lo", "up"},
		// Both ends stay in the namespace: the node IP needs an interface
		// that is up, and the host gets nothing.
		{"link", "add", "kp0", "type", "veth", "peer", "name", "kp1"},
		{"addr", "add", cidr, "dev", "kp0"},
	}
	if kp.opts.DualStack {
		// nodad: usable at once (the address is unique in its namespace),
		// so NodePorts on it work without waiting out duplicate address
		// detection.
		steps = append(steps, []string{"-6", "addr", "add", kp.opts.NodeIP6 + "/64", "dev", "kp0", "nodad"})
	}
	steps = append(steps, []string{"link", "set", "kp0", "up"}, []string{"link", "set", "kp1", "up"})
	for _, args := range steps {
		if _, err := run("ip", append([]string{"-n", kp.Netns}, args...)...); err != nil {
			return fmt.Errorf("set up network namespace %s: %w", kp.Netns, err)
		}
	}
	return nil
}

func (kp *KubeProxy) start(bin, cfgPath, shim string) error {
	logf, err := os.Create(kp.log)
	if err != nil {
		return fmt.Errorf("create kube-proxy log: %w", err)
	}
	args := []string{"netns", "exec", kp.Netns, bin,
		"--config=" + cfgPath,
		"--hostname-override=" + kp.opts.NodeName,
		"-v=" + strconv.Itoa(kp.opts.Verbosity),
	}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), "PATH="+shim+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.Stdout, cmd.Stderr = logf, logf
	// ip execs kube-proxy in the same process, which keeps the death signal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	kp.started = time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("exec kube-proxy: %w", err)
	}
	kp.cmd, kp.exited = cmd, make(chan struct{})
	go func() {
		kp.waitErr = cmd.Wait()
		logf.Close()
		close(kp.exited)
	}()
	kp.tb.Logf("kubeproxy: started kube-proxy (%s mode, node %s %s) in netns %s", kp.opts.Mode, kp.opts.NodeName, strings.Join(kp.opts.nodeIPs(), " "), kp.Netns)
	return nil
}

// Started is when the kube-proxy process was started.
func (kp *KubeProxy) Started() time.Time { return kp.started }

// Exec runs a command inside the namespace and returns its standard output.
// The command starts in the namespace from a thread switched into it
// (netlab's RunCmd), which under the tests/vm guests' TCG costs a third of
// an `ip netns exec`; WaitSynced runs one every 100 ms.
func (kp *KubeProxy) Exec(args ...string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := (netlab.Namespace{Name: kp.Netns}).RunCmd(cmd); err != nil {
		return stdout.String(), fmt.Errorf("%s in %s: %w: %s", strings.Join(args, " "), kp.Netns, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Ruleset is the command that prints what kube-proxy writes in its mode:
// `nft list ruleset` (tables ip kube-proxy and ip6 kube-proxy, which the
// IPv4 and IPv6 proxiers write in separate transactions, one after the
// other), `iptables-save`, or in ipvs mode the IPVS table (`ipvsadm -Ln`)
// followed by `iptables-save`: kube-proxy creates the virtual servers
// first and restores its iptables rules at the end of the same sync.
func (kp *KubeProxy) Ruleset() []string {
	switch kp.opts.Mode {
	case IPTables:
		if kp.opts.DualStack {
			return []string{"sh", "-c", "iptables-save && ip6tables-save"}
		}
		return []string{"iptables-save"}
	case IPVS:
		return []string{"sh", "-c", "ipvsadm -Ln && iptables-save"}
	}
	return []string{"nft", "list", "ruleset"}
}

// WaitSynced polls Ruleset in the namespace every 100 ms until its output
// contains every string in want, and returns that output. It fails early
// if kube-proxy exits.
func (kp *KubeProxy) WaitSynced(ctx context.Context, want ...string) (string, error) {
	var last string
	var lastErr error
	var onlyDropSince time.Time
	for {
		out, err := kp.Exec(kp.Ruleset()...)
		if err == nil {
			missing := missingOf(out, want)
			if len(missing) == 0 {
				return out, nil
			}
			lastErr = fmt.Errorf("missing %q", missing)
			if kp.onlyDropsMissing(missing) {
				if onlyDropSince.IsZero() {
					onlyDropSince = time.Now()
				}
				if time.Since(onlyDropSince) > fullSyncWait {
					if err := kp.forceFullSync(ctx, missing); err != nil {
						return out, err
					}
					onlyDropSince = time.Now()
				}
			} else {
				onlyDropSince = time.Time{}
			}
		} else {
			lastErr = err
		}
		last = out
		select {
		case <-kp.exited:
			return last, fmt.Errorf("kube-proxy exited (%v) before its rules were synced: %s", kp.waitErr, kp.LogTail())
		case <-ctx.Done():
			return last, fmt.Errorf("kube-proxy rules not synced: %w (last: %v)", ctx.Err(), lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// fullSyncWait is how long WaitSynced waits for the unallocated-ClusterIP
// drop rules, all else being written, before it asks for a full sync.
const fullSyncWait = 3 * time.Second

// onlyDropsMissing reports whether what WaitSynced still misses are
// unallocated-ClusterIP drop rules only, which nftables mode writes in a
// full sync alone (see forceFullSync).
func (kp *KubeProxy) onlyDropsMissing(missing []string) bool {
	if kp.opts.Mode != NFTables || len(missing) == 0 {
		return false
	}
	for _, m := range missing {
		if !slices.Contains(kp.unallocatedDrops, m) {
			return false
		}
	}
	return true
}

// unallocatedDrops are the "Drop traffic to unallocated ClusterIPs" rules
// of nftables mode for the API server's --service-cluster-ip-range (one
// CIDR, or one per family separated by a comma), as nft lists them: each
// family's proxier writes its own CIDR into its own table (ip or ip6),
// from the ServiceCIDR objects the API server makes of the flag.
func unallocatedDrops(serviceCIDRs string) ([]string, error) {
	var drops []string
	for _, s := range strings.Split(serviceCIDRs, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("service cidr %q: %w", s, err)
		}
		family := "ip"
		if p.Addr().Is6() {
			family = "ip6"
		}
		drops = append(drops, fmt.Sprintf("%s daddr %s drop", family, p.Masked()))
	}
	return drops, nil
}

// forceFullSync changes the node's topology.kubernetes.io/zone label, which
// makes kube-proxy resync in full (OnTopologyChange). kube-proxy v1.37.2's
// nftables mode writes "Drop traffic to unallocated ClusterIPs" only in a
// full sync (at start, then hourly), and the ServiceCIDRs it needs for it
// may arrive after its first one, which nothing then repeats
// (OnServiceCIDRsChanged only records them): in a 6.12 guest its IPv4 full
// sync began 1 s before its ServiceCIDR informer delivered, and the rule
// stayed missing for the 3 minutes the test waited. On a node the same
// race leaves ClusterIPs nobody allocated answering as if routed, until
// the next full sync or restart.
func (kp *KubeProxy) forceFullSync(ctx context.Context, missing []string) error {
	kp.fullSyncs++
	zone := fmt.Sprintf("tracer-full-sync-%d", kp.fullSyncs)
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, corev1.LabelTopologyZone, zone)
	if _, err := kp.admin.CoreV1().Nodes().Patch(ctx, kp.opts.NodeName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node %s to make kube-proxy resync in full: %w", kp.opts.NodeName, err)
	}
	kp.tb.Logf("kubeproxy: nftables mode wrote everything but %q, whose ServiceCIDRs came after its last full sync: node labelled %s=%s for a full sync", missing, corev1.LabelTopologyZone, zone)
	return nil
}

func missingOf(out string, want []string) []string {
	var missing []string
	for _, w := range want {
		if !strings.Contains(out, w) {
			missing = append(missing, w)
		}
	}
	return missing
}

// Stop sends SIGTERM and waits up to 10 s for kube-proxy to exit (then
// kills it). It returns an error if kube-proxy had already exited or did
// not stop on SIGTERM; exiting with a status after SIGTERM is reported in
// the log, not as an error, since that is how kube-proxy ends.
func (kp *KubeProxy) Stop() error {
	if kp.cmd == nil {
		return errors.New("stop kube-proxy: not started")
	}
	select {
	case <-kp.exited:
		return fmt.Errorf("stop kube-proxy: already exited (%v): %s", kp.waitErr, kp.LogTail())
	default:
	}
	t0 := time.Now()
	_ = kp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-kp.exited:
		kp.tb.Logf("kubeproxy: kube-proxy stopped on SIGTERM in %s (%s)", time.Since(t0).Round(time.Millisecond), exitString(kp.waitErr))
		return nil
	case <-time.After(10 * time.Second):
		_ = kp.cmd.Process.Kill()
		<-kp.exited
		return errors.New("stop kube-proxy: still running 10 s after SIGTERM, killed")
	}
}

func exitString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// LogTail is the end of kube-proxy's log.
func (kp *KubeProxy) LogTail() string {
	b, err := os.ReadFile(kp.log)
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(string(b))
}

func (kp *KubeProxy) cleanup() {
	if kp.cmd != nil {
		select {
		case <-kp.exited:
		default:
			_ = kp.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-kp.exited:
			case <-time.After(10 * time.Second):
				_ = kp.cmd.Process.Kill()
				<-kp.exited
			}
		}
	}
	if kp.fwd != nil {
		_ = kp.fwd.Close()
	}
	if _, err := run("ip", "netns", "del", kp.Netns); err != nil && !strings.Contains(err.Error(), "No such file") {
		kp.tb.Errorf("remove network namespace %s: %v", kp.Netns, err)
	}
	if kp.tb.Failed() {
		kp.tb.Logf("kubeproxy: tail of kube-proxy log:\n%s", kp.LogTail())
	}
}
