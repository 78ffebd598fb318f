package kubeproxy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// V133Env names a kube-proxy v1.33 binary for TestV133Layout to compare
// with the hand-written layout. Build one with a module like
// tests/controlplane/build but requiring k8s.io/kubernetes v1.33.0 and
// replacing each k8s.io staging module with v0.33.0 (see
// tests/controlplane/README.md).
const V133Env = "TRACER_KUBE_PROXY_V133"

const layoutBase = "kube-proxy-v1.33-layout"

// TestV133Layout loads internal/nft/testdata/kube-proxy-v1.33-layout.nft
// into a scratch network namespace and checks its listing against
// kube-proxy-v1.33-layout.json (TRACER_UPDATE_FIXTURES=1 rewrites that and
// kube-proxy-v1.33-layout.nft-a). With TRACER_KUBE_PROXY_V133 set (and
// without -short) it also runs that kube-proxy with the fixture Services
// and checks it writes the same structure.
func TestV133Layout(t *testing.T) {
	SkipUnlessPrivileged(t)
	skipOtherVMKernels(t, NFTables)
	dir := testdataDir(t)
	name := newNetnsName()
	if _, err := run("ip", "netns", "add", name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := run("ip", "netns", "del", name); err != nil {
			t.Errorf("remove scratch namespace: %v", err)
		}
	})
	if _, err := run("ip", "netns", "exec", name, "nft", "-f", filepath.Join(dir, layoutBase+".nft")); err != nil {
		t.Fatalf("load %s.nft: %v", layoutBase, err)
	}
	js, err := run("ip", "netns", "exec", name, "nft", "-j", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	text, err := run("ip", "netns", "exec", name, "nft", "-a", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	layout, err := Canonical([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	jsonPath := filepath.Join(dir, layoutBase+".json")
	if os.Getenv(UpdateEnv) == "1" {
		if err := os.WriteFile(jsonPath, []byte(js), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, layoutBase+".nft-a"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	} else {
		data, err := os.ReadFile(jsonPath)
		if err != nil {
			t.Fatalf("read %s (regenerate with %s=1): %v", jsonPath, UpdateEnv, err)
		}
		want, err := Canonical(data)
		if err != nil {
			t.Fatal(err)
		}
		if d := LineDiff(want, layout); len(d) > 0 {
			t.Errorf("%s.nft loads as something else than %s (regenerate with %s=1):\n%s", layoutBase, jsonPath, UpdateEnv, strings.Join(d, "\n"))
		}
	}

	bin := os.Getenv(V133Env)
	if bin == "" || testing.Short() {
		t.Logf("not compared with a real kube-proxy v1.33: set %s to its binary (and run without -short)", V133Env)
		return
	}
	checkHostUnchanged(t, NFTables)
	kp, _ := startFixtureWith(t, Options{Binary: bin})
	ctx, cancel := context.WithTimeout(context.Background(), SyncTimeout())
	defer cancel()
	if _, err := kp.WaitSynced(ctx,
		"ns4/svc4/tcp/p80__10.180.0.5/80", "ns8/svc8/udp/p53__10.180.0.8/53", "ns7/svc7/tcp/p80__10.180.1.7/80",
		"default/kubernetes/tcp/https__192.0.2.1/6443", `comment "ns6/svc6:p80"`,
		"Drop traffic to unallocated ClusterIPs", "ip6 daddr . meta l4proto . th dport vmap @service-ips"); err != nil {
		t.Fatal(err)
	}
	version, _ := kp.Exec(bin, "--version")
	realJS, err := kp.Exec("nft", "-j", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	real, err := Canonical([]byte(realJS))
	if err != nil {
		t.Fatal(err)
	}
	if d := LineDiff(layout, real); len(d) > 0 {
		realText, _ := kp.Exec("nft", "-a", "list", "ruleset")
		t.Errorf("%s writes another ruleset than %s.nft (- layout, + real):\n%s\n\nreal:\n%s", strings.TrimSpace(version), layoutBase, strings.Join(d, "\n"), realText)
	} else {
		t.Logf("%s writes the structure of %s.nft", strings.TrimSpace(version), layoutBase)
	}
	if err := kp.Stop(); err != nil {
		t.Error(err)
	}
}
