package kubeproxy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// UpdateEnv regenerates the fixtures instead of checking them.
const UpdateEnv = "TRACER_UPDATE_FIXTURES"

// fixtureBase is internal/nft/testdata/kube-proxy-<version>; the version is
// the one tests/controlplane/build pins.
const fixtureBase = "kube-proxy-v1.37.2"

func testdataDir(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("locate internal/nft/testdata: runtime.Caller failed")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "internal", "nft", "testdata")
}

func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a real kube-apiserver, etcd and kube-proxy (built from Go modules on first use, minutes cold): skipped with -short")
	}
}

// vmKernel is the kernel this package's nftables-mode privileged tests
// run on in the tests/vm matrix (kube-proxy's nftables mode needs 5.13 or
// later, and 6.12 is the kernel nodes run now).
const vmKernel = "6.12"

// skipOtherVMKernels skips a test of mode in a tests/vm guest that does
// not run it. Under TCG each control plane takes 20-30 s to start and a
// test one to four minutes, and CI has an hour for all three guests:
//   - ipvs mode runs only in the guests (the build host has no IPVS), one
//     of its two tests per guest that runs one (vmIPVSGuests);
//   - nftables mode runs on the host and on vmKernel, for the tracer's
//     fentry tier under kube-proxy's own ruleset; kube-proxy refuses it on
//     kernels before 5.13 (pkg/proxy/nftables: "kube-proxy in nftables
//     mode requires kernel 5.13 or later");
//   - iptables mode runs on the host only: what differs per kernel there is
//     the capture of its DNAT, REJECT and drops, which TestCapture checks
//     on every guest, while the rules are read in userspace, the same on
//     every kernel.
func skipOtherVMKernels(t *testing.T, mode Mode) {
	t.Helper()
	k := os.Getenv("TRACER_VM_KERNEL")
	switch {
	case k == "" || mode == IPVS:
	case mode == IPTables:
		t.Skipf("the VM matrix leaves iptables mode with the real kube-proxy to the host (TestCapture checks this kernel's capture of its decisions; each control plane takes 20-30 s to start under TCG); this guest runs %s", k)
	case mode == NFTables && k == "5.10":
		t.Skipf("kube-proxy's nftables mode needs kernel 5.13 or later (pkg/proxy/nftables/supported.go); this guest runs %s", k)
	case k != vmKernel:
		t.Skipf("the VM matrix runs the %s-mode control-plane tests on %s only (each control plane takes 20-30 s to start under TCG; the host runs them too); this guest runs %s", mode, vmKernel, k)
	}
}

// vmIPVSGuests are the guests that run each of the two ipvs-mode tests
// with the real kube-proxy. The tracer follows ip_vs with kprobes on 5.10
// (fentry on module functions came in 5.11) and with fentry after, so the
// trace test runs on 5.10 and the incidents on 6.1: both rungs meet the
// real kube-proxy, within CI's hour (under TCG the incidents' cluster took
// 274 s on 5.10 and 154 s on 6.1, the trace test 139 s and 104 s). 6.12's
// ip_vs is exercised by TestCapture, TestIPVSModuleUnloaded and the lab's
// IPVS scenarios, and its guest runs the nftables-mode tests.
var vmIPVSGuests = map[string][]string{
	"TestPrivIncidentsIPVS":      {"6.1"},
	"TestPrivTraceKubeProxyIPVS": {"5.10"},
}

// skipOtherIPVSGuests skips an ipvs-mode test in the guests that do not
// run it.
func skipOtherIPVSGuests(t *testing.T) {
	t.Helper()
	k := os.Getenv("TRACER_VM_KERNEL")
	if guests := vmIPVSGuests[t.Name()]; k != "" && !slices.Contains(guests, k) {
		t.Skipf("the VM matrix runs %s in the %s guest only (the ipvs-mode tests with the real kube-proxy are shared over the guests, for CI's hour); this guest runs %s", t.Name(), strings.Join(guests, " and "), k)
	}
}

// preloadModulesInVM loads, in a tests/vm guest and before the host is
// read, the modules whose loading would otherwise show as a change of the
// host: nf_conntrack (its sysctls and
// /sys/module/nf_conntrack/parameters/hashsize exist only once it is
// loaded, and the guest's modular kernel loads it on the first rule that
// needs conntrack, kube-proxy's `ct state new`: the kernel's autoloading,
// which the host check reported as kube-proxy changing the host on the
// first VM run) and ip_set (ReadHost lists the host's ipsets only when it
// is loaded). In ipvs mode also ip_vs, whose net/ipv4/vs sysctls and
// /proc/net/ip_vs appear with it and which the kernel loads when
// kube-proxy opens the IPVS generic netlink family, and ip_vs_rr, the
// scheduler the config names, which the kernel loads when kube-proxy adds
// its first virtual server. The build host's kernel has nf_conntrack and
// ip_set built in and no IPVS, so nothing is loaded there.
func preloadModulesInVM(t *testing.T, mode Mode) {
	t.Helper()
	if os.Getenv("TRACER_VM") == "" {
		return
	}
	mods := []string{"nf_conntrack", "ip_set"}
	if mode == IPVS {
		mods = append(mods, "ip_vs", "ip_vs_rr")
	}
	for _, m := range mods {
		if _, err := run("modprobe", m); err != nil {
			t.Fatalf("load %s in the VM guest before reading its state: %v", m, err)
		}
	}
}

// checkHostUnchanged skips a test of mode in a guest that does not run it,
// reads the host's state (ReadHost) now and registers a cleanup, run
// after every later cleanup (kube-proxy stopped, its namespace deleted,
// the control plane stopped), that fails the test if any of it changed.
func checkHostUnchanged(t *testing.T, mode Mode) {
	t.Helper()
	skipOtherVMKernels(t, mode)
	preloadModulesInVM(t, mode)
	before, err := ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		after, err := ReadHost()
		if err != nil {
			t.Errorf("read host after the test: %v", err)
			return
		}
		if d := after.Diff(before); len(d) > 0 {
			t.Errorf("the host changed while kube-proxy ran in its namespace:\n%s", strings.Join(d, "\n"))
		}
	})
}

// startFixture starts a control plane with the fixture's Service CIDR,
// creates the Node and the fixture objects and then kube-proxy in mode.
// The objects exist before kube-proxy starts, so its first sync writes all
// of them in one transaction.
func startFixture(t *testing.T, mode Mode) (*KubeProxy, kubernetes.Interface) {
	t.Helper()
	return startFixtureWith(t, Options{Mode: mode})
}

// startFixtureWith is startFixture with all of kube-proxy's options.
func startFixtureWith(t *testing.T, opts Options) (*KubeProxy, kubernetes.Interface) {
	t.Helper()
	cp := cphelper.StartWith(t, cphelper.Options{ServiceCIDR: FixtureServiceCIDR, NoEndpointReconciler: true})
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureNode(ctx, admin, DefaultNodeName, DefaultNodeIP, DefaultPodCIDR); err != nil {
		t.Fatal(err)
	}
	if err := CreateFixture(ctx, admin, DefaultNodeName); err != nil {
		t.Fatal(err)
	}
	return Start(t, cp, opts), admin
}

// TestNFTablesRuleset runs kube-proxy v1.37.2 in nftables mode with the
// fixture Services and checks that it writes the structure recorded in
// internal/nft/testdata/kube-proxy-v1.37.2.json (compared with Canonical:
// handles and listing order aside). With TRACER_UPDATE_FIXTURES=1 it
// rewrites that file and kube-proxy-v1.37.2.nft (`nft -a list ruleset`)
// instead. Then it adds a Service and measures how long kube-proxy takes to
// write it. The host's conntrack settings and rulesets must be unchanged.
func TestNFTablesRuleset(t *testing.T) {
	skipShort(t)
	SkipUnlessPrivileged(t)
	checkHostUnchanged(t, NFTables)
	kp, admin := startFixture(t, NFTables)

	ctx, cancel := context.WithTimeout(context.Background(), SyncTimeout())
	defer cancel()
	if _, err := kp.WaitSynced(ctx, FixtureSynced...); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-proxy wrote the fixture Services %s after it was started", time.Since(kp.Started()).Round(time.Millisecond))

	js, err := kp.Exec("nft", "-j", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	text, err := kp.Exec("nft", "-a", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Canonical([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	jsonPath := filepath.Join(testdataDir(t), fixtureBase+".json")
	nftPath := filepath.Join(testdataDir(t), fixtureBase+".nft")
	if os.Getenv(UpdateEnv) == "1" {
		if err := os.MkdirAll(filepath.Dir(jsonPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(jsonPath, []byte(js), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(nftPath, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s and %s", jsonPath, nftPath)
	} else {
		data, err := os.ReadFile(jsonPath)
		if err != nil {
			t.Fatalf("read fixture (regenerate with %s=1): %v", UpdateEnv, err)
		}
		want, err := Canonical(data)
		if err != nil {
			t.Fatalf("fixture %s: %v", jsonPath, err)
		}
		if d := LineDiff(want, got); len(d) > 0 {
			live := filepath.Join(t.TempDir(), fixtureBase+".live.nft")
			_ = os.WriteFile(live, []byte(text), 0o644)
			t.Errorf("kube-proxy's ruleset differs from %s (- fixture, + now; regenerate with %s=1 if the change is expected):\n%s\n\nnow:\n%s",
				jsonPath, UpdateEnv, strings.Join(d, "\n"), text)
		}
	}

	// A Service added while kube-proxy runs: how long until its rules exist.
	ctx, cancel = context.WithTimeout(context.Background(), SyncTimeout())
	defer cancel()
	t0 := time.Now()
	if err := createService9(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if _, err := kp.WaitSynced(ctx, "dnat to 10.180.0.9:80"); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-proxy wrote a new Service %s after it was created", time.Since(t0).Round(time.Millisecond))

	// The unallocated-ClusterIP drop, gone as when kube-proxy's ServiceCIDRs
	// come after its first full sync, is back once WaitSynced asks for a
	// full sync.
	checkFullSyncRestoresDrop(t, kp, "ip", FixtureSynced)

	if err := kp.Stop(); err != nil {
		t.Error(err)
	}
}

// createService9 adds ns9/svc9 ClusterIP 172.30.0.49 tcp/80 with endpoint
// 10.180.0.9:80 (not part of the fixture).
func createService9(ctx context.Context, c kubernetes.Interface) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns9"}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace ns9: %w", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns9", Name: "svc9"},
		Spec: corev1.ServiceSpec{
			ClusterIP: "172.30.0.49",
			Ports:     []corev1.ServicePort{{Name: "p80", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}},
		},
	}
	if _, err := c.CoreV1().Services("ns9").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service ns9/svc9: %w", err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns9", Name: "svc9-1", Labels: map[string]string{discoveryv1.LabelServiceName: "svc9"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p80"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](80)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{"10.180.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(DefaultNodeName),
		}},
	}
	if _, err := c.DiscoveryV1().EndpointSlices("ns9").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpointslice ns9/svc9-1: %w", err)
	}
	return nil
}

// TestIPTablesMode runs the same harness with kube-proxy in iptables mode:
// the fixture Services reach iptables-save in the namespace, and the host
// is unchanged.
func TestIPTablesMode(t *testing.T) {
	skipShort(t)
	SkipUnlessPrivileged(t)
	checkHostUnchanged(t, IPTables)
	kp, _ := startFixture(t, IPTables)
	ctx, cancel := context.WithTimeout(context.Background(), SyncTimeout())
	defer cancel()
	out, err := kp.WaitSynced(ctx, FixtureSyncedIPTables...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-proxy (iptables mode) wrote the fixture Services %s after it was started", time.Since(kp.Started()).Round(time.Millisecond))
	if !strings.Contains(out, "-A KUBE-SERVICES") {
		t.Errorf("iptables-save in the namespace has no KUBE-SERVICES rules:\n%s", out)
	}
	if err := kp.Stop(); err != nil {
		t.Error(err)
	}
}

// TestCanonical checks the comparison on a small ruleset: handles and the
// order of chains and elements do not count, the order of rules does.
func TestCanonical(t *testing.T) {
	a := `{"nftables":[{"metainfo":{"version":"1.0.6"}},
{"table":{"family":"ip","name":"t","handle":1}},
{"chain":{"family":"ip","table":"t","name":"b","handle":3}},
{"chain":{"family":"ip","table":"t","name":"a","handle":2}},
{"set":{"family":"ip","table":"t","name":"s","handle":4,"type":"ipv4_addr","elem":["10.0.0.2","10.0.0.1"]}},
{"rule":{"family":"ip","table":"t","chain":"a","handle":5,"expr":[{"accept":null}]}},
{"rule":{"family":"ip","table":"t","chain":"a","handle":6,"expr":[{"drop":null}]}}]}`
	b := `{"nftables":[{"metainfo":{"version":"1.1.0"}},
{"table":{"family":"ip","name":"t","handle":7}},
{"chain":{"family":"ip","table":"t","name":"a","handle":9}},
{"rule":{"family":"ip","table":"t","chain":"a","handle":10,"expr":[{"accept":null}]}},
{"rule":{"family":"ip","table":"t","chain":"a","handle":11,"expr":[{"drop":null}]}},
{"chain":{"family":"ip","table":"t","name":"b","handle":8}},
{"set":{"family":"ip","table":"t","name":"s","handle":12,"type":"ipv4_addr","elem":["10.0.0.1","10.0.0.2"]}}]}`
	swapped := strings.Replace(strings.Replace(b, `"accept":null`, `"x":null`, 1), `"drop":null`, `"accept":null`, 1)
	swapped = strings.Replace(swapped, `"x":null`, `"drop":null`, 1)
	ca, err := Canonical([]byte(a))
	if err != nil {
		t.Fatal(err)
	}
	cb, err := Canonical([]byte(b))
	if err != nil {
		t.Fatal(err)
	}
	if d := LineDiff(ca, cb); len(d) > 0 {
		t.Errorf("same structure compares different:\n%s", strings.Join(d, "\n"))
	}
	cs, err := Canonical([]byte(swapped))
	if err != nil {
		t.Fatal(err)
	}
	if d := LineDiff(ca, cs); len(d) == 0 {
		t.Error("rules in another order compare equal")
	}
}

// checkFullSyncRestoresDrop deletes the unallocated-ClusterIP drop from
// table family (ip or ip6) kube-proxy, as if its ServiceCIDRs had come
// after its last full sync, and checks that WaitSynced for want (which
// must hold the drop) asks for the full sync that brings it back.
func checkFullSyncRestoresDrop(t *testing.T, kp *KubeProxy, family string, want []string) {
	t.Helper()
	i := slices.IndexFunc(kp.unallocatedDrops, func(d string) bool { return strings.HasPrefix(d, family+" daddr ") })
	if i < 0 {
		t.Fatalf("no unallocated-ClusterIP drop of family %s among %q: the control plane has no Service range of that family", family, kp.unallocatedDrops)
	}
	drop := kp.unallocatedDrops[i]
	out, err := kp.Exec("nft", "-a", "list", "chain", family, "kube-proxy", "cluster-ips-check")
	if err != nil {
		t.Fatal(err)
	}
	handle := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, drop) {
			if _, h, ok := strings.Cut(line, "# handle "); ok {
				handle = strings.TrimSpace(h)
			}
		}
	}
	if handle == "" {
		t.Fatalf("no %q rule with a handle in cluster-ips-check:\n%s", drop, out)
	}
	if _, err := kp.Exec("nft", "delete", "rule", family, "kube-proxy", "cluster-ips-check", "handle", handle); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), SyncTimeout())
	defer cancel()
	before := kp.fullSyncs
	t0 := time.Now()
	if _, err := kp.WaitSynced(ctx, want...); err != nil {
		t.Fatalf("after the drop rule was deleted: %v", err)
	}
	t.Logf("%q deleted from %s kube-proxy: back %s later", drop, family, time.Since(t0).Round(time.Millisecond))
	if kp.fullSyncs == before {
		t.Errorf("the drop rule came back without a full sync asked for: the deletion did not take")
	}
}
