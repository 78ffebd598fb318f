package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

func deployManifest(t testing.TB, name string) string {
	return filepath.Join(filepath.Dir(rbacManifest(t)), name)
}

// TestAgentManifest: the API server takes deploy/agent.yaml as written,
// and the DaemonSet it stores is what the README promises: not
// privileged, exactly the listed capabilities, hostNetwork, a read-only
// root, the tracer's ServiceAccount, every node tolerated.
func TestAgentManifest(t *testing.T) {
	c := startCluster(t, 0)
	ctx := context.Background()
	if _, err := cphelper.ApplyFile(ctx, c.admin, deployManifest(t, "agent.yaml")); err != nil {
		t.Fatalf("apply deploy/agent.yaml: %v", err)
	}
	ds, err := c.admin.AppsV1().DaemonSets("tracer").Get(ctx, "tracer-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	ctr := spec.Containers[0]
	sc := ctr.SecurityContext
	var added []string
	for _, c := range sc.Capabilities.Add {
		added = append(added, string(c))
	}
	switch {
	case !spec.HostNetwork || spec.HostPID || spec.ServiceAccountName != "tracer":
		t.Errorf("pod spec: hostNetwork %v hostPID %v serviceAccount %q", spec.HostNetwork, spec.HostPID, spec.ServiceAccountName)
	case sc.Privileged == nil || *sc.Privileged || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("security context %+v: want unprivileged, read-only root, no escalation", sc)
	case !slices.Equal(added, []string{"BPF", "PERFMON", "NET_ADMIN", "SYS_RESOURCE"}) || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL":
		t.Errorf("capabilities %+v", sc.Capabilities)
	case len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists:
		t.Errorf("tolerations %+v: want every taint tolerated", spec.Tolerations)
	case ctr.ReadinessProbe == nil || ctr.ReadinessProbe.GRPC == nil || ctr.ReadinessProbe.GRPC.Port != 4246 || *ctr.ReadinessProbe.GRPC.Service != "tracer.v1.Agent":
		t.Errorf("readiness probe %+v: want gRPC health of tracer.v1.Agent on 4246", ctr.ReadinessProbe)
	case !slices.Contains(ctr.Args, "--listen=127.0.0.1:4245") || !slices.Contains(ctr.Args, "--health=0.0.0.0:4246"):
		t.Errorf("args %v: want flows on loopback, health on the node's address", ctr.Args)
	case ctr.Resources.Limits.Memory().IsZero() || ctr.Resources.Requests.Cpu().IsZero():
		t.Errorf("resources %+v: want a memory limit and a CPU request", ctr.Resources)
	}
}

// TestUserRBAC: deploy/user-rbac.yaml lets the group tracer-users find
// the agents and port-forward to them in namespace tracer, list nodes,
// and nothing else; the API server's authorizer answers.
func TestUserRBAC(t *testing.T) {
	c := startCluster(t, 0)
	ctx := context.Background()
	if _, err := cphelper.ApplyFile(ctx, c.admin, deployManifest(t, "user-rbac.yaml")); err != nil {
		t.Fatalf("apply deploy/user-rbac.yaml: %v", err)
	}
	oncall, err := kubernetes.NewForConfig(c.cp.ConfigFor(c.cp.OnCallToken()))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns, verb, resource string
		allowed            bool
	}{
		{"tracer", "list", "pods", true},
		{"tracer", "get", "pods", true},
		{"tracer", "create", "pods/portforward", true},
		{"", "list", "nodes", true},
		{"default", "list", "pods", false},
		{"default", "create", "pods/portforward", false},
		{"tracer", "create", "pods/exec", false},
		{"tracer", "delete", "pods", false},
		{"tracer", "get", "secrets", false},
		{"", "get", "nodes", false},
	} {
		if got := accessReview(ctx, t, oncall, tc.verb, "", tc.resource, tc.ns); got.Allowed != tc.allowed {
			t.Errorf("%s %s in %q: allowed %v, want %v", tc.verb, tc.resource, tc.ns, got.Allowed, tc.allowed)
		}
	}
}

// TestKubectlTracerRBAC runs the binary as kubectl-tracer against the
// real API server: a user granted nothing gets a clear refusal that says
// what to grant; the on-call user of deploy/user-rbac.yaml gets past
// authorization to the node itself, which here has no kubelet, and that
// node's failure is named; a node without an agent, a pending agent pod
// and a bad selector are said as such.
func TestKubectlTracerRBAC(t *testing.T) {
	c := startCluster(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, m := range []string{"agent.yaml", "user-rbac.yaml"} {
		if _, err := cphelper.ApplyFile(ctx, c.admin, deployManifest(t, m)); err != nil {
			t.Fatalf("apply deploy/%s: %v", m, err)
		}
	}
	for _, n := range []string{"node-a", "node-b"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"pool": "web"}}}
		if _, err := c.admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agentPod(t, ctx, c.admin, "tracer-agent-a", "node-a", corev1.PodRunning)
	agentPod(t, ctx, c.admin, "tracer-agent-b", "node-b", corev1.PodPending)
	bin := buildPlugin(t)
	plain, oncall := c.cp.KubeconfigFor(c.cp.PlainToken()), c.cp.KubeconfigFor(c.cp.OnCallToken())

	code, _, stderr := runPlugin(t, bin, "--kubeconfig", plain, "--all-nodes")
	t.Logf("plain user:\n%s", stderr)
	if code != 1 || !strings.Contains(stderr, `User "plain" cannot list resource "pods"`) || !strings.Contains(stderr, "deploy/user-rbac.yaml") {
		t.Errorf("plain user: exit %d, stderr %q: want 1, the API server's refusal and what to grant", code, stderr)
	}
	code, _, stderr = runPlugin(t, bin, "--kubeconfig", plain, "-l", "pool=web")
	if code != 1 || !strings.Contains(stderr, "forbidden") {
		t.Errorf("plain user -l: exit %d, stderr %q", code, stderr)
	}

	// May find the agents, may not port-forward to them.
	grantListPods(t, ctx, c.admin, cphelper.PlainUser)
	code, stdout, stderr := runPlugin(t, bin, "--kubeconfig", plain, "--node", "node-a", "-o", "text")
	t.Logf("a user without pods/portforward:\n%s%s", stdout, stderr)
	if code != 1 || !strings.Contains(stdout, `cannot create resource "pods/portforward"`) || !strings.Contains(stdout, "deploy/user-rbac.yaml") {
		t.Errorf("a user without pods/portforward: exit %d, want 1 saying the refusal and what to grant:\n%s%s", code, stdout, stderr)
	}

	code, stdout, stderr = runPlugin(t, bin, "--kubeconfig", oncall, "-l", "pool=web", "--duration", "20s")
	t.Logf("on-call user, -l pool=web:\n%s%s", stdout, stderr)
	if code != 1 {
		t.Errorf("on-call user: exit %d, want 1 (no kubelet answers); stderr %q", code, stderr)
	}
	for _, want := range []string{"port-forward to tracer/tracer-agent-a", "agent pod tracer/tracer-agent-b is Pending, not Running"} {
		if !strings.Contains(stdout+stderr, want) {
			t.Errorf("on-call user: the output lacks %q:\n%s\n%s", want, stdout, stderr)
		}
	}
	if strings.Contains(stdout+stderr, "forbidden") {
		t.Errorf("on-call user was refused by the API server:\n%s\n%s", stdout, stderr)
	}
	code, _, stderr = runPlugin(t, bin, "--kubeconfig", oncall, "--node", "node-a,node-c")
	if code != 1 || !strings.Contains(stderr, "no agent pod") || !strings.Contains(stderr, "node-c") {
		t.Errorf("a node without an agent: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runPlugin(t, bin, "--kubeconfig", oncall, "-l", "pool in (")
	if code != 2 {
		t.Errorf("a bad selector: exit %d, want 2; stderr %q", code, stderr)
	}
	code, _, stderr = runPlugin(t, bin, "--kubeconfig", oncall)
	if code != 2 || !strings.Contains(stderr, "--all-nodes") {
		t.Errorf("no node named: exit %d, want 2 saying how to name them; stderr %q", code, stderr)
	}
}

func agentPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, name, node string, phase corev1.PodPhase) {
	t.Helper()
	p := testPod("tracer", name, node)
	p.Labels = map[string]string{"app.kubernetes.io/name": "tracer-agent"}
	p, err := cs.CoreV1().Pods("tracer").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = phase
	if _, err := cs.CoreV1().Pods("tracer").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// buildPlugin builds the tracer as kubectl-tracer, the name kubectl runs
// a plugin by.
func buildPlugin(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	bin := filepath.Join(t.TempDir(), "kubectl-tracer")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/tracer")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func runPlugin(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

// grantListPods lets user find the agent pods, and nothing more.
func grantListPods(t *testing.T, ctx context.Context, cs kubernetes.Interface, user string) {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "list-pods", Namespace: "tracer"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}}}
	if _, err := cs.RbacV1().Roles("tracer").Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "list-pods", Namespace: "tracer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "list-pods"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}}}
	if _, err := cs.RbacV1().RoleBindings("tracer").Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
