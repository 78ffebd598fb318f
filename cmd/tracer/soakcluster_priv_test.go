package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

const (
	soakNamespace = "soak"
	soakNodeName  = "soak-node"
	// soakWatchLag is how long after an API change a flow may still carry
	// what the index held before it: the watch's delivery.
	soakWatchLag = 300 * time.Millisecond
)

// soakCluster is the soak's cluster, on the real API server: a pod per
// backend address, replaced by a pod of a new name on the same address
// (IP reuse) at every churn, and a Service per VIP while its rule exists.
// It logs which object held each address when, as the API server said.
type soakCluster struct {
	cs         kubernetes.Interface
	kubeconfig string

	mu   sync.Mutex
	gen  map[int]int // backend -> its pod's generation
	held map[string][]soakHeld
}

// soakHeld: the object name held the address from until until (zero:
// still does), each as the API server's answer returned.
type soakHeld struct {
	name         string
	from, until  time.Time
	createdAfter time.Time // when the create was sent
}

func startSoakCluster(t *testing.T) *soakCluster {
	t.Helper()
	cp := cphelper.Start(t)
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: soakNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := &soakCluster{cs: cs, kubeconfig: cp.KubeconfigFor(cp.AdminToken()), gen: map[int]int{}, held: map[string][]soakHeld{}}
	for b := 0; b < soakBackends; b++ {
		if err := c.createPod(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func soakPodName(b, gen int) string { return fmt.Sprintf("backend-%d-g%d", b, gen) }
func soakServiceName(s int) string  { return fmt.Sprintf("svc-%d", s) }

// createPod creates backend b's pod of the current generation, running
// with the backend's address, as the scheduler and kubelet would.
func (c *soakCluster) createPod(ctx context.Context, b int) error {
	c.mu.Lock()
	name := soakPodName(b, c.gen[b])
	c.mu.Unlock()
	sent := time.Now()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: soakNamespace, Name: name},
		Spec: corev1.PodSpec{NodeName: soakNodeName, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/backend:1"}}}}
	p, err := c.cs.CoreV1().Pods(soakNamespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	ip, _, _ := strings.Cut(soakBackendAddr(b), ":")
	p.Status.Phase, p.Status.PodIP, p.Status.PodIPs = corev1.PodRunning, ip, []corev1.PodIP{{IP: ip}}
	p.Status.HostIP = "10.78.9.1"
	if _, err := c.cs.CoreV1().Pods(soakNamespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update pod %s status: %w", name, err)
	}
	c.mu.Lock()
	c.held[ip] = append(c.held[ip], soakHeld{name: name, from: time.Now(), createdAfter: sent})
	c.mu.Unlock()
	return nil
}

// replacePod deletes backend b's pod and creates the next generation on
// its address.
func (c *soakCluster) replacePod(ctx context.Context, b int) error {
	c.mu.Lock()
	name := soakPodName(b, c.gen[b])
	ip, _, _ := strings.Cut(soakBackendAddr(b), ":")
	c.mu.Unlock()
	zero := int64(0)
	c.endHeld(ip, name)
	if err := c.cs.CoreV1().Pods(soakNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	c.mu.Lock()
	c.gen[b]++
	c.mu.Unlock()
	return c.createPod(ctx, b)
}

// endHeld marks name's hold of addr ended now, before the delete is sent.
func (c *soakCluster) endHeld(addr, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	hs := c.held[addr]
	for i := range hs {
		if hs[i].name == name && hs[i].until.IsZero() {
			hs[i].until = time.Now()
		}
	}
}

// setService makes the VIP of Service s exist or not, as its rule does.
func (c *soakCluster) setService(ctx context.Context, s int, exists bool) error {
	vip, _, _ := strings.Cut(soakVIP(s), ":")
	name := soakServiceName(s)
	if !exists {
		c.endHeld(vip, name)
		if err := c.cs.CoreV1().Services(soakNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete service %s: %w", name, err)
		}
		return nil
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: soakNamespace, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: vip, ClusterIPs: []string{vip},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	sent := time.Now()
	// The address of a Service just deleted is freed by the API server's
	// allocator a moment later.
	var err error
	for try := 0; try < 20; try++ {
		if _, err = c.cs.CoreV1().Services(soakNamespace).Create(ctx, svc, metav1.CreateOptions{}); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	c.mu.Lock()
	c.held[vip] = append(c.held[vip], soakHeld{name: name, from: time.Now(), createdAfter: sent})
	c.mu.Unlock()
	return nil
}

// nameAt is the object that held addr at t, sure false when t fell within
// a change's window (the API call and the watch's delivery after it),
// where either the name before or the one after is right.
func (c *soakCluster) nameAt(addr string, t time.Time) (before, after string, sure bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.held[addr] {
		if !t.Before(h.createdAfter) && t.Before(h.from.Add(soakWatchLag)) {
			after = h.name
		}
		if !h.until.IsZero() && !t.Before(h.until) && t.Before(h.until.Add(soakWatchLag)) {
			before = h.name
		}
	}
	if before != "" || after != "" {
		return before, after, false
	}
	for _, h := range c.held[addr] {
		if !t.Before(h.from) && (h.until.IsZero() || t.Before(h.until)) {
			return h.name, h.name, true
		}
	}
	return "", "", true
}

// soakDial is a connection the load made: to which Service, and when its
// dial returned (the kernel decided between its start and then).
type soakDial struct {
	service int
	done    time.Time
}

// checkName says whether got is right for addr for a connection dialed
// from start to done: "right", "lag" (a change's window, or a change
// during the dial: the name before or after it) or "wrong".
func (c *soakCluster) checkName(addr string, start, done time.Time, got string) string {
	before, after, sure := c.nameAt(addr, start)
	endBefore, endAfter, endSure := c.nameAt(addr, done)
	switch {
	case sure && endSure && before == endBefore && got == before:
		return "right"
	case sure && endSure && before == endBefore:
		return "wrong"
	}
	for _, name := range []string{before, after, endBefore, endAfter, ""} {
		if got == name {
			return "lag"
		}
	}
	return "wrong"
}

// churn makes the cluster follow the node's change c: the Service exists
// while its rule does; and it replaces one backend's pod.
func (c *soakCluster) churn(ch soakChange, gen int) error {
	ctx := context.Background()
	switch {
	case ch.before == "" && ch.after != "":
		if err := c.setService(ctx, ch.service, true); err != nil {
			return err
		}
	case ch.before != "" && ch.after == "":
		if err := c.setService(ctx, ch.service, false); err != nil {
			return err
		}
	}
	return c.replacePod(ctx, gen%soakBackends)
}

// soakCount is one check's outcome over the soak's connections.
type soakCount struct{ right, lag, wrong int }

func (n *soakCount) add(outcome string) {
	switch outcome {
	case "right":
		n.right++
	case "lag":
		n.lag++
	default:
		n.wrong++
	}
}

// soakTally is the checks of one set of flows (live, or replayed).
type soakTally struct {
	conns, missing        int
	rules, pods, services soakCount
	examples              []string
}

func (tl *soakTally) example(format string, a ...any) {
	if len(tl.examples) < 5 {
		tl.examples = append(tl.examples, fmt.Sprintf(format, a...))
	}
}

// check finds the flow of the connection from client at at to Service s,
// accepted by backend be, and checks its rule, pod and Service.
func (tl *soakTally) check(node *soakNode, cluster *soakCluster, flows *connLog[soakFlow], client string, at time.Time, d soakDial, be string) {
	s := d.service
	tl.conns++
	f, ok := flows.near(client, at)
	if !ok {
		tl.missing++
		tl.example("no flow for %s to %s at %s", client, soakVIP(s), at.Format("15:04:05.000"))
		return
	}
	switch {
	case f.to == be && f.rule == soakRule(s, backendIndex(be)):
		tl.rules.right++
	case f.to == be && (f.uncertain || f.rule == "") && node.inLag(s, f.time, f.rule):
		tl.rules.lag++
	default:
		tl.rules.wrong++
		tl.example("%s to %s accepted by %s at %s: dnat to %s, rule %q", client, soakVIP(s), be, f.time.Format("15:04:05.000"), f.to, f.rule)
	}
	beIP, _, _ := strings.Cut(be, ":")
	vip, _, _ := strings.Cut(soakVIP(s), ":")
	for _, c := range []struct {
		n         *soakCount
		addr, got string
	}{{&tl.pods, beIP, f.pod}, {&tl.services, vip, f.service}} {
		outcome := cluster.checkName(c.addr, at, d.done, c.got)
		c.n.add(outcome)
		if outcome == "wrong" {
			before, _, _ := cluster.nameAt(c.addr, at)
			tl.example("%s at %s: %s named %q, the API server had %q", client, at.Format("15:04:05.000"), c.addr, c.got, before)
		}
	}
}

// fill takes from f what the soak checks.
func (sf *soakFlow) fill(f *trace.Flow) {
	for _, e := range f.Events {
		if e.Kind == trace.KindDNAT {
			sf.to = e.To
			break
		}
	}
	if f.Rule != nil {
		sf.rule, sf.uncertain = f.Rule.Text, f.Rule.Uncertain != ""
	}
	if f.DstPod != nil {
		sf.pod = f.DstPod.Name
	}
	if f.Service != nil {
		sf.service = f.Service.Name
	}
}

// replaySoak replays the recording as `tracer replay -o json` does and
// logs its flows as the live ones are.
func replaySoak(t *testing.T, exe, rec string) *connLog[soakFlow] {
	t.Helper()
	cmd := exec.Command(exe, "replay", "-o", "json", rec)
	cmd.Env = append(os.Environ(), asTracerEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("replay the recording: %v", err)
	}
	tr, err := trace.ReadAll(bytes.NewReader(out), "replay")
	if err != nil {
		t.Fatal(err)
	}
	var flows connLog[soakFlow]
	for _, f := range tr.Flows {
		sf := soakFlow{client: f.Orig.Src, time: f.Time}
		sf.fill(f)
		flows.add(sf.client, sf.time, sf)
	}
	return &flows
}
