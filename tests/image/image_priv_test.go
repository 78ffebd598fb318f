// Package image checks the container image `make image` writes: built by
// tools/image without a container daemon, unpacked from its tarball, and
// run under chroot (with /proc, /sys and /dev as a runtime gives them) on
// this machine's kernel.
package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/netlab"
)

func root(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func requireRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged tier: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged tier: needs root (chroot, mounts, namespaces)")
	}
	if k := os.Getenv("TRACER_VM_KERNEL"); k != "" {
		t.Skipf("the image is built and checked on the host tier, not in the %s VM", k)
	}
}

// built is the image of this test run: its tarball and unpacked root.
type built struct{ bin, tarball, rootfs string }

func buildImage(t *testing.T) built {
	t.Helper()
	dir := t.TempDir()
	b := built{bin: filepath.Join(dir, "tracer"), tarball: filepath.Join(dir, "tracer-image.tar"), rootfs: filepath.Join(dir, "rootfs")}
	for _, args := range [][]string{
		{"build", "-o", b.bin, "./cmd/tracer"},
		{"run", "-C", "tools/image", ".", "-binary", b.bin, "-out", b.tarball, "-rootfs", b.rootfs},
	} {
		cmd := exec.Command("go", args...)
		cmd.Dir = root(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, d := range []string{"proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(b.rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// inImage runs argv inside the image's root, in namespace ns (the host's
// when nil), with /proc, /sys and /dev mounted as a container runtime
// mounts them, in a mount namespace of its own.
func (b built) inImage(t *testing.T, ns *netlab.Namespace, argv ...string) (string, error) {
	t.Helper()
	script := `set -e; for d in proc sys dev; do mount --bind /$d "$0/$d"; done; exec chroot "$0" "$@"`
	args := append([]string{"--mount", "--fork", "sh", "-c", script, b.rootfs}, argv...)
	if ns != nil {
		args = append([]string{"ip", "netns", "exec", filepath.Base(ns.Path()), "unshare"}, args...)
	} else {
		args = append([]string{"unshare"}, args...)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = errors.Join(err, errors.New(stderr.String()))
	}
	return stdout.String(), err
}

// TestImage: the image holds the tracer built from this tree, and in it
// the tracer's doctor makes the same hook plan as the host's binary does
// on this kernel; iptables-save reads a namespace's rules from whichever
// backend holds them (nf_tables or legacy) as the node's own would, and
// nft and ipset read theirs.
func TestImage(t *testing.T) {
	requireRoot(t)
	b := buildImage(t)
	want, _ := os.ReadFile(b.bin)
	got, err := os.ReadFile(filepath.Join(b.rootfs, "usr/local/bin/tracer"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the image's /usr/local/bin/tracer is not the binary built from this tree (%v)", err)
	}
	checkTarball(t, b.tarball)

	inImage, err := b.inImage(t, nil, "/usr/local/bin/tracer", "doctor", "-o", "json")
	if err != nil {
		t.Fatalf("tracer doctor in the image: %v", err)
	}
	onHost, err := exec.Command(b.bin, "doctor", "-o", "json").Output()
	if err != nil {
		t.Fatalf("tracer doctor on the host: %v", err)
	}
	if hi, hh := hookPlan(t, []byte(inImage)), hookPlan(t, onHost); hi != hh {
		t.Errorf("doctor's plan in the image:\n%s\non the host:\n%s", hi, hh)
	} else {
		t.Logf("doctor in the image: %s", hi)
	}

	lab, err := netlab.New("trimg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	for _, tc := range []struct{ name, iptables, backend string }{
		{"nft", "iptables-nft", "(nf_tables)"},
		{"legacy", "iptables-legacy", "(legacy)"},
	} {
		ns, err := lab.Namespace(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		rule := []string{tc.iptables, "-t", "nat", "-A", "OUTPUT", "-d", "10.96.0.10/32", "-p", "tcp", "-m", "tcp", "--dport", "53", "-m", "comment", "--comment", "kube-system/kube-dns:dns-tcp", "-j", "DNAT", "--to-destination", "10.244.0.5:53"}
		if _, err := ns.Run(rule[0], rule[1:]...); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		version, err := b.inImage(t, &ns, "/usr/sbin/iptables-save", "--version")
		if err != nil || !strings.Contains(version, tc.backend) {
			t.Errorf("%s rules: the image's iptables-save is %q (%v), want the %s backend", tc.name, version, err, tc.backend)
		}
		save, err := b.inImage(t, &ns, "/usr/sbin/iptables-save")
		// As iptables-save prints it: the comment quoted, and only with
		// the xtables extensions (tcp, comment, DNAT) in the image.
		printed := `-A OUTPUT -d 10.96.0.10/32 -p tcp -m tcp --dport 53 -m comment --comment "kube-system/kube-dns:dns-tcp" -j DNAT --to-destination 10.244.0.5:53`
		if err != nil || !strings.Contains(save, printed) {
			t.Errorf("%s rules: the image's iptables-save printed (%v):\n%s", tc.name, err, save)
		}
	}
	ns, err := lab.Namespace("sets")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{
		{"ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"},
		{"ipset", "add", "KUBE-CLUSTER-IP", "10.96.0.10,tcp:53"},
		{"nft", "add", "table", "inet", "kube-proxy"},
	} {
		if _, err := ns.Run(c[0], c[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := b.inImage(t, &ns, "/usr/sbin/ipset", "save"); err != nil || !strings.Contains(out, "add KUBE-CLUSTER-IP 10.96.0.10,tcp:53") {
		t.Errorf("the image's ipset save (%v):\n%s", err, out)
	}
	if out, err := b.inImage(t, &ns, "/usr/sbin/nft", "list", "ruleset"); err != nil || !strings.Contains(out, "table inet kube-proxy") {
		t.Errorf("the image's nft list ruleset (%v):\n%s", err, out)
	}
}

// hookPlan is doctor's plan as "hook=via ..." for comparison.
func hookPlan(t *testing.T, doctorJSON []byte) string {
	t.Helper()
	var d struct {
		Hooks []struct{ Hook, Via string } `json:"hooks"`
	}
	if err := json.Unmarshal(doctorJSON, &d); err != nil || len(d.Hooks) == 0 {
		t.Fatalf("doctor -o json: %v: %s", err, doctorJSON)
	}
	var parts []string
	for _, h := range d.Hooks {
		parts = append(parts, h.Hook+"="+h.Via)
	}
	return strings.Join(parts, " ")
}

// checkTarball: a docker-loadable tarball naming tracer:dev, whose config
// runs the tracer's agent.
func checkTarball(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Size < 1<<20 { // the manifest and config, not the layers
			files[h.Name], _ = io.ReadAll(tr)
		}
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 || len(manifest[0].RepoTags) != 1 || manifest[0].RepoTags[0] != "tracer:dev" {
		t.Fatalf("manifest.json %s (%v): want one image tagged tracer:dev", files["manifest.json"], err)
	}
	var cfg struct {
		Architecture, OS string
		Config           struct{ Entrypoint, Cmd []string }
	}
	if err := json.Unmarshal(files[manifest[0].Config], &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/tracer" || strings.Join(cfg.Config.Cmd, " ") != "agent" {
		t.Errorf("image config %+v", cfg)
	}
	t.Logf("tarball %s: %d layers", filepath.Base(path), len(manifest[0].Layers))
}
