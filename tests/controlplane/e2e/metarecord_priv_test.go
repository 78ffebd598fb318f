package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TestRecordedMetadataChanges is issue 16's "the metadata in force at
// each decision": `tracer trace --kubeconfig --record` runs against the
// real API server while the pods behind a Service change. A connection
// goes to the Service's pod, the pod is deleted and another takes its IP
// (IP reuse), a new pod and Service appear, and each is connected to
// again. Truth is the API server's: which pod held the address, and which
// Service had the ClusterIP, when each connection was made. The live
// flows, the replayed recording and the recording's state lines must all
// agree with it; the same recording with its state lines removed (an old
// trace) must still replay, and then names the header's pods, which is
// wrong for the later connections: the check can fail.
func TestRecordedMetadataChanges(t *testing.T) {
	requireRootHost(t)
	c := startCluster(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, node = "rec", "node-1"
	if err := createNamespace(ctx, c.admin, ns); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{"client", "10.77.0.1"}, {"db-a", "10.77.0.2"}} {
		if _, err := runPod(ctx, c.admin, ns, p[0], node, "192.168.77.1", p[1]); err != nil {
			t.Fatal(err)
		}
	}
	createClusterIPService(ctx, t, c.admin, ns, "db", "10.96.50.1")

	lab, err := netlab.New("trmeta")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	nsNode, err := lab.Namespace("n")
	if err != nil {
		t.Fatal(err)
	}
	setup := [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "route", "add", "10.96.50.0/24", "dev", "lo"},
		{"iptables", "-t", "nat", "-A", "OUTPUT", "-d", "10.96.50.1/32", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.77.0.2:8080"},
		{"iptables", "-t", "nat", "-A", "OUTPUT", "-d", "10.96.50.2/32", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.77.0.3:8080"}}
	for _, a := range []string{"10.77.0.1", "10.77.0.2", "10.77.0.3"} {
		setup = append(setup, []string{"ip", "addr", "add", a + "/32", "dev", "lo"})
	}
	for _, args := range setup {
		if out, err := nsNode.Run(args[0], args[1:]...); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	for _, a := range []string{"10.77.0.2:8080", "10.77.0.3:8080"} {
		serveAndClose(t, nsNode, a)
	}

	bin := buildTracer(t)
	dir := t.TempDir()
	rec, ready := filepath.Join(dir, "rec.ndjson"), filepath.Join(dir, "ready")
	cmd := exec.Command(bin, "trace", "-o", "json", "--netns", nsNode.Path(), "--node", node, "--kubeconfig", c.tracerKubeconfig,
		"--record", rec, "--ready-file", ready, "--linger", "300ms", "--filter", "port:80")
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFile(t, ready, 60*time.Second, &stderr)

	// Each connection and the pod and Service the API server had for it
	// when it was made.
	type conn struct{ src, pod, service string }
	var conns []conn
	connect := func(vip string) {
		var src string
		err := nsNode.Do(func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("10.77.0.1")}, Timeout: 5 * time.Second}
			cn, err := d.Dial("tcp", vip+":80")
			if err != nil {
				return err
			}
			src = cn.LocalAddr().String()
			return cn.Close()
		})
		if err != nil {
			t.Fatalf("connect to %s: %v", vip, err)
		}
		conns = append(conns, conn{src, apiPodAt(ctx, t, c.admin, ns, backendOf(vip)), apiServiceAt(ctx, t, c.admin, ns, vip)})
	}
	connect("10.96.50.1")

	// db-a goes, db-b takes its IP; cache and its Service appear.
	if err := c.admin.CoreV1().Pods(ns).Delete(ctx, "db-a", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{"db-b", "10.77.0.2"}, {"cache", "10.77.0.3"}} {
		if _, err := runPod(ctx, c.admin, ns, p[0], node, "192.168.77.1", p[1]); err != nil {
			t.Fatal(err)
		}
	}
	createClusterIPService(ctx, t, c.admin, ns, "cache", "10.96.50.2")
	// The informers see the change within moments; give them a second
	// before connecting, as a user acting on what kubectl shows would.
	time.Sleep(time.Second)
	connect("10.96.50.1")
	connect("10.96.50.2")
	time.Sleep(3 * time.Second) // the flows' linger and the metadata's poll
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tracer: %v\n%s", err, stderr.String())
	}

	live, err := trace.ReadAll(strings.NewReader(stdout.String()), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := trace.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	deltas := 0
	for _, s := range recorded.States {
		if s.Metadata != nil {
			deltas++
		}
	}
	t.Logf("recorded %d flows, %d state lines (%d metadata deltas)", len(recorded.Flows), len(recorded.States), deltas)
	if deltas == 0 {
		t.Fatal("the recording has no metadata delta")
	}
	replayed := replayJSON(t, bin, rec)
	names := func(f *trace.Flow) (string, string) {
		pod, svc := "", ""
		if f.DstPod != nil {
			pod = f.DstPod.Name
		}
		if f.Service != nil {
			svc = f.Service.Name
		}
		return pod, svc
	}
	for _, tr := range []struct {
		what string
		f    *trace.File
	}{{"live", live}, {"recorded", recorded}, {"replayed", replayed}} {
		for i, cn := range conns {
			f := flowFrom(tr.f, cn.src)
			if f == nil {
				t.Errorf("%s: no flow from %s", tr.what, cn.src)
				continue
			}
			if pod, svc := names(f); pod != cn.pod || svc != cn.service {
				t.Errorf("%s: connection %d from %s names pod %q, Service %q; the API server had %q, %q", tr.what, i+1, cn.src, pod, svc, cn.pod, cn.service)
			}
		}
	}

	// Without its state lines the recording replays against the header's
	// pods and Services alone.
	data, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.SplitAfter(string(data), "\n") {
		if !strings.Contains(l, `"type":"state"`) {
			kept = append(kept, l)
		}
	}
	old := filepath.Join(dir, "old.ndjson")
	if err := os.WriteFile(old, []byte(strings.Join(kept, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := replayJSON(t, bin, old)
	wrong := 0
	for _, cn := range conns {
		if f := flowFrom(stale, cn.src); f != nil {
			if pod, svc := names(f); pod != cn.pod || svc != cn.service {
				wrong++
			}
		}
	}
	if wrong == 0 {
		t.Error("without the state lines every connection still names the API server's pod and Service: this test cannot tell")
	}
}

// backendOf is where the namespace's DNAT sends a VIP.
func backendOf(vip string) string {
	return map[string]string{"10.96.50.1": "10.77.0.2", "10.96.50.2": "10.77.0.3"}[vip]
}

func createClusterIPService(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, ip string) {
	t.Helper()
	svc := service(ns, name, corev1.ServiceTypeClusterIP, tcpPort("http", 80, 8080, 0))
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip, []string{ip}
	if _, err := createService(ctx, cs, svc); err != nil {
		t.Fatal(err)
	}
}

// apiPodAt is the pod the API server has with IP ip now.
func apiPodAt(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, ip string) string {
	t.Helper()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.PodIP == ip && p.DeletionTimestamp == nil {
			return p.Name
		}
	}
	return ""
}

// apiServiceAt is the Service the API server has with ClusterIP ip now.
func apiServiceAt(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, ip string) string {
	t.Helper()
	svcs, err := cs.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == ip {
			return s.Name
		}
	}
	return ""
}

func serveAndClose(t *testing.T, ns netlab.Namespace, addr string) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
			c.Close()
		}
	}()
}

func waitFile(t *testing.T, path string, within time.Duration, stderr *lockedBuffer) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not there after %s: %s", path, within, stderr.String())
		}
	}
}

func replayJSON(t *testing.T, bin, path string) *trace.File {
	t.Helper()
	out, err := exec.Command(bin, "replay", "-o", "json", path).Output()
	if err != nil {
		t.Fatalf("replay %s: %v", path, err)
	}
	f, err := trace.ReadAll(strings.NewReader(string(out)), "replay")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// flowFrom is the flow whose client was src.
func flowFrom(f *trace.File, src string) *trace.Flow {
	for _, fl := range f.Flows {
		if fl.Orig.Src == src {
			return fl
		}
	}
	return nil
}
