package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// TestSIGTERMDuringAttach: SIGTERM at moments from before the first
// program loads to after the last one attached. Each time the tracer
// exits 0 within seconds, leaves no program or link of its own in the
// kernel (bpftool's own listing), and the --record file reads back
// complete, summary included.
func TestSIGTERMDuringAttach(t *testing.T) {
	requirePriv(t)
	skipInVM(t)
	if _, err := exec.LookPath("bpftool"); err != nil {
		t.Fatalf("bpftool (Debian's bpftool package, which make deps installs): %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	before := ourBPF(t)
	if len(before) != 0 {
		t.Fatalf("tracer programs loaded before the test: %v", before)
	}
	ns := dnatNamespace(t, "trterm")
	for _, delay := range []time.Duration{0, 30 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 600 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			rec := filepath.Join(t.TempDir(), "term.ndjson")
			cmd := exec.Command(exe, "trace", "-o", "json", "--netns", ns.Path(), "--record", rec)
			cmd.Env = append(os.Environ(), asTracerEnv+"=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(delay)
			cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var exitErr error
			select {
			case exitErr = <-done:
			case <-time.After(15 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("still running 15 s after SIGTERM; stderr %s", stderr.String())
			}
			// The kernel frees a program once the last reference goes,
			// after the process has exited: give it a moment.
			left := ourBPF(t)
			for deadline := time.Now().Add(3 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = ourBPF(t) {
				time.Sleep(50 * time.Millisecond)
			}
			if len(left) != 0 {
				t.Errorf("left in the kernel 3 s after the tracer exited: %v", left)
			}
			_, statErr := os.Stat(rec)
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM && os.IsNotExist(statErr) {
				return // before the runtime's handler was installed: nothing had begun
			}
			if exitErr != nil {
				t.Errorf("exit %v; stderr %s", exitErr, stderr.String())
			}
			if os.IsNotExist(statErr) {
				return // stopped before the trace began: nothing was promised
			}
			tr, err := trace.ReadFile(rec)
			if err != nil || tr.Summary == nil {
				t.Errorf("the recording after SIGTERM: %v, summary %v, warnings %q", err, tr != nil && tr.Summary != nil, warningsOf(tr))
			}
		})
	}
}

func warningsOf(tr *trace.File) []string {
	if tr == nil {
		return nil
	}
	return tr.Warnings
}

// ourBPF lists the tracer's programs (named tr_*) and the links that
// hold any program of that name, as bpftool sees the kernel.
func ourBPF(t *testing.T) []string {
	t.Helper()
	var out []string
	progs := map[int]string{}
	for _, obj := range []string{"prog", "link"} {
		b, err := exec.Command("bpftool", "-j", obj, "show").Output()
		if err != nil {
			t.Fatalf("bpftool %s show: %v", obj, err)
		}
		var items []struct {
			ID     int    `json:"id"`
			Name   string `json:"name"`
			ProgID int    `json:"prog_id"`
		}
		if len(bytes.TrimSpace(b)) > 0 {
			if err := json.Unmarshal(b, &items); err != nil {
				t.Fatalf("bpftool %s show: %v", obj, err)
			}
		}
		for _, it := range items {
			switch {
			case obj == "prog" && strings.HasPrefix(it.Name, "tr_"):
				progs[it.ID] = it.Name
				out = append(out, fmt.Sprintf("prog %d %s", it.ID, it.Name))
			case obj == "link" && progs[it.ProgID] != "":
				out = append(out, fmt.Sprintf("link %d of %s", it.ID, progs[it.ProgID]))
			}
		}
	}
	return out
}
