// Command vmrun boots Debian distro kernels under QEMU (TCG) with the host's
// root filesystem shared read-only, and runs a command or Go test binaries
// inside each guest.
//
//	vmrun -kernels 6.1 -- uname -r
//	vmrun -test -kernels "5.10 6.1 6.12" ./internal/loader/... ./tests/vm/smoke
//
// See tests/vm/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"
)

type options struct {
	kernels  []string
	cache    string
	timeout  time.Duration
	memory   string
	cpus     int
	env      []string
	busybox  string
	test     bool
	parallel int    // guests at once, with -test
	run      string // -test.run for every package, with -test
	fetch    bool
	args     []string
}

type envFlag []string

func (e *envFlag) String() string { return strings.Join(*e, " ") }
func (e *envFlag) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*e = append(*e, v)
	return nil
}

func main() {
	var o options
	var kernels string
	var env envFlag
	flag.StringVar(&kernels, "kernels", "5.10 6.1 6.12", "kernel series to boot, space or comma separated (5.10, 6.1, 6.12)")
	flag.StringVar(&o.cache, "cache", defaultCache(), "cache directory for apt lists, kernels, initramfs and results (env TRACER_VM_CACHE)")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "kill a guest that has not finished after this long")
	flag.StringVar(&o.memory, "mem", "2048", "guest memory (qemu -m)")
	flag.IntVar(&o.cpus, "smp", 2, "guest CPUs (qemu -smp)")
	flag.IntVar(&o.parallel, "parallel", max(1, runtime.NumCPU()/2), "with -test: guests run at once (a busy guest keeps its -smp 2 host cores busy under TCG)")
	flag.Var(&env, "env", "KEY=VALUE for the guest command's environment (repeatable); TRACER_* variables of the host are passed too")
	flag.StringVar(&o.busybox, "busybox", "/bin/busybox", "static busybox for the initramfs (package busybox-static)")
	flag.BoolVar(&o.test, "test", false, "arguments are Go packages: build their test binaries and run them in each guest")
	flag.StringVar(&o.run, "run", "", "with -test: run only the tests matching this regexp (go test -run)")
	flag.BoolVar(&o.fetch, "fetch", false, "only download and cache the kernels")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: vmrun [flags] -- command [args...]\n       vmrun -test [flags] packages...\n       vmrun -fetch [flags]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	o.kernels = strings.FieldsFunc(kernels, func(r rune) bool { return r == ',' || r == ' ' })
	o.env = append(hostTracerEnv(), env...)
	o.args = flag.Args()
	if !o.fetch && len(o.args) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	abs, err := filepath.Abs(o.cache)
	if err != nil {
		fatal(fmt.Errorf("resolve cache dir: %w", err))
	}
	o.cache = abs

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	unlock, err := lockCache(o.cache)
	if err != nil {
		fatal(err)
	}
	var code int
	switch {
	case o.fetch:
		code = fetchAll(o)
	case o.test:
		code, err = testMode(ctx, o)
	default:
		code, err = commandMode(ctx, o)
	}
	unlock()
	if err != nil {
		fatal(err)
	}
	os.Exit(code)
}

// lockCache takes an exclusive lock on the cache directory so two runs do
// not share apt lists, test binaries and results directories at once.
func lockCache(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cache dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open cache lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		logf("waiting for another vmrun using %s", dir)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock cache dir: %w", err)
		}
	}
	return func() { f.Close() }, nil
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "vmrun: %v\n", err)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Printf("vmrun: "+format+"\n", args...)
}

// defaultCache is $TRACER_VM_CACHE, else tests/vm/cache of the module root.
func defaultCache() string {
	if c := os.Getenv("TRACER_VM_CACHE"); c != "" {
		return c
	}
	dir, err := os.Getwd()
	if err != nil {
		return filepath.Join("tests", "vm", "cache")
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, "tests", "vm", "cache")
		}
		if filepath.Dir(d) == d {
			return filepath.Join(dir, "tests", "vm", "cache")
		}
	}
}

// hostTracerEnv passes the host's TRACER_* variables (for example
// TRACER_VM_SELFTEST_FAIL) into the guest, except those vmrun sets or uses.
func hostTracerEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "TRACER_") && k != "TRACER_VM_CACHE" && k != "TRACER_VM" && k != "TRACER_VM_KERNEL" {
			out = append(out, kv)
		}
	}
	return out
}

// kernelRun holds the timings and outcome of one kernel.
type kernelRun struct {
	series    string
	pkg       string
	fetch     time.Duration
	initramfs time.Duration
	result    bootResult
	err       error
	dir       string // the guest's results share
	// firstBoot is a boot that panicked and was booted again
	// (mayBootAgain); result is the second boot's.
	firstBoot *bootResult
}

func fetchAll(o options) int {
	code := 0
	for _, name := range o.kernels {
		s, err := lookupSeries(name)
		if err == nil {
			start := time.Now()
			var k *kernel
			k, err = ensureKernel(o.cache, s, logf)
			if err == nil {
				logf("kernel %s: %s (%s) ready in %s", name, k.Package, k.Release, since(start))
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "vmrun: kernel %s: %v\n", name, err)
			code = 1
		}
	}
	return code
}

// prepare fetches the kernel and builds its initramfs.
func prepare(o options, name string) (*kernel, string, *kernelRun, error) {
	kr := &kernelRun{series: name}
	s, err := lookupSeries(name)
	if err != nil {
		return nil, "", kr, err
	}
	start := time.Now()
	k, err := ensureKernel(o.cache, s, func(f string, a ...any) { logf("[%s] "+f, append([]any{name}, a...)...) })
	kr.fetch = time.Since(start)
	if err != nil {
		return nil, "", kr, fmt.Errorf("fetch kernel %s: %w", name, err)
	}
	kr.pkg = k.Package
	start = time.Now()
	initrd := filepath.Join(o.cache, "initramfs", k.Release+".cpio")
	if err := buildInitramfs(k, o.busybox, initrd); err != nil {
		return nil, "", kr, fmt.Errorf("build initramfs for %s: %w", k.Release, err)
	}
	kr.initramfs = time.Since(start)
	return k, initrd, kr, nil
}

// runScript writes run.sh, the script the guest runs chrooted into the
// host root. body is shell code whose exit status is the guest's.
func runScript(o options, series, body string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("get working directory: %w", err)
	}
	var b strings.Builder
	b.WriteString(`#!/bin/bash
# Written by vmrun; runs inside the guest, chrooted into the host's root.
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t tmpfs tmpfs /dev/shm 2>/dev/null
ip link set lo up
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp
# A Kubernetes node loads br_netfilter (kubeadm checks for it; bridge CNIs
# rely on it): bridged pod-to-pod replies then pass conntrack, which
# portmap's and kube-proxy's nftables rules count on for pods on one
# bridge. The build host has it built in; Debian's kernels have a module.
modprobe br_netfilter || echo "vmrun: modprobe br_netfilter failed"
`)
	fmt.Fprintf(&b, "export TRACER_VM=1 TRACER_VM_KERNEL=%s\n", shellQuote(series))
	for _, kv := range o.env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v))
	}
	fmt.Fprintf(&b, "cd %s || exit 125\n", shellQuote(wd))
	fmt.Fprintf(&b, "echo \"%s kernel=$(uname -r)\"\n", markStarted)
	b.WriteString(body)
	return b.String(), nil
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func resultsDir(o options, series string) (string, error) {
	dir := filepath.Join(o.cache, "results", series)
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("clean results dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create results dir: %w", err)
	}
	return dir, nil
}

// bootWith boots one kernel with run.sh in its results dir.
func bootWith(ctx context.Context, o options, k *kernel, initrd, dir, script string) (bootResult, error) {
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte(script), 0o755); err != nil {
		return bootResult{}, fmt.Errorf("write run.sh: %w", err)
	}
	logf("[%s] booting %s (timeout %s)", k.Series, k.Release, o.timeout)
	return boot(ctx, bootConfig{
		Kernel: k, Initramfs: initrd, ResultsDir: dir, Timeout: o.timeout,
		Memory: o.memory, CPUs: o.cpus, Console: os.Stdout, Prefix: "[" + k.Series + "] ",
	})
}

func checkTools() error {
	for _, t := range []string{"qemu-system-x86_64", "apt-get", "apt-cache", "dpkg-deb", "depmod", "xz"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("find %s (needed by the VM harness): %w", t, err)
		}
	}
	return nil
}

func commandMode(ctx context.Context, o options) (int, error) {
	if err := checkTools(); err != nil {
		return 1, err
	}
	var quoted []string
	for _, a := range o.args {
		quoted = append(quoted, shellQuote(a))
	}
	code := 0
	var runs []*kernelRun
	for _, name := range o.kernels {
		k, initrd, kr, err := prepare(o, name)
		runs = append(runs, kr)
		if err == nil {
			var dir, script string
			if dir, err = resultsDir(o, name); err == nil {
				if script, err = runScript(o, name, strings.Join(quoted, " ")+"\n"); err == nil {
					kr.result, err = bootWith(ctx, o, k, initrd, dir, script)
				}
			}
		}
		kr.err = err
		if err == nil {
			logf("[%s] boot-to-result %s: %s", name, kr.result.Total.Round(100*time.Millisecond), kr.result)
		}
		switch {
		case err != nil:
			fmt.Fprintf(os.Stderr, "vmrun: [%s] %v\n", name, err)
			code = max(code, 1)
		case !kr.result.HaveStatus:
			code = max(code, 1)
		default:
			code = max(code, kr.result.ExitStatus)
		}
		if ctx.Err() != nil {
			break
		}
	}
	printTimings(os.Stdout, runs)
	printCrashes(os.Stdout, runs)
	return code, nil
}

func printTimings(w io.Writer, runs []*kernelRun) {
	fmt.Fprintf(w, "\nvmrun timings (boot = qemu start to command start; boot-to-result = qemu start to exit status):\n")
	fmt.Fprintf(w, "%-6s %-32s %8s %10s %8s %15s  %s\n", "kernel", "package", "fetch", "initramfs", "boot", "boot-to-result", "result")
	for _, r := range runs {
		res := r.result.String()
		if r.err != nil {
			res = "error: " + firstLine(r.err.Error())
		}
		fmt.Fprintf(w, "%-6s %-32s %8s %10s %8s %15s  %s\n", r.series, r.pkg,
			r.fetch.Round(100*time.Millisecond), r.initramfs.Round(10*time.Millisecond),
			r.result.BootTime.Round(100*time.Millisecond), r.result.Total.Round(100*time.Millisecond), res)
	}
}

// printCrashes repeats each panicked guest's report after the summary.
func printCrashes(w io.Writer, runs []*kernelRun) {
	for _, r := range runs {
		if f := r.firstBoot; f != nil {
			fmt.Fprintf(w, "\nkernel %s panicked on its first boot, in a report that names no BPF code, and was booted once more (%s); the first boot's console from its first oops line:\n",
				r.series, r.result)
			printLines(w, f.Crash)
		}
		if len(r.result.Crash) > 0 {
			fmt.Fprintf(w, "\nkernel %s panicked; its console from the first oops line:\n", r.series)
			printLines(w, r.result.Crash)
		}
	}
}

func printLines(w io.Writer, lines []string) {
	for _, l := range lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// reBPFCode matches a kernel report's mention of BPF code: a program, a
// trampoline or dispatcher, the JIT's symbols.
var reBPFCode = regexp.MustCompile(`(?i)bpf`)

// mayBootAgain says whether a guest that panicked may be booted once
// more: only when the kernel's report names no BPF code, so a crash the
// tracer's programs are part of always fails. The emulated guests have
// panicked, rarely, in runs that passed on every repetition.
func mayBootAgain(r bootResult) bool {
	return r.Panicked && len(r.Crash) > 0 && !reBPFCode.MatchString(strings.Join(r.Crash, "\n"))
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

var errNoTests = errors.New("no test binaries to run")
