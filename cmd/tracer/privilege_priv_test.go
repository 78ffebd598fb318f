package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// The capabilities(7) numbers the least-privilege test grants.
const (
	capNetAdmin    = 12
	capSysAdmin    = 21
	capSysResource = 24
	capPerfmon     = 38
	capBPF         = 39
	nobody         = 65534
)

var leastCaps = []uintptr{capBPF, capPerfmon, capNetAdmin}

// lowUser runs the tracer (this test binary, through asTracerEnv) as
// nobody with only the capabilities it is given, ambient, as `setpriv
// --ambient-caps` or a container's capabilities.add would.
type lowUser struct{ bin, work string }

func newLowUser(t *testing.T) lowUser {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// t.TempDir is private to root; nobody must reach the binary.
	dir, err := os.MkdirTemp("", "tracer-lowuser-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	u := lowUser{bin: filepath.Join(dir, "tracer"), work: filepath.Join(dir, "work")}
	src, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		os.Chmod(dir, 0o755),
		os.WriteFile(u.bin, src, 0o755),
		os.Mkdir(u.work, 0o755),
		os.Chown(u.work, nobody, nobody),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// command runs the tracer as nobody with caps and a memlock limit of
// 64 KiB, Debian 11's default: the test process's own limit may have
// been lifted by the tracer run in-process by earlier tests, and a child
// would inherit that.
func (u lowUser) command(caps []uintptr, args ...string) *exec.Cmd {
	cmd := exec.Command("prlimit", append([]string{"--memlock=65536:65536", "--", u.bin}, args...)...)
	cmd.Env = append(os.Environ(), asTracerEnv+"=1", "HOME="+u.work)
	cmd.Dir = u.work
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: nobody, Gid: nobody},
		AmbientCaps: caps,
	}
	return cmd
}

// asRoot is the same binary run as the test's own root, for reference.
func (u lowUser) asRoot(args ...string) *exec.Cmd {
	cmd := exec.Command(u.bin, args...)
	cmd.Env = append(os.Environ(), asTracerEnv+"=1")
	return cmd
}

func without(caps []uintptr, drop uintptr) []uintptr {
	var out []uintptr
	for _, c := range caps {
		if c != drop {
			out = append(out, c)
		}
	}
	return out
}

func exitCodeOf(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestLeastPrivilegeRefusals: with a capability missing, each command
// stops before it attaches anything, exit 2, naming what is missing and
// why; --netns and the lab need CAP_SYS_ADMIN on top. Nothing it was asked
// to write is created.
func TestLeastPrivilegeRefusals(t *testing.T) {
	requirePriv(t)
	if k := os.Getenv("TRACER_VM_KERNEL"); k != "" {
		t.Skipf("the refusals come before anything is loaded: the host tier shows them; TestLeastPrivilege refuses what the %s kernel asks beyond the three capabilities", k)
	}
	u := newLowUser(t)
	ns := dnatNamespace(t, "trlpr")
	rec := filepath.Join(u.work, "refused.ndjson")
	for _, tc := range []struct {
		name string
		caps []uintptr
		args []string
		want []string
	}{
		{"no CAP_BPF", without(leastCaps, capBPF), []string{"trace", "-o", "json", "--record", rec}, []string{"missing CAP_BPF (", "setpriv"}},
		{"no CAP_PERFMON", without(leastCaps, capPerfmon), []string{"trace", "-o", "json", "--record", rec}, []string{"missing CAP_PERFMON (", "setpriv"}},
		{"no CAP_NET_ADMIN", without(leastCaps, capNetAdmin), []string{"trace", "-o", "json", "--record", rec}, []string{"missing CAP_NET_ADMIN (", "setpriv"}},
		{"doctor, no capabilities", nil, []string{"doctor"}, []string{"CAP_BPF (", "CAP_PERFMON (", "CAP_NET_ADMIN ("}},
		{"--netns without CAP_SYS_ADMIN", leastCaps, []string{"trace", "-o", "json", "--netns", ns.Path(), "--record", rec}, []string{"missing CAP_SYS_ADMIN (--netns", "nsenter --net=" + ns.Path()}},
		{"lab without CAP_SYS_ADMIN", leastCaps, []string{"lab", "-o", "json", "ping-clusterip"}, []string{"missing CAP_SYS_ADMIN (the lab creates network namespaces"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := u.command(tc.caps, tc.args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if code := exitCodeOf(err); code != 2 {
				t.Fatalf("exit %d (%v), want 2; stderr %q", code, err, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr %q does not say %q", stderr.String(), w)
				}
			}
			if len(out) != 0 {
				t.Errorf("refused, yet wrote %q", out)
			}
			if _, err := os.Stat(rec); !os.IsNotExist(err) {
				t.Errorf("refused, yet created %s (%v)", rec, err)
			}
		})
	}
	// The same --netns with CAP_SYS_ADMIN (and what this kernel asks
	// beyond the three) is taken: the refusal is about that capability,
	// not the user.
	caps := append(leastCaps, capSysAdmin)
	for _, extra := range kernelExtraCaps(t) {
		caps = append(caps, extra.cap)
	}
	cmd := u.command(caps, "trace", "-o", "json", "--netns", ns.Path(), "--duration", "1ms")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("--netns with CAP_SYS_ADMIN: %v\n%s", err, out)
	}
}

// TestLeastPrivilege: inside the node's network namespace, as nobody with
// only CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (and what this kernel asks
// beyond them, see kernelExtraCaps: each refused first, exit 2, by name),
// doctor attaches every hook root does, and trace reports a DNAT'd
// connection and a rejected one with their rules and conntrack joined: the
// rules are iptables-save's and their counters moved, the reply tuple is
// the conntrack tool's, the client saw the reset. replay of what it
// recorded needs no capability.
func TestLeastPrivilege(t *testing.T) {
	requirePriv(t)
	u := newLowUser(t)
	ns := dnatNamespace(t, "trlp")
	reject := []string{"OUTPUT", "-d", "10.96.78.2/32", "-p", "tcp", "-m", "tcp", "--dport", "80", "-j", "REJECT", "--reject-with", "tcp-reset"}
	if _, err := ns.Run("iptables", append([]string{"-A"}, reject...)...); err != nil {
		t.Fatal(err)
	}
	rootPlan, _ := doctorPlan(t, ns, u.asRoot("doctor", "-o", "json"))

	caps := leastCaps
	for _, extra := range kernelExtraCaps(t) {
		cmd := u.command(caps, "trace", "-o", "json", "--duration", "1ms")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := ns.Do(cmd.Run); exitCodeOf(err) != 2 || !strings.Contains(stderr.String(), "missing "+extra.name+" (") &&
			!strings.Contains(stderr.String(), "missing "+extra.name+" on this kernel, for ") {
			t.Fatalf("without %s (%s): %v, stderr %q; want exit 2 naming it", extra.name, extra.why, err, stderr.String())
		}
		if extra.cap == capSysAdmin {
			_, hooks := doctorPlan(t, ns, u.command(caps, "doctor", "-o", "json"))
			for _, h := range hooks {
				if h.Via == "none" && strings.Contains(rootPlan, h.Hook+"=attached") && !strings.Contains(h.Error, "CAP_SYS_ADMIN") {
					t.Errorf("doctor without CAP_SYS_ADMIN: %s lost, and its error does not say why: %s", h.Hook, h.Error)
				}
			}
		}
		caps = append(caps, extra.cap)
	}
	if plan, hooks := doctorPlan(t, ns, u.command(caps, "doctor", "-o", "json")); plan != rootPlan {
		t.Errorf("doctor as nobody attaches %s; as root %s; as nobody: %+v", plan, rootPlan, hooks)
	}

	ready := filepath.Join(u.work, "ready")
	rec := filepath.Join(u.work, "incident.ndjson")
	cmd := u.command(caps, "trace", "-o", "json", "--ready-file", ready, "--record", rec, "--linger", "300ms", "--filter", "port:80")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	waitReady(t, ready, &stderr)

	dialVIP(t, ns)
	var refused error
	ns.Do(func() error {
		c, err := net.DialTimeout("tcp", "10.96.78.2:80", 2*time.Second)
		if err == nil {
			c.Close()
		}
		refused = err
		return nil
	})
	if !errors.Is(refused, syscall.ECONNREFUSED) {
		t.Fatalf("dial 10.96.78.2:80: %v, want connection refused (the REJECT rule)", refused)
	}
	ctReply := conntrackReplySrc(t, ns, "10.96.78.1")
	time.Sleep(800 * time.Millisecond) // past --linger
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("trace as nobody: %v; stderr %s", err, stderr.String())
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Errorf("trace as nobody warned: %s", s)
	}

	hdr, flows, sum := readNDJSON(t, stdout.Bytes())
	if len(hdr.Warnings) != 0 {
		t.Errorf("header warnings %q: node state or conntrack degraded", hdr.Warnings)
	}
	if plan := planOf(hdr.Hooks); plan != rootPlan {
		t.Errorf("trace as nobody attached %s; root's doctor %s", plan, rootPlan)
	}
	if sum.LostEvents != 0 {
		t.Errorf("lost %d events", sum.LostEvents)
	}
	save, err := ns.Run("iptables-save")
	if err != nil {
		t.Fatal(err)
	}
	dnatRule := "-A OUTPUT -d 10.96.78.1/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.78.0.1:8080"
	rejectRule := "-A " + strings.Join(reject, " ")
	for _, r := range []string{dnatRule, rejectRule} {
		if !strings.Contains(save, r+"\n") {
			t.Fatalf("iptables-save has no %q:\n%s", r, save)
		}
		if n := ruleCounter(t, ns, r); n == 0 {
			t.Errorf("counter of %q did not move", r)
		}
	}
	dnat, rst := flowTo(flows, "10.96.78.1:80"), flowTo(flows, "10.96.78.2:80")
	switch {
	case dnat == nil || rst == nil:
		t.Fatalf("flows %+v: want one to 10.96.78.1:80 and one to 10.96.78.2:80", flows)
	case len(dnat.Events) == 0 || dnat.Events[0].Kind != trace.KindDNAT || dnat.Events[0].To != "10.78.0.1:8080":
		t.Errorf("dnat flow events %+v", dnat.Events)
	case dnat.Reply == nil || dnat.Reply.Src != ctReply:
		t.Errorf("dnat flow reply %+v; conntrack -L says the reply comes from %s", dnat.Reply, ctReply)
	case dnat.Conntrack == nil || !dnat.Conntrack.Replied:
		t.Errorf("dnat flow conntrack %+v: the connection was answered", dnat.Conntrack)
	case dnat.Rule == nil || dnat.Rule.Text != dnatRule:
		t.Errorf("dnat flow rule %+v, want %q", dnat.Rule, dnatRule)
	case !hasEvent(*rst, trace.KindReset, ""):
		t.Errorf("rejected flow events %+v: the client was reset", rst.Events)
	case rst.Rule == nil || rst.Rule.Text != rejectRule:
		t.Errorf("rejected flow rule %+v, want %q", rst.Rule, rejectRule)
	}

	replay := u.command(nil, "replay", "-o", "json", rec)
	out, err := replay.Output()
	if err != nil {
		t.Fatalf("replay as nobody without capabilities: %v", err)
	}
	if _, again, _ := readNDJSON(t, out); len(again) != len(flows) {
		t.Errorf("replay read %d flows, trace wrote %d", len(again), len(flows))
	}
}

type extraCap struct {
	cap       uintptr
	name, why string
}

// kernelExtraCaps is what this kernel asks beyond the three, in the order
// the tracer finds out: kernels before 5.11 charge BPF maps to
// RLIMIT_MEMLOCK, whose hard limit only CAP_SYS_RESOURCE raises; kernels
// without BPF netfilter hooks (before 6.4) reach nf_nat and nf_reject by
// fentry on a module's function, whose BTF only CAP_SYS_ADMIN gets, or by
// kprobe, which perf_event_paranoid 3 (Debian's default) keeps to
// CAP_SYS_ADMIN; and so does every kernel for IPVS, once ip_vs is loaded.
func kernelExtraCaps(t *testing.T) []extraCap {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor); err != nil {
		t.Fatal(err)
	}
	version := major*1000 + minor
	b, err := os.ReadFile("/proc/sys/kernel/perf_event_paranoid")
	if err != nil {
		t.Fatal(err)
	}
	paranoid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	var extra []extraCap
	if version < 5011 {
		extra = append(extra, extraCap{capSysResource, "CAP_SYS_RESOURCE", "BPF maps charged to RLIMIT_MEMLOCK"})
	}
	// IPVS's hooks are module functions with no netfilter program to
	// fall back on: wherever ip_vs is loaded, they need the same.
	_, ipvsErr := os.Stat("/sys/module/ip_vs")
	if (version < 6004 || ipvsErr == nil) && paranoid >= 3 {
		extra = append(extra, extraCap{capSysAdmin, "CAP_SYS_ADMIN", "module BTF for fentry, perf events for kprobes"})
	}
	return extra
}

func requirePriv(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged tier: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged tier: needs root to hand capabilities to another user")
	}
}

func waitReady(t *testing.T, ready string, stderr fmt.Stringer) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready file after 60s; stderr: %s", stderr.String())
		}
	}
}

// doctorPlan runs doctor -o json inside ns and returns its plan.
func doctorPlan(t *testing.T, ns netlab.Namespace, cmd *exec.Cmd) (string, []trace.Hook) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := ns.Do(cmd.Run); err != nil {
		t.Fatalf("%v: %v; stderr %s", cmd.Args, err, stderr.String())
	}
	var rep doctorReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("doctor -o json: %v", err)
	}
	return planOf(rep.Hooks), rep.Hooks
}

// planOf says for each hook, in the plan's order, whether it attached;
// by which method may differ (as root fentry, as nobody netfilter, where
// fentry on a module's function needs CAP_SYS_ADMIN).
func planOf(hooks []trace.Hook) string {
	var parts []string
	for _, h := range hooks {
		state := "attached"
		if h.Via == "none" {
			state = "none"
		}
		parts = append(parts, h.Hook+"="+state)
	}
	return strings.Join(parts, " ")
}

func readNDJSON(t *testing.T, b []byte) (trace.Header, []trace.Flow, trace.Summary) {
	t.Helper()
	r, err := trace.NewReader(bytes.NewReader(b), "output")
	if err != nil {
		t.Fatal(err)
	}
	var flows []trace.Flow
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Flow != nil {
			flows = append(flows, *rec.Flow)
		}
	}
	if r.Summary() == nil {
		t.Fatal("no summary")
	}
	return *r.Header(), flows, *r.Summary()
}

func flowTo(flows []trace.Flow, dst string) *trace.Flow {
	for i := range flows {
		if flows[i].Orig.Dst == dst {
			return &flows[i]
		}
	}
	return nil
}

// conntrackReplySrc is where the conntrack tool says the connection to
// vip:80 is answered from, IP:PORT.
func conntrackReplySrc(t *testing.T, ns netlab.Namespace, vip string) string {
	t.Helper()
	out, err := ns.Run("conntrack", "-L", "-p", "tcp", "--orig-dst", vip, "--dport", "80")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var src, sport []string
		for _, f := range strings.Fields(sc.Text()) {
			if v, ok := strings.CutPrefix(f, "src="); ok {
				src = append(src, v)
			}
			if v, ok := strings.CutPrefix(f, "sport="); ok {
				sport = append(sport, v)
			}
		}
		if len(src) == 2 && len(sport) == 2 {
			return src[1] + ":" + sport[1]
		}
	}
	t.Fatalf("conntrack -L has no entry to %s:80:\n%s", vip, out)
	return ""
}

// ruleCounter is the packet counter iptables-save -c gives rule.
func ruleCounter(t *testing.T, ns netlab.Namespace, rule string) int {
	t.Helper()
	out, err := ns.Run("iptables-save", "-c")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		counters, text, ok := strings.Cut(line, " ")
		if ok && text == rule && strings.HasPrefix(counters, "[") {
			var pkts, octets int
			if _, err := fmt.Sscanf(counters, "[%d:%d]", &pkts, &octets); err == nil {
				return pkts
			}
		}
	}
	t.Fatalf("iptables-save -c has no %q:\n%s", rule, out)
	return 0
}
