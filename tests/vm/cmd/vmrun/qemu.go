package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// bootConfig is one guest boot.
type bootConfig struct {
	Kernel     *kernel
	Initramfs  string
	ResultsDir string // host directory shared writable as /vmresults
	Timeout    time.Duration
	Memory     string
	CPUs       int
	Console    io.Writer // guest console, line by line with a prefix
	Prefix     string
}

// bootResult says how a boot ended.
type bootResult struct {
	ExitStatus int  // the guest command's exit status, when HaveStatus
	HaveStatus bool // the guest reported an exit status
	TimedOut   bool
	Panicked   bool
	InitFailed bool
	Crash      []string      // the console's last lines up to a panic, from its first oops line
	BootTime   time.Duration // qemu start until the command started
	Total      time.Duration // qemu start until the result
	QEMUErr    error
}

func (r bootResult) String() string {
	switch {
	case r.TimedOut:
		return fmt.Sprintf("timed out after %s", r.Total.Round(time.Second))
	case r.Panicked:
		return "kernel panic"
	case r.InitFailed:
		return "guest init failed before running the command"
	case !r.HaveStatus:
		return fmt.Sprintf("guest stopped without reporting an exit status (qemu: %v)", r.QEMUErr)
	default:
		return fmt.Sprintf("exit status %d", r.ExitStatus)
	}
}

// OK reports whether the guest ran the command and it exited 0.
func (r bootResult) OK() bool { return r.HaveStatus && r.ExitStatus == 0 && !r.TimedOut && !r.Panicked }

const (
	markStarted = "TRACER_VM_STARTED"
	markExit    = "TRACER_VM_EXIT="
)

func qemuArgs(c bootConfig) []string {
	share := func(id, path, tag string, ro bool) []string {
		fs := "local,id=" + id + ",path=" + path + ",security_model=none,multidevs=remap"
		if ro {
			fs += ",readonly=on"
		}
		return []string{"-fsdev", fs, "-device", "virtio-9p-pci,fsdev=" + id + ",mount_tag=" + tag}
	}
	args := []string{
		"-accel", "tcg", "-cpu", "max",
		"-m", c.Memory, "-smp", strconv.Itoa(c.CPUs),
		"-nographic", "-no-reboot",
		"-nic", "none", // no emulated network card: the guest only uses its own namespaces
		"-kernel", c.Kernel.Vmlinuz, "-initrd", c.Initramfs,
		"-append", "console=ttyS0 quiet panic=-1",
	}
	args = append(args, share("r", "/", "hostroot", true)...)
	args = append(args, share("m", c.Kernel.Modules, "modules", true)...)
	args = append(args, share("o", c.ResultsDir, "results", false)...)
	return args
}

// boot runs one guest to completion or timeout, streaming its console.
func boot(ctx context.Context, c bootConfig) (bootResult, error) {
	var res bootResult
	_ = os.Remove(filepath.Join(c.ResultsDir, "exit-status"))
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", qemuArgs(c)...)
	cmd.Stdin = nil // /dev/null: qemu leaves the terminal alone
	cmd.WaitDelay = 5 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start qemu-system-x86_64: %w", err)
	}
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		recent consoleTail
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			line := cleanConsole(sc.Text())
			mu.Lock()
			recent.add(line)
			switch {
			case strings.Contains(line, markStarted) && res.BootTime == 0:
				res.BootTime = time.Since(start)
			case strings.HasPrefix(line, markExit):
				v := strings.TrimPrefix(line, markExit)
				if n, err := strconv.Atoi(v); err == nil {
					res.ExitStatus, res.HaveStatus = n, true
				} else if v == "init-failed" {
					res.InitFailed = true
				}
			case strings.Contains(line, "Kernel panic - not syncing") && !res.Panicked:
				res.Panicked = true
				res.Crash = recent.crash()
			case res.Panicked && len(res.Crash) < maxCrashLines:
				// panic() prints its own stack after its first line.
				res.Crash = append(res.Crash, line)
			}
			mu.Unlock()
			fmt.Fprintf(c.Console, "%s%s\n", c.Prefix, line)
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	werr := cmd.Wait()
	pw.Close()
	wg.Wait()
	res.Total = time.Since(start)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		res.TimedOut = true
	}
	res.QEMUErr = werr
	// The results share is authoritative; the console marker is the fallback.
	if b, err := os.ReadFile(filepath.Join(c.ResultsDir, "exit-status")); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			res.ExitStatus, res.HaveStatus = n, true
		}
	}
	return res, nil
}

// consoleTail keeps a guest's last console lines, so that a panic's
// report survives into the summary, where CI's truncated log keeps it. A
// report can be longer than the tail (an int3 Oops in softirq, with both
// stacks, was 82 lines): from its first line the tail keeps everything,
// up to maxCrashLines, so its header is not lost.
type consoleTail struct {
	lines []string
	// open says a report began at lines[start] within the last
	// maxCrashLines lines.
	open  bool
	start int
}

const (
	consoleTailLines = 80
	maxCrashLines    = 160
)

func (t *consoleTail) add(line string) {
	if !t.open && reOops.MatchString(line) {
		t.open, t.start = true, len(t.lines)
	}
	t.lines = append(t.lines, line)
	if t.open && len(t.lines)-t.start > maxCrashLines {
		t.open = false
	}
	drop := len(t.lines) - consoleTailLines
	if t.open {
		drop = min(drop, t.start)
	}
	if drop > 0 {
		t.lines = t.lines[drop:]
		t.start -= drop
	}
}

// reOops matches the first line of a kernel's report of what went wrong.
var reOops = regexp.MustCompile(`BUG: |Oops|general protection fault|WARNING: |Unable to handle|RIP: |Call Trace:|Kernel panic - not syncing`)

// crash returns the kept lines from the first that starts a report.
func (t *consoleTail) crash() []string {
	for i, l := range t.lines {
		if reOops.MatchString(l) {
			return append([]string(nil), t.lines[i:]...)
		}
	}
	return append([]string(nil), t.lines...)
}

// Terminal control sequences the firmware writes (clear screen, reset).
var reControl = regexp.MustCompile(`\x1b(\[[0-9;?]*[A-Za-z]|c)|[\x00-\x08\x0b-\x1f\x7f]`)

// cleanConsole drops carriage returns and terminal control sequences.
func cleanConsole(s string) string {
	return reControl.ReplaceAllString(s, "")
}
