package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// skipInVM: tests that build and drive the binary are about the binary,
// not the kernel; the VM matrix runs the kernel-dependent tests only
// (building Go under emulation would cost minutes).
func skipInVM(t *testing.T) {
	t.Helper()
	if k := os.Getenv("TRACER_VM_KERNEL"); k != "" {
		t.Skipf("binary end-to-end test: runs on the host tier, not in the %s VM", k)
	}
}

// buildTracer compiles the real binary once per test.
func buildTracer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tracer")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// selfTracer is this test binary, which runs as the tracer with
// asTracerEnv set: no build needed.
func selfTracer(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// scratchNamespace is a throwaway namespace (named prefix-a), set up by
// running each command in it.
func scratchNamespace(t *testing.T, prefix string, cmds ...[]string) netlab.Namespace {
	t.Helper()
	lab, err := netlab.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	ns, err := lab.Namespace("a")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range cmds {
		if _, err := ns.Run(args[0], args[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

// dnatNamespace is a throwaway namespace (named prefix-a) where
// 10.96.78.1:80 is DNAT'd in OUTPUT to a listener on 10.78.0.1:8080.
func dnatNamespace(t *testing.T, prefix string) netlab.Namespace {
	t.Helper()
	ns := scratchNamespace(t, prefix,
		[]string{"ip", "addr", "add", "10.78.0.1/32", "dev", "lo"},
		[]string{"iptables", "-t", "nat", "-A", "OUTPUT", "-d", "10.96.78.1", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.78.0.1:8080"},
		[]string{"ip", "route", "add", "10.96.78.0/24", "dev", "lo"},
	)
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", "10.78.0.1:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
			c.Close()
		}
	}()
	return ns
}

// startTrace starts `tracer trace ARGS --netns NS --ready-file F` and
// waits until its hooks are attached.
func startTrace(t *testing.T, bin string, ns netlab.Namespace, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	var stderr bytes.Buffer
	cmd, stdout := startTraceTo(t, bin, ns, &stderr, args...)
	return cmd, stdout, &stderr
}

// startTraceTo is startTrace with stderr going to the caller's writer.
func startTraceTo(t *testing.T, bin string, ns netlab.Namespace, stderr interface {
	io.Writer
	String() string
}, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command(bin, append([]string{"trace", "--netns", ns.Path(), "--ready-file", ready}, args...)...)
	cmd.Env = append(os.Environ(), asTracerEnv+"=1") // for selfTracer's binary
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	waitReady(t, ready, stderr)
	return cmd, &stdout
}

func dialVIP(t *testing.T, ns netlab.Namespace) {
	t.Helper()
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", "10.96.78.1:80", 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func requireRootHost(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged tier: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged tier: needs root")
	}
	skipInVM(t)
}

// TestTraceStreamsAndCompletesOnSIGINT runs `tracer trace -o json` on a
// namespace with a DNAT rule, makes a connection, interrupts it, and checks
// the NDJSON: a header with the plan, the dnat event, and the summary that

// TestRecordSurvivesSIGKILL: what `--record FILE` wrote before a kill -9
// is in FILE, and replay reads it back with a warning that the trace was
// cut off.
func TestRecordSurvivesSIGKILL(t *testing.T) {
	requireRootHost(t)
	bin := buildTracer(t)
	ns := dnatNamespace(t, "trkill")
	rec := filepath.Join(t.TempDir(), "incident.ndjson")
	cmd, _, stderr := startTrace(t, bin, ns, "-o", "json", "--record", rec, "--filter", "port:80", "--linger", "300ms")
	dialVIP(t, ns)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(rec)
		if bytes.Contains(b, []byte(`"type":"flow"`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no flow recorded in %s after 10s: %q; stderr: %s", rec, b, stderr.String())
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	replay := exec.Command(bin, "replay", "-o", "json", rec)
	var out, errb bytes.Buffer
	replay.Stdout, replay.Stderr = &out, &errb
	if err := replay.Run(); err != nil {
		t.Fatalf("replay of the killed recording: %v; stderr: %s", err, errb.String())
	}
	if !strings.Contains(errb.String(), "no summary line") {
		t.Errorf("replay gives no cut-off warning; stderr: %q", errb.String())
	}
	if !strings.Contains(out.String(), `"dst":"10.96.78.1:80"`) {
		t.Errorf("the recorded flow is not replayed:\n%s", out.String())
	}
}

// SIGINT must still write.
func TestTraceStreamsAndCompletesOnSIGINT(t *testing.T) {
	requireRootHost(t)
	bin := buildTracer(t)
	ns := dnatNamespace(t, "trcmd")
	cmd, out, stderr := startTrace(t, bin, ns, "-o", "json", "--filter", "port:80", "--linger", "500ms")
	dialVIP(t, ns)
	time.Sleep(300 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tracer trace exited with %v; stderr: %s", err, stderr.String())
	}

	var types []string
	var flow *trace.Flow
	var sum trace.Summary
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var rec struct{ Type string }
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("not NDJSON: %q: %v", sc.Text(), err)
		}
		types = append(types, rec.Type)
		switch rec.Type {
		case trace.TypeFlow:
			var f trace.Flow
			json.Unmarshal(sc.Bytes(), &f)
			if f.Orig.Dst == "10.96.78.1:80" {
				flow = &f
			}
		case trace.TypeSummary:
			json.Unmarshal(sc.Bytes(), &sum)
		}
	}
	if len(types) < 3 || types[0] != trace.TypeHeader || types[len(types)-1] != trace.TypeSummary {
		t.Fatalf("want header, events, summary; got %v", types)
	}
	if flow == nil {
		t.Fatalf("no flow to 10.96.78.1:80 in %v", types)
	}
	if len(flow.Events) == 0 || flow.Events[0].Kind != trace.KindDNAT || flow.Events[0].To != "10.78.0.1:8080" {
		t.Errorf("flow events %+v", flow.Events)
	}
	if flow.Reply == nil || flow.Reply.Src != "10.78.0.1:8080" {
		t.Errorf("reply %+v: where the connection really went", flow.Reply)
	}
	if flow.Conntrack == nil || !flow.Conntrack.Replied {
		t.Errorf("conntrack %+v: the connection was answered", flow.Conntrack)
	}
	if flow.Rule == nil || !strings.Contains(flow.Rule.Text, "--to-destination 10.78.0.1:8080") {
		t.Errorf("rule %+v", flow.Rule)
	}
	if flow.Verdict != trace.VerdictOK {
		t.Errorf("verdict %s: %s", flow.Verdict, flow.Explanation)
	}
	if sum.Flows != len(types)-2 || sum.LostEvents != 0 {
		t.Errorf("summary %+v for %d flows", sum, len(types)-2)
	}
	checkTracerCost(t, sum, cmd.ProcessState)
}

// checkTracerCost compares what the summary says the tracer cost with
// what the kernel told this process, its parent, when it waited for it:
// the summary is written just before the exit, so its figures are at
// most the final ones, and not far below them.
func checkTracerCost(t *testing.T, sum trace.Summary, ps *os.ProcessState) {
	t.Helper()
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Fatalf("no rusage for the tracer's process")
	}
	peakKiB := uint64(ru.Maxrss)
	cpuMS := (ps.UserTime() + ps.SystemTime()).Milliseconds()
	t.Logf("summary: %d ms CPU, peak %d KiB; wait4: %d ms CPU, peak %d KiB", sum.TracerCPUMillis, sum.TracerPeakRSSKiB, cpuMS, peakKiB)
	if sum.TracerPeakRSSKiB == 0 || sum.TracerPeakRSSKiB > peakKiB || sum.TracerPeakRSSKiB < peakKiB*9/10 {
		t.Errorf("summary's peak resident size %d KiB; the kernel's at exit %d KiB", sum.TracerPeakRSSKiB, peakKiB)
	}
	if sum.TracerCPUMillis <= 0 || sum.TracerCPUMillis > cpuMS+1 || sum.TracerCPUMillis < cpuMS/2 {
		t.Errorf("summary's CPU time %d ms; the kernel's at exit %d ms", sum.TracerCPUMillis, cpuMS)
	}
}

// TestTraceEvents: `tracer trace --events -o json` writes the raw kernel
// events, each as an event line; the connection's DNAT says where the
// rule sent it.
func TestTraceEvents(t *testing.T) {
	requireRootHost(t)
	bin := buildTracer(t)
	ns := dnatNamespace(t, "trevt")
	cmd, out, stderr := startTrace(t, bin, ns, "-o", "json", "--events", "--filter", "port:80")
	dialVIP(t, ns)
	time.Sleep(300 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tracer trace --events exited with %v; stderr: %s", err, stderr.String())
	}
	var dnat *trace.Event
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var rec struct{ Type string }
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("not NDJSON: %q: %v", sc.Text(), err)
		}
		if rec.Type == trace.TypeFlow {
			t.Errorf("a flow line with --events: %s", sc.Text())
		}
		if rec.Type != trace.TypeEvent {
			continue
		}
		var line struct {
			trace.Event
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("event line %q: %v", sc.Text(), err)
		}
		if e := line.Event; e.Kind == trace.KindDNAT && e.Orig != nil && e.Orig.Dst == "10.96.78.1:80" {
			dnat = &e
		}
	}
	if dnat == nil {
		t.Fatalf("no dnat event to 10.96.78.1:80 in:\n%s", out.String())
	}
	if dnat.To != "10.78.0.1:8080" || dnat.Proto != "tcp" {
		t.Errorf("dnat event %+v: want to 10.78.0.1:8080, tcp", dnat)
	}
}

func TestBadInputExitsTwo(t *testing.T) {
	var out, errb bytes.Buffer
	bad := filepath.Join(t.TempDir(), "metadata.json")
	if err := os.WriteFile(bad, []byte(`{"apiVersion":"v1","kind":"List","items":[{"kind":"Pod","metadata":`), 0o644); err != nil {
		t.Fatal(err)
	}
	badKubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(badKubeconfig, []byte("clusters: [: not yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"trace", "--metadata", bad},
		{"trace", "--metadata", "/nonexistent/metadata.json"},
		{"trace", "--kubeconfig", badKubeconfig},
		{"trace", "--kubeconfig", "/nonexistent/kubeconfig"},
		{"lab", "no-such-scenario"},
		{"trace", "--filter", "port:abc"},
		{"trace", "-o", "yaml"},
		{"trace", "--netns", "/nonexistent/ns"},
		{"trace", "--duration", "-1s"},
		{"doctor", "--only", "uprobe"},
		{"nosuchcommand"},
	} {
		errb.Reset()
		if code := dispatch(t.Context(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errb.String())
		}
		if len(args) > 2 && args[1] == "--metadata" && !strings.Contains(errb.String(), args[2]) {
			t.Errorf("%v: the message does not name the file: %q", args, errb.String())
		}
	}
}

// TestWarnsRulesUnreadable: when the node's iptables-save fails, the
// rules are not known, and the reader must be told: a header warning when
// it fails from the start, and a state line when that changes mid-trace.
// The failure is real: an iptables-save first on PATH that exits 1 while
// a marker file exists, and runs the real one otherwise.
func TestWarnsRulesUnreadable(t *testing.T) {
	requireRootHost(t)
	real, err := exec.LookPath("iptables-save")
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	dir := t.TempDir()
	mark := filepath.Join(dir, "broken")
	script := fmt.Sprintf("#!/bin/sh\nif [ -e %s ]; then echo 'iptables-save: cannot open table' >&2; exit 1; fi\nexec %s \"$@\"\n", mark, real)
	if err := os.WriteFile(filepath.Join(dir, "iptables-save"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mark, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	bin := buildTracer(t)
	ns := dnatNamespace(t, "trwarn")
	cmd, out, stderr := startTrace(t, bin, ns, "-o", "json", "--filter", "port:80")
	if err := os.Remove(mark); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // two polls of the rules
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tracer: %v; stderr: %s", err, stderr.String())
	}
	tr, err := trace.ReadAll(bytes.NewReader(out.Bytes()), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	warned := func(ws []string) bool {
		return slices.ContainsFunc(ws, func(w string) bool {
			return strings.Contains(w, "iptables-save") && strings.Contains(w, "cannot open table")
		})
	}
	if !warned(tr.Header.Warnings) {
		t.Errorf("header warnings %q do not say iptables-save failed", tr.Header.Warnings)
	}
	var fixed *trace.StateChange
	for _, c := range tr.States {
		if slices.Contains(c.Changed, trace.PartWarnings) && !warned(c.Warnings) {
			fixed = c
		}
	}
	if fixed == nil || !slices.ContainsFunc(fixed.Changed, func(p string) bool { return strings.HasPrefix(p, trace.PartRules) }) {
		t.Fatalf("no state line with the rules read again and the warning gone: %+v", tr.States)
	}
}
