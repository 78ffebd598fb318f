package cphelper

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestPKI(t *testing.T) {
	dir := t.TempDir()
	p, err := writePKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		t.Fatalf("load serving pair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(p.caPEM) {
		t.Fatal("ca PEM holds no certificate")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("serving certificate does not verify for 127.0.0.1: %v", err)
	}
	for _, f := range []string{p.saPubFile, p.saKeyFile} {
		b, err := os.ReadFile(f)
		if err != nil || !strings.HasPrefix(string(b), "-----BEGIN ") {
			t.Errorf("%s: not PEM (%v)", f, err)
		}
	}
}

func TestApplyFile(t *testing.T) {
	cs := fake.NewClientset()
	ctx := context.Background()
	rbac := filepath.Join("..", "..", "..", "deploy", "rbac.yaml")
	for range 2 { // the second apply updates
		objs, err := ApplyFile(ctx, cs, rbac)
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) != 4 {
			t.Fatalf("applied %d objects, want 4", len(objs))
		}
	}
	role, err := cs.RbacV1().ClusterRoles().Get(ctx, "tracer", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get ClusterRole tracer: %v", err)
	}
	if len(role.Rules) != 2 {
		t.Errorf("ClusterRole tracer has %d rules, want 2", len(role.Rules))
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyFile(ctx, cs, bad); err == nil || !strings.Contains(err.Error(), "unsupported kind") {
		t.Errorf("apply a Secret: err = %v, want unsupported kind", err)
	}
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, []byte("---\n# nothing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyFile(ctx, cs, empty); err == nil {
		t.Errorf("apply an empty manifest: no error")
	}
}

// TestEnsureBinaries builds (or finds) the control-plane binaries and checks
// they are the versions the build module pins. `go test -run
// TestEnsureBinaries` prebuilds them.
func TestEnsureBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kube-apiserver, etcd and kube-proxy (minutes cold): skipped with -short")
	}
	start := time.Now()
	bins, err := EnsureBinaries(t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("binaries ready in %s", time.Since(start).Round(time.Millisecond))
	src, err := sourceDir()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubeVersion(filepath.Join(src, "build"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct{ bin, want string }{
		{bins.APIServer, "Kubernetes " + kube.full},
		{bins.Etcd, "etcd Version: 3.7.0"},
		{bins.KubeProxy, "Kubernetes " + kube.full},
		{bins.Kwok, "kwok version v0.8.0"},
	} {
		out, err := exec.Command(b.bin, "--version").CombinedOutput()
		if err != nil {
			t.Fatalf("%s --version: %v\n%s", b.bin, err, out)
		}
		if !strings.Contains(string(out), b.want) {
			t.Errorf("%s --version = %q, want %q", b.bin, out, b.want)
		}
	}
}

// TestEnsurePortmap builds (or finds) every portmap release the tests run
// and checks each binary says it is that release. `go test -run
// TestEnsurePortmap` prebuilds them.
func TestEnsurePortmap(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the portmap CNI plugin from the module proxy (a minute or more cold): skipped with -short")
	}
	for _, v := range PortmapVersions {
		start := time.Now()
		bin, err := EnsurePortmap(v, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("portmap %s ready in %s: %s", v, time.Since(start).Round(time.Millisecond), bin)
		// Without CNI_COMMAND a plugin prints its build string and exits 0.
		cmd := exec.Command(bin)
		cmd.Env = []string{}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", bin, err, out)
		}
		if want := "CNI portmap plugin " + v; !strings.Contains(string(out), want) {
			t.Errorf("%s says %q, want %q", bin, out, want)
		}
		again, err := EnsurePortmap(v, t.Logf)
		if err != nil || again != bin {
			t.Errorf("second EnsurePortmap(%s) = %q, %v; want %q", v, again, err, bin)
		}
	}
	if _, err := EnsurePortmap("v1.10.0; rm -rf /", t.Logf); err == nil {
		t.Error("EnsurePortmap accepted a version that is not a release tag")
	}
}
