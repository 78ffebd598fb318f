package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TestIPVSModuleUnloaded: ip_vs is unloaded while the tracer is attached
// to it. Where the IPVS hooks are fentry programs the kernel refuses the
// unload (the tracer holds the module) until the tracer exits; where they
// are kprobes the module goes, the tracer says its IPVS decisions are not
// seen, and when ip_vs is loaded again it attaches anew and reports the
// next IPVS connection. Truth: modprobe's outcome, the backend's accepts
// and ipvsadm's connection count.
func TestIPVSModuleUnloaded(t *testing.T) {
	requirePriv(t)
	kernel := os.Getenv("TRACER_VM_KERNEL")
	if kernel == "" {
		t.Skip("unloads the ip_vs module: the host kernel has no IPVS (KERNELS.md) and the tests never unload a host's modules; the VM matrix runs it")
	}
	loadIPVS(t)
	t.Cleanup(func() { exec.Command("modprobe", "-a", "ip_vs", "ip_vs_rr").Run() })
	lab, err := netlab.New("tripvs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	client, router, server := mustNamespace(t, lab, "c"), mustNamespace(t, lab, "r"), mustNamespace(t, lab, "s")
	if err := lab.Link(client, "eth0", "10.76.1.2/24", router, "eth0", "10.76.1.1/24"); err != nil {
		t.Fatal(err)
	}
	if err := lab.Link(router, "eth1", "10.76.2.1/24", server, "eth0", "10.76.2.2/24"); err != nil {
		t.Fatal(err)
	}
	if err := router.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	mustRun(t, client, "ip", "route", "add", "default", "via", "10.76.1.1")
	mustRun(t, server, "ip", "route", "add", "default", "via", "10.76.2.1")
	mustRun(t, router, "ip", "addr", "add", "10.96.76.1/32", "dev", "lo")
	accepted := listenAndHold(t, server, "10.76.2.2:8080")
	addVirtualServer := func() {
		mustRun(t, router, "ipvsadm", "-A", "-t", "10.96.76.1:80", "-s", "rr")
		mustRun(t, router, "ipvsadm", "-a", "-t", "10.96.76.1:80", "-r", "10.76.2.2:8080", "-m")
	}
	addVirtualServer()

	stderr := &lockedBuffer{}
	cmd, stdout := startTraceTo(t, selfTracer(t), router, stderr, "-o", "json", "--linger", "500ms")
	connect := func(what string) {
		t.Helper()
		before := accepted()
		if err := dialFrom(client, "10.96.76.1:80", 3*time.Second); err != nil {
			t.Fatalf("%s: connect to the virtual server: %v", what, err)
		}
		waitFor(t, what+": the backend accepts", func() bool { return accepted() > before })
	}
	connect("before the unload")
	mustRun(t, router, "ipvsadm", "-C")
	out, unloadErr := unloadIPVS()
	stop := func() {
		cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("trace: %v; stderr %s", err, stderr.String())
		}
	}
	if unloadErr != nil {
		// The fentry tier: the tracer's programs hold the module.
		if !strings.Contains(out, "in use") {
			t.Fatalf("modprobe -r ip_vs while traced: %v: %s; want the module in use", unloadErr, out)
		}
		t.Logf("%s: modprobe -r refused while traced: %s", kernel, strings.TrimSpace(out))
		stop()
		if out, err := unloadIPVS(); err != nil {
			t.Fatalf("modprobe -r ip_vs after the tracer exited: %v: %s; the tracer did not let go of the module", err, out)
		}
		h, flows, sum := readNDJSON(t, stdout.Bytes())
		// A fentry program holds its target's module; a kprobe does not.
		fentry := false
		for _, hk := range h.Hooks {
			fentry = fentry || strings.HasPrefix(hk.Hook, "ip_vs_") && hk.Via == "fentry"
		}
		if !fentry {
			t.Errorf("no IPVS hook attached by fentry (%+v), yet the module could not be unloaded", h.Hooks)
		}
		checkIPVSFlows(t, flows, 1)
		if len(sum.HookChanges) != 0 {
			t.Errorf("hook changes %+v while the module stayed", sum.HookChanges)
		}
		return
	}
	t.Logf("%s: ip_vs unloaded under the tracer", kernel)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("tracer's stderr: %s", stderr.String())
		}
	})
	waitFor(t, "the tracer says ip_vs was unloaded", func() bool { return strings.Contains(stderr.String(), "ip_vs was unloaded") })
	loadIPVS(t)
	addVirtualServer()
	waitFor(t, "the tracer attaches to the new ip_vs", func() bool { return strings.Contains(stderr.String(), "ip_vs was loaded") })
	connect("after ip_vs was loaded again")
	// IPVS sums its per-CPU counters for ipvsadm every 2 s (its estimator).
	waitFor(t, "ipvsadm to count the connection on the new virtual server", func() bool { return ipvsConnections(t, router, "10.96.76.1:80") == 1 })
	stop()
	h, flows, sum := readNDJSON(t, stdout.Bytes())
	checkIPVSFlows(t, flows, 2)
	byHook := map[string][]trace.HookChange{}
	for _, c := range sum.HookChanges {
		byHook[c.Hook] = append(byHook[c.Hook], c)
	}
	for _, hk := range h.Hooks {
		if !strings.HasPrefix(hk.Hook, "ip_vs_") {
			continue
		}
		ch := byHook[hk.Hook]
		if len(ch) != 2 || ch[0].Via != "" || ch[1].Via != hk.Via {
			t.Errorf("hook %s (attached by %s): changes %+v, want lost then attached by %s again", hk.Hook, hk.Via, ch, hk.Via)
		}
	}
}

// checkIPVSFlows: want connections to the virtual server, each a flow
// with an IPVS decision for the real server.
func checkIPVSFlows(t *testing.T, flows []trace.Flow, want int) {
	t.Helper()
	n := 0
	for _, f := range flows {
		if f.Orig.Dst != "10.96.76.1:80" {
			continue
		}
		n++
		ok := false
		for _, e := range f.Events {
			ok = ok || e.Kind == trace.KindIPVS && e.To == "10.76.2.2:8080"
		}
		if !ok {
			t.Errorf("flow from %s has no IPVS decision for 10.76.2.2:8080: %+v", f.Orig.Src, f.Events)
		}
	}
	if n != want {
		t.Errorf("%d flows to the virtual server, want %d", n, want)
	}
}

func loadIPVS(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("modprobe", "-a", "ip_vs", "ip_vs_rr").CombinedOutput(); err != nil {
		t.Fatalf("modprobe ip_vs: %v: %s", err, out)
	}
}

// unloadIPVS removes ip_vs and the schedulers that use it.
func unloadIPVS() (string, error) {
	mods := []string{"-r"}
	f, err := os.Open("/proc/modules")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, _, _ := strings.Cut(sc.Text(), " "); strings.HasPrefix(name, "ip_vs_") {
			mods = append(mods, name)
		}
	}
	out, err := exec.Command("modprobe", append(mods, "ip_vs")...).CombinedOutput()
	return string(out), err
}

// ipvsConnections is the virtual server's connection count in ipvsadm's
// statistics.
func ipvsConnections(t *testing.T, ns netlab.Namespace, vip string) int {
	t.Helper()
	out := mustRun(t, ns, "ipvsadm", "-Ln", "--stats", "--exact", "-t", vip)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "TCP" {
			n, err := strconv.Atoi(f[2])
			if err != nil {
				t.Fatalf("ipvsadm --stats: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("ipvsadm --stats: no TCP line: %s", out)
	return 0
}

func mustRun(t *testing.T, ns netlab.Namespace, name string, args ...string) string {
	t.Helper()
	out, err := ns.Run(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 15 s for %s", what)
		}
	}
}

// lockedBuffer is a buffer the test reads while the tracer's output is
// still being copied into it.
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
