package meta

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

func kubeconfig(server string) string {
	return `apiVersion: v1
kind: Config
clusters:
- cluster:
    server: ` + server + `
    insecure-skip-tls-verify: true
  name: lab
contexts:
- context:
    cluster: lab
    user: tracer
  name: lab
current-context: lab
users:
- name: tracer
  user:
    token: secret-token
`
}

func TestKubeconfigErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ name, data, want string }{
		{"malformed", "apiVersion: v1\nkind: Config\nclusters: [\n", "kubeconfig " + filepath.Join(dir, "malformed")},
		{"no-context", "apiVersion: v1\nkind: Config\nclusters: []\n", "kubeconfig " + filepath.Join(dir, "no-context")},
		{"bad-ca", strings.Replace(kubeconfig("https://127.0.0.1:6443"), "insecure-skip-tls-verify: true", "certificate-authority: missing-ca.crt", 1),
			filepath.Join(dir, "missing-ca.crt")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name)
			write(t, path, c.data)
			idx, err := NewFromKubeconfig(t.Context(), path, "node-2")
			if err == nil {
				t.Fatalf("NewFromKubeconfig(%s) = %v, want an error", c.name, idx)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %q", err, c.want)
			}
		})
	}
	missing := filepath.Join(dir, "nope")
	if _, err := NewFromKubeconfig(t.Context(), missing, "n"); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("NewFromKubeconfig(missing) = %v, want an error naming %s", err, missing)
	}
}

func TestKubeconfigInCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := NewFromKubeconfig(t.Context(), "", "n"); !errors.Is(err, ErrNoConfig) {
		t.Errorf("no kubeconfig outside a pod: %v, want ErrNoConfig", err)
	}
	// In a pod without a service account token the in-cluster config fails
	// with its own reason.
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		t.Skip("this machine has a service account token")
	}
	if _, err := NewFromKubeconfig(t.Context(), "", "n"); err == nil || !strings.HasPrefix(err.Error(), "in-cluster config: ") {
		t.Errorf("in-cluster without a token: %v", err)
	}
}

func TestKubeconfigUnreachable(t *testing.T) {
	// A port nothing listens on: connection refused, as for an API server
	// that is down.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	write(t, path, kubeconfig("https://"+addr))
	start := time.Now()
	idx, err := NewFromKubeconfig(t.Context(), path, "node-2", Options{SyncTimeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("unreachable API server is an error: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("start-up took %v", d)
	}
	if idx.Synced() {
		t.Error("synced without an API server")
	}
	w := strings.Join(idx.Warnings(), "\n")
	if !strings.Contains(w, "API server unreachable since") || !strings.Contains(w, "connection refused") || !strings.Contains(w, "metadata incomplete") {
		t.Errorf("warnings = %q", w)
	}
	if _, ok := idx.PodByIP(mustAddr("10.244.1.5"), time.Time{}); ok {
		t.Error("empty index found a pod")
	}
}

// TestKubeconfigRealAPIServer runs against a real kube-apiserver when
// TRACER_TEST_KUBECONFIG names its kubeconfig; the cluster must hold the
// objects of testdata/metadata/incidents.json (see testdata/metadata/README.md).
func TestKubeconfigRealAPIServer(t *testing.T) {
	path := os.Getenv("TRACER_TEST_KUBECONFIG")
	if path == "" {
		t.Skip("TRACER_TEST_KUBECONFIG not set")
	}
	idx, err := NewFromKubeconfig(t.Context(), path, "node-2")
	if err != nil {
		t.Fatal(err)
	}
	if !idx.Synced() || len(idx.Warnings()) != 0 {
		t.Fatalf("synced %v, warnings %q", idx.Synced(), idx.Warnings())
	}
	checkIncidents(t, idx, time.Now(), false)
}

// TestSilenceClientLogs runs in a child process: klog's logger is process
// state that running informers read.
func TestSilenceClientLogs(t *testing.T) {
	if os.Getenv("TRACER_META_SILENCE_CHILD") == "1" {
		klog.Info("visible line")
		klog.Flush()
		SilenceClientLogs()
		klog.Info("hidden line")
		klog.Flush()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSilenceClientLogs$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TRACER_META_SILENCE_CHILD=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v\n%s", err, stderr.String())
	}
	if out := stderr.String(); !strings.Contains(out, "visible line") || strings.Contains(out, "hidden line") {
		t.Errorf("stderr = %q, want only the line logged before silencing", out)
	}
}
