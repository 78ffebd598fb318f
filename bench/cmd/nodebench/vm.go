package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// vmConfig is the overhead rounds in QEMU guests (-vm): the tracer's
// kprobe and fentry tiers, which this host's kernel lacks, measured on
// Debian's kernels under TCG emulation.
type vmConfig struct {
	kernels   []string
	rounds    int
	round     time.Duration
	observers string
	timeout   time.Duration
}

// vmKernel is one guest's run: its figures, or why there are none.
type vmKernel struct {
	Series string
	Only   string // the tiers the guest's tracer was restricted to, comma separated
	Result *guestResult
	Err    string
	Took   time.Duration // vmrun, boot to power-off
}

// guestResultFile is where the guest writes its JSON: /vmresults is
// vmrun's writable share, the host's $CACHE/results/<series>.
const guestResultFile = "nodebench.json"

// runVMs runs this nodebench binary in a guest per kernel, one after
// another (vmrun serialises guests anyway), and reads back each one's
// figures. A guest that fails is recorded with its error.
func runVMs(ctx context.Context, cfg vmConfig) []vmKernel {
	var out []vmKernel
	for _, entry := range cfg.kernels {
		if ctx.Err() != nil {
			break
		}
		series, only := vmEntry(entry)
		logf("overhead rounds in a QEMU guest, kernel %s%s", series, restricted(only))
		k := runVM(ctx, cfg, series, only)
		if k.Err != "" {
			logf("kernel %s: %s", entry, k.Err)
		}
		out = append(out, k)
	}
	return out
}

// vmEntry splits a -vm entry, SERIES or SERIES:TIER+TIER (6.12:kprobe+tracepoint+netfilter
// measures 6.12 with fentry left out), into the series and an -only list.
func vmEntry(entry string) (series, only string) {
	series, tiers, _ := strings.Cut(entry, ":")
	return series, strings.ReplaceAll(tiers, "+", ",")
}

func runVM(ctx context.Context, cfg vmConfig, series, only string) vmKernel {
	k := vmKernel{Series: series, Only: only}
	cmd, results, err := vmrunCommand(ctx, cfg, series, only)
	if err == nil {
		t0 := time.Now()
		if err = cmd.Run(); err != nil {
			err = fmt.Errorf("vmrun: %w", err)
		}
		k.Took = time.Since(t0)
	}
	if err == nil {
		var g guestResult
		g, err = readGuestResult(results)
		k.Result = &g
	}
	if err != nil {
		k.Result, k.Err = nil, err.Error()
	}
	return k
}

// vmrunCommand is vmrun booting one kernel to run this binary with
// guestArgs, and the host path of the JSON the guest writes.
func vmrunCommand(ctx context.Context, cfg vmConfig, series, only string) (*exec.Cmd, string, error) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return nil, "", errors.New("qemu-system-x86_64 is not installed")
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("find this program's binary: %w", err)
	}
	root, err := moduleRoot()
	if err != nil {
		return nil, "", err
	}
	cache, err := vmCache(root)
	if err != nil {
		return nil, "", err
	}
	vmrun, err := buildVMRun(root, cache)
	if err != nil {
		return nil, "", err
	}
	args := append([]string{"-cache", cache, "-kernels", series, "-timeout", cfg.timeout.String(), "--", exe}, guestArgs(cfg, only)...)
	cmd := exec.CommandContext(ctx, vmrun, args...)
	cmd.Dir = root // the guest starts in the same directory
	// vmrun stops its guest on SIGINT; a kill would leave QEMU running.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	// The guest's console and nodebench's log lines, prefixed by vmrun.
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd, filepath.Join(cache, "results", series, guestResultFile), nil
}

// buildVMRun builds tests/vm/cmd/vmrun into the cache (go build's own
// cache makes a rebuild cheap) so it can be signalled directly.
func buildVMRun(root, cache string) (string, error) {
	bin := filepath.Join(cache, "bin", "nodebench-vmrun")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("create vmrun's directory: %w", err)
	}
	cmd := exec.Command("go", "build", "-o", bin, "./tests/vm/cmd/vmrun")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build vmrun: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// guestArgs are the flags of the nodebench run inside a guest: the
// overhead rounds only, the attach plan recorded by one attach.
func guestArgs(cfg vmConfig, only string) []string {
	args := []string{"-rounds", fmt.Sprint(cfg.rounds), "-round", cfg.round.String(), "-observers", cfg.observers,
		"-ramp", "", "-flood", "", "-drops", "", "-attach", "1", "-idle", "0", "-userside=false", "-out", "", "-json", "/vmresults/" + guestResultFile}
	if only != "" {
		args = append(args, "-only", only)
	}
	return args
}

// moduleRoot is the directory of go.mod above the working directory:
// vmrun runs from there, and the guest starts in the same directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("find the module root above %s: no go.mod", dir)
		}
	}
}

// vmCache is vmrun's cache, $TRACER_VM_CACHE or its default under the
// module root, passed to it explicitly so the results directory is known.
func vmCache(root string) (string, error) {
	if c := os.Getenv("TRACER_VM_CACHE"); c != "" {
		return filepath.Abs(c)
	}
	return filepath.Join(root, "tests", "vm", "cache"), nil
}

// guestCommand is the command line that reruns one guest's figures.
func guestCommand(cfg vmConfig, series, only string) string {
	var quoted []string
	for _, a := range guestArgs(cfg, only) {
		if a == "" || strings.ContainsAny(a, " ,") {
			a = fmt.Sprintf("%q", a)
		}
		quoted = append(quoted, a)
	}
	return fmt.Sprintf("go build -o /tmp/nodebench ./bench/cmd/nodebench && go run ./tests/vm/cmd/vmrun -kernels %s -- /tmp/nodebench %s",
		series, strings.Join(quoted, " "))
}
