// Package e2e runs the tracer's Kubernetes code against a real
// kube-apiserver and etcd (see tests/controlplane/cphelper). Skipped under
// -short; otherwise the control plane is built on first use, which takes
// minutes cold.
package e2e

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// cluster is a control plane with deploy/rbac.yaml applied.
type cluster struct {
	cp     *cphelper.ControlPlane
	admin  kubernetes.Interface
	tracer kubernetes.Interface
	// tracerKubeconfig authenticates as the tracer's ServiceAccount.
	tracerKubeconfig string
}

func rbacManifest(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("locate deploy/rbac.yaml: runtime.Caller failed")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "rbac.yaml")
}

// startCluster starts a control plane and applies the tracer's RBAC with
// the admin client. adminQPS raises the admin client's rate limit.
func startCluster(t *testing.T, adminQPS float32) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real kube-apiserver and etcd (built from Go modules on first use, minutes cold): skipped with -short")
	}
	cp := cphelper.Start(t)
	cfg := cp.AdminConfig()
	if adminQPS > 0 {
		cfg.QPS, cfg.Burst = adminQPS, int(adminQPS)
	}
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cphelper.ApplyFile(ctx, admin, rbacManifest(t)); err != nil {
		t.Fatalf("apply deploy/rbac.yaml: %v", err)
	}
	tracer, err := kubernetes.NewForConfig(cp.ConfigFor(cp.TracerToken()))
	if err != nil {
		t.Fatalf("tracer client: %v", err)
	}
	return &cluster{cp: cp, admin: admin, tracer: tracer, tracerKubeconfig: cp.KubeconfigFor(cp.TracerToken())}
}
