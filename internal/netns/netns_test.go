package netns

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// The main goroutine keeps the main thread for itself, so no test
// goroutine runs on it: the runtime never ends the main thread, retired
// or not, and a test of whether On retires its thread must run on
// another one.
func init() { runtime.LockOSThread() }

// TestOnKeepsThread: a child started with Pdeathsig from the thread
// On ran on survives the goroutine's end, so On handed the
// thread back instead of retiring it. (Retiring it SIGKILLed the
// kube-apiserver of tests/controlplane/kubeproxy's ipvs-mode test the
// moment the tracer read the node's IPVS table.)
func TestOnKeepsThread(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setns needs CAP_SYS_ADMIN: run as root")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("needs the sleep command for a child process: %v", err)
	}
	cmd, onMain, err := childFromOnThread(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if onMain {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the goroutine ran on the main thread, which init locked to the main goroutine")
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the child started from On's thread died (%v): the thread was retired, not handed back", err)
	case <-time.After(time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// childFromOnThread starts a child with Pdeathsig on a locked
// thread, runs On (into the process's own namespace) on that thread
// and ends the goroutine. onMain: the thread was the main thread.
func childFromOnThread(bin string) (_ *exec.Cmd, onMain bool, _ error) {
	type result struct {
		cmd    *exec.Cmd
		onMain bool
		err    error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command(bin, "30")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			ch <- result{err: err}
			return
		}
		err := On("/proc/self/ns/net", func() error { return nil })
		ch <- result{cmd, syscall.Gettid() == os.Getpid(), err}
	}()
	r := <-ch
	return r.cmd, r.onMain, r.err
}
