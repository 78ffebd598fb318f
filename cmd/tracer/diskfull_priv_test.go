package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// TestRecordDiskFull: the disk holding --record fills up mid-trace. The
// tracer stops at once, exit 1, saying which file could not be written
// and why; the file keeps every flow written before, and replay reads it
// back with a warning that it was cut off.
func TestRecordDiskFull(t *testing.T) {
	requirePriv(t)
	skipInVM(t)
	disk := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tracer-diskfull", disk).CombinedOutput(); err != nil {
		t.Fatalf("mount a small tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", disk).Run() })
	ns := dnatNamespace(t, "trfull")
	rec := filepath.Join(disk, "incident.ndjson")
	cmd, _, stderr := startTrace(t, selfTracer(t), ns, "-o", "json", "--record", rec, "--linger", "200ms", "--filter", "port:80")

	dialVIP(t, ns)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(rec); bytes.Contains(b, []byte(`"type":"flow"`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no flow recorded; stderr %s", stderr.String())
		}
	}
	fillDisk(t, disk)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err2 error
	for i := 0; ; i++ {
		dialVIP(t, ns)
		select {
		case err2 = <-exited:
		case <-time.After(300 * time.Millisecond):
			if i < 30 {
				continue
			}
			t.Fatalf("the tracer still runs with its recording's disk full; stderr %s", stderr.String())
		}
		break
	}
	t.Logf("stderr: %s", stderr.String())
	if code := exitCodeOf(err2); code != 1 {
		t.Errorf("exit %d (%v), want 1", code, err2)
	}
	if msg := stderr.String(); !strings.Contains(msg, "--record "+rec) || !strings.Contains(msg, "no space left on device") {
		t.Errorf("stderr %q: want the file and the reason", msg)
	}
	tr, err := trace.ReadFile(rec)
	if err != nil {
		t.Fatalf("the cut-off recording does not read: %v", err)
	}
	if len(tr.Flows) == 0 || tr.Flows[0].Orig.Dst != "10.96.78.1:80" {
		t.Errorf("recorded flows %+v: the first connection was written before the disk filled", tr.Flows)
	}
	if len(tr.Warnings) == 0 {
		t.Error("replay gives no warning that the trace was cut off")
	}
}

// fillDisk writes a file under dir until the filesystem is full.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	for _, n := range []int{1024, 256, 64, 16, 1} {
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
}
