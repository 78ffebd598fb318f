package main

import (
	"context"
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
		logf("overhead rounds in a QEMU guest, kernel %s, tiers %s", series, orDash(only))
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
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		k.Err = "qemu-system-x86_64 is not installed"
		return k
	}
	exe, err := os.Executable()
	if err != nil {
		k.Err = fmt.Sprintf("find this program's binary: %v", err)
		return k
	}
	root, err := moduleRoot()
	if err != nil {
		k.Err = err.Error()
		return k
	}
	cache, err := vmCache(root)
	if err != nil {
		k.Err = err.Error()
		return k
	}
	args := append([]string{"run", "./tests/vm/cmd/vmrun", "-cache", cache, "-kernels", series,
		"-timeout", cfg.timeout.String(), "--", exe}, guestArgs(cfg, only)...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	// The guest's console and nodebench's log lines, prefixed by vmrun.
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	t0 := time.Now()
	err = cmd.Run()
	k.Took = time.Since(t0)
	if err != nil {
		k.Err = fmt.Sprintf("vmrun: %v", err)
		return k
	}
	g, err := readGuestResult(filepath.Join(cache, "results", series, guestResultFile))
	if err != nil {
		k.Err = err.Error()
		return k
	}
	k.Result = &g
	return k
}

// guestArgs are the flags of the nodebench run inside a guest: the
// overhead rounds only, the attach plan recorded by one attach.
func guestArgs(cfg vmConfig, only string) []string {
	args := []string{"-rounds", fmt.Sprint(cfg.rounds), "-round", cfg.round.String(), "-observers", cfg.observers,
		"-ramp", "", "-attach", "1", "-userside=false", "-out", "", "-json", "/vmresults/" + guestResultFile}
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
