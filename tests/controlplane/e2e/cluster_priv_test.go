package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/lab"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// TestClusterMode is issue 18's end to end: the real kube-apiserver and
// etcd, kwok playing the kubelets of two nodes, and on each a tracer agent
// that runs as a real process observing a network namespace that is that
// node. The nodes are the lab's return-path-etp-local scenario: node-1
// DNATs an LB IP to a pod on node-2 without SNAT, and "outside" is the
// client's host, whose stack resets the pod's direct answer. The agents'
// pods are the DaemonSet's as kwok runs them; kwok forwards their
// port-forwards to the agent processes. `kubectl tracer --all-nodes`,
// run as the on-call user of deploy/user-rbac.yaml, finds the pods, opens
// the port-forwards through the API server and merges both nodes'
// streams. Truth is the lab's (the client's connect timed out, node-1's
// conntrack entry stayed unreplied, the baseline connected) and the
// agents' own: one agent killed mid-stream is that node's error while the
// other's flows still come.
func TestClusterMode(t *testing.T) {
	requireRootHost(t)
	c := startCluster(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, m := range []string{"agent.yaml", "user-rbac.yaml"} {
		if _, err := cphelper.ApplyFile(ctx, c.admin, deployManifest(t, m)); err != nil {
			t.Fatalf("apply deploy/%s: %v", m, err)
		}
	}
	built := buildScenario(t, ctx, "return-path-etp-local")
	tracer := buildTracer(t)
	metadata := filepath.Join(t.TempDir(), "metadata.json")
	if err := os.WriteFile(metadata, built.MetadataJSON, 0o644); err != nil {
		t.Fatal(err)
	}

	agents := map[string]*exec.Cmd{}
	netnsOf := map[string]string{}  // node -> the namespace that is it
	forwards := map[string]string{} // pod name -> the agent's address
	for _, ns := range built.Observe {
		node := "outside"
		if ns.Path() == built.Node.Path() {
			node = built.NodeName
		}
		cmd, addr := startAgent(t, tracer, ns.Path(), node, metadata)
		agents[node], netnsOf[node] = cmd, ns.Path()
		forwards["tracer-agent-"+node] = addr
	}
	startKwok(t, c, forwards)
	for pod := range forwards {
		node := strings.TrimPrefix(pod, "tracer-agent-")
		createFakeNode(t, ctx, c.admin, node)
		createAgentPod(t, ctx, c.admin, pod, node)
	}
	waitRunning(t, ctx, c.admin, len(forwards))

	plugin := filepath.Join(filepath.Dir(tracer), "kubectl-tracer")
	if err := os.Symlink(tracer, plugin); err != nil {
		t.Fatal(err)
	}
	oncall := c.cp.KubeconfigFor(c.cp.OnCallToken())
	checkDoctor(t, plugin, oncall, built.NodeName)
	checkClusterAudit(t, tracer, plugin, oncall, metadata, netnsOf)
	kc := exec.Command(plugin, "--kubeconfig", oncall, "--all-nodes", "-o", "json")
	var out, errb lockedBuffer
	kc.Stdout, kc.Stderr = &out, &errb
	if err := kc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kc.Process.Kill() })
	time.Sleep(3 * time.Second) // the port-forwards open, the streams subscribe

	exps, err := built.Traffic(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the agents' linger, and the streams
	// The client's host goes away mid-stream: its node is an error from
	// then on, and node-1 goes on.
	agents["outside"].Process.Signal(syscall.SIGKILL)
	agents["outside"].Wait()
	later := connectTwice(t, built)
	time.Sleep(2 * time.Second)
	agents[built.NodeName].Process.Signal(syscall.SIGTERM)
	if err := agents[built.NodeName].Wait(); err != nil {
		t.Errorf("node-1's agent on SIGTERM: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- kc.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Errorf("kubectl tracer: %v, want exit 1 (the outside agent failed); stderr:\n%s", err, errb.String())
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("kubectl tracer did not end with its agents; stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	}
	t.Logf("kubectl tracer's stderr:\n%s", errb.String())
	f, err := trace.ReadAll(strings.NewReader(out.String()), "kubectl tracer")
	if err != nil {
		t.Fatalf("the merged trace: %v\n%s", err, out.String())
	}
	checkClusterTrace(t, f, exps, later, built.NodeName)
}

// checkDoctor: kubectl tracer doctor asks each node's agent, through its
// port-forward, for its kernel and hook plan.
func checkDoctor(t *testing.T, plugin, kubeconfig, node1 string) {
	t.Helper()
	out, err := exec.Command(plugin, "doctor", "--kubeconfig", kubeconfig, "--all-nodes").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl tracer doctor: %v\n%s", err, out)
	}
	for _, want := range []string{"node " + node1 + " (pod tracer/tracer-agent-" + node1 + "): kernel ", "node outside (pod tracer/tracer-agent-outside): kernel ", "nf_nat_setup_info"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kubectl tracer doctor lacks %q:\n%s", want, out)
		}
	}
}

// checkClusterAudit: `kubectl tracer audit --all-nodes` has each agent
// audit its node; each node's findings are what `tracer audit` run in that
// namespace finds (which the lab tests hold to the live verdicts).
func checkClusterAudit(t *testing.T, tracer, plugin, kubeconfig, metadata string, netnsOf map[string]string) {
	t.Helper()
	out, err := exec.Command(plugin, "audit", "--kubeconfig", kubeconfig, "--all-nodes", "-o", "json").Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		t.Fatalf("kubectl tracer audit: %v", err)
	}
	var audits []struct {
		Node   string
		Report *audit.Report
		Error  string
	}
	if err := json.Unmarshal(out, &audits); err != nil || len(audits) != len(netnsOf) {
		t.Fatalf("kubectl tracer audit -o json (%v):\n%s", err, out)
	}
	problems := 0
	for _, a := range audits {
		if a.Report == nil {
			t.Errorf("node %s: %s", a.Node, a.Error)
			continue
		}
		problems += a.Report.Problems()
		netns := netnsOf[a.Node]
		local, err := exec.Command(tracer, "audit", "--netns", netns, "--metadata", metadata, "--node", a.Node, "-o", "json").Output()
		if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
			t.Fatalf("tracer audit in %s: %v", netns, err)
		}
		var want audit.Report
		if err := json.Unmarshal(local, &want); err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(a.Report.Findings)
		exp, _ := json.Marshal(want.Findings)
		if !bytes.Equal(got, exp) || a.Report.Walked != want.Walked {
			t.Errorf("node %s: the agent's audit walked %d and found\n%s\n`tracer audit` there walked %d and found\n%s", a.Node, a.Report.Walked, got, want.Walked, exp)
		}
	}
	if (problems > 0) != (err != nil) {
		t.Errorf("kubectl tracer audit: %d problems, exit error %v: exit 1 exactly when a node has a problem", problems, err)
	}
	t.Logf("kubectl tracer audit: %d problem(s) over %d nodes", problems, len(audits))
	// `tracer audit --all-nodes` is the same, through the same agents.
	same, _ := exec.Command(tracer, "audit", "--all-nodes", "--kubeconfig", kubeconfig, "-o", "json").Output()
	if !bytes.Equal(sameFindings(t, same), sameFindings(t, out)) {
		t.Errorf("tracer audit --all-nodes:\n%s\nkubectl tracer audit --all-nodes:\n%s", same, out)
	}
}

// sameFindings is the nodes' findings of an audit -o json, for comparing
// two runs.
func sameFindings(t *testing.T, auditJSON []byte) []byte {
	t.Helper()
	var audits []struct {
		Node   string
		Report *audit.Report
	}
	if err := json.Unmarshal(auditJSON, &audits); err != nil {
		t.Fatalf("audit -o json: %v\n%s", err, auditJSON)
	}
	var b bytes.Buffer
	for _, a := range audits {
		if a.Report != nil {
			f, _ := json.Marshal(a.Report.Findings)
			fmt.Fprintf(&b, "%s %d %s\n", a.Node, a.Report.Walked, f)
		}
	}
	return b.Bytes()
}

func checkClusterTrace(t *testing.T, f *trace.File, exps []lab.Expectation, later []string, node1 string) {
	t.Helper()
	for i := 1; i < len(f.Flows); i++ {
		if f.Flows[i].Time.Before(f.Flows[i-1].Time) {
			t.Errorf("flow %d is earlier than the flow before it: the merge is out of order", i)
		}
	}
	for _, e := range exps {
		if !e.Reproduced() {
			t.Fatalf("the lab did not reproduce %s -> %s: saw %q, want %q; unproven %v", e.Src, e.Dst, e.Saw, e.Outcome, e.Unproven)
		}
		fl := onlyFlow(t, f, e.Src, e.Dst)
		if fl == nil {
			continue
		}
		if e.Verdict == trace.VerdictReturnPathMismatch {
			if strings.Join(fl.Nodes, ",") != node1+",outside" || fl.Verdict != e.Verdict || !strings.Contains(fl.Explanation, "seen from both ends") {
				t.Errorf("return path %s -> %s: nodes %v verdict %s: %s", e.Src, e.Dst, fl.Nodes, fl.Verdict, fl.Explanation)
			}
		} else if fl.Node != node1 || fl.Verdict != trace.VerdictOK {
			t.Errorf("baseline %s -> %s: node %q verdict %s, want node-1's ok", e.Src, e.Dst, fl.Node, fl.Verdict)
		}
	}
	for _, src := range later {
		if fl := onlyFlow(t, f, src, "192.168.1.202:80"); fl != nil && fl.Node != node1 {
			t.Errorf("connection after the outside agent died: node %q", fl.Node)
		}
	}
	parts := map[string]trace.NodeStatus{}
	for _, p := range f.Summary.Nodes {
		parts[p.Node] = p
	}
	if parts[node1].Error != "" || parts["outside"].Error == "" || parts[node1].Flows < 3 {
		t.Errorf("summary nodes %+v: want node-1 ending cleanly with its flows, outside with an error", f.Summary.Nodes)
	}
}

func onlyFlow(t *testing.T, f *trace.File, src, dst string) *trace.Flow {
	t.Helper()
	var got []*trace.Flow
	for _, fl := range f.Flows {
		if fl.Orig.Src == src && fl.Orig.Dst == dst {
			got = append(got, fl)
		}
	}
	if len(got) != 1 {
		t.Errorf("%s -> %s: %d flows in the merged trace, want 1", src, dst, len(got))
		return nil
	}
	return got[0]
}

// connectTwice makes two connections to the scenario's ETP=Cluster LB
// (192.168.1.202:80, SNAT'd: answered) from the outside client, and
// returns their source endpoints.
func connectTwice(t *testing.T, built *lab.Built) []string {
	t.Helper()
	var srcs []string
	for _, ns := range built.Observe {
		if ns.Path() == built.Node.Path() {
			continue
		}
		err := ns.Do(func() error {
			for range 2 {
				conn, err := net.DialTimeout("tcp", "192.168.1.202:80", 5*time.Second)
				if err != nil {
					return err
				}
				srcs = append(srcs, conn.LocalAddr().String())
				conn.Close()
			}
			return nil
		})
		if err != nil {
			t.Fatalf("connect to the ETP=Cluster LB: %v", err)
		}
	}
	return srcs
}

// requireRootHost skips without root, and in the VM tier: these tests
// build and run the tracer's binaries beside a control plane.
func requireRootHost(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tracer attaches BPF programs and the test makes network namespaces")
	}
	if k := os.Getenv("TRACER_VM_KERNEL"); k != "" {
		t.Skipf("runs on the host tier, not in the %s VM (it builds and runs the binaries)", k)
	}
}

func buildScenario(t *testing.T, ctx context.Context, name string) *lab.Built {
	t.Helper()
	env, err := lab.NewEnv()
	if err != nil {
		t.Fatal(err)
	}
	sc, ok := lab.Lookup(name)
	if !ok {
		t.Fatalf("no lab scenario %s", name)
	}
	built, err := sc.Build(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { built.Close() })
	return built
}

func buildTracer(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(t.TempDir(), "tracer")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/tracer")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startAgent runs `tracer agent` observing the namespace at netns as node
// and returns its TCP address.
func startAgent(t *testing.T, bin, netns, node, metadata string) (*exec.Cmd, string) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command(bin, "agent", "--netns", netns, "--node", node, "--metadata", metadata,
		"--listen", "127.0.0.1:0", "--linger", "300ms", "--ready-file", ready)
	var errb lockedBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent of %s not ready after 60s: %s", node, errb.String())
		}
	}
	m := regexp.MustCompile(`serving on (\S+)`).FindStringSubmatch(errb.String())
	if m == nil {
		t.Fatalf("agent of %s does not say where it serves: %s", node, errb.String())
	}
	return cmd, m[1]
}

// startKwok runs kwok for the nodes annotated kwok.x-k8s.io/node=fake,
// with kwok's own node and pod lifecycle and one PortForward per agent
// pod, to that agent's address.
func startKwok(t *testing.T, c *cluster, forwards map[string]string) {
	t.Helper()
	bins := c.cp.Binaries()
	stages, err := os.ReadFile(bins.KwokStages)
	if err != nil {
		t.Fatal(err)
	}
	cfg := bytes.NewBuffer(stages)
	for pod, addr := range forwards {
		_, port, _ := net.SplitHostPort(addr)
		fmt.Fprintf(cfg, "---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: PortForward\nmetadata:\n  name: %s\n  namespace: tracer\nspec:\n  forwards:\n  - ports: [4245]\n    target:\n      address: 127.0.0.1\n      port: %s\n", pod, port)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "kwok.yaml")
	if err := os.WriteFile(cfgPath, cfg.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bins.Kwok, "--kubeconfig", c.cp.KubeconfigFor(c.cp.AdminToken()), "--config", cfgPath,
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--node-ip=127.0.0.1", fmt.Sprintf("--node-port=%d", port), fmt.Sprintf("--server-address=127.0.0.1:%d", port))
	cmd.Env = append(os.Environ(), "HOME="+dir) // no ~/.kwok/kwok.yaml of the machine's
	logf, err := os.Create(filepath.Join(dir, "kwok.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("kwok's log:\n%s", tailBytes(b, 4000))
		}
	})
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func createFakeNode(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createAgentPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, name, node string) {
	t.Helper()
	p := testPod("tracer", name, node)
	p.Labels = map[string]string{"app.kubernetes.io/name": "tracer-agent"}
	if _, err := cs.CoreV1().Pods("tracer").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitRunning waits until kwok has made n agent pods Running.
func waitRunning(t *testing.T, ctx context.Context, cs kubernetes.Interface, n int) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		pods, err := cs.CoreV1().Pods("tracer").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d agent pods Running after 60s", running, n)
		}
	}
}

// lockedBuffer is a buffer a process writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
