package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// separate runs a tracer observer in a child process of this binary, as
// the tracer runs on a node: a process of its own beside the workload's.
// Measured inside the load generator's process, the tracer's reader,
// which blocks in epoll_wait, disturbed the generator's Go scheduler: one
// goroutine looping on a 20 ms epoll_wait of an empty epoll set, and
// nothing else, took 17 to 21% of the lab's connections per second when it ran
// in the generator's process and nothing measurable from a process of its
// own. The child's CPU time counts in the round (it is a waited-for
// child) but for what it spent before it was observing: the process
// start and the attach, which the in-process observers also spent before
// the round's CPU reading.
type separate struct {
	key     string // the observer the child runs
	label   string // its name in the report
	windows int
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *bufio.Reader
	stderr  strings.Builder
	setup   time.Duration
}

// childReport is a line the observing child writes on its stdout: one
// when it is observing, one with what it observed when told to stop.
type childReport struct {
	Ready    bool          `json:"ready,omitempty"`
	CPU      time.Duration `json:"cpu"`
	Observed *observed     `json:"observed,omitempty"`
	Error    string        `json:"error,omitempty"`
}

func (s *separate) name() string { return s.label }

func (s *separate) start(b *lab) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	s.windows++
	s.stderr.Reset()
	cmd := exec.Command(exe, "-only", tierList(b.only), "-child", "observe:"+s.key+":"+b.r.Name)
	cmd.Env = append(os.Environ(), windowEnv+"="+strconv.Itoa(s.windows))
	cmd.Stderr = &s.stderr
	if s.stdin, err = cmd.StdinPipe(); err != nil {
		return fmt.Errorf("observer %s: %w", s.key, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("observer %s: %w", s.key, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start observer %s: %w", s.key, err)
	}
	s.cmd, s.out = cmd, bufio.NewReader(stdout)
	r, err := s.read()
	if err == nil && !r.Ready {
		err = errors.New("did not say it was observing")
	}
	if err != nil {
		s.stdin.Close()
		cmd.Wait()
		return fmt.Errorf("observer %s: %w%s", s.key, err, s.complaint())
	}
	s.setup = r.CPU
	return nil
}

func (s *separate) stop() (observed, error) {
	s.stdin.Close()
	r, rerr := s.read()
	werr := s.cmd.Wait()
	if rerr != nil || r.Observed == nil {
		return observed{}, fmt.Errorf("observer %s: %w%s", s.key, errors.Join(rerr, werr, errors.New("no report")), s.complaint())
	}
	o := *r.Observed
	o.SetupCPU, o.OwnCPU = s.setup, r.CPU-s.setup
	if ru, ok := s.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		peak := uint64(ru.Maxrss) << 10 // Linux gives KiB
		o.Extra = strings.TrimPrefix(o.Extra+fmt.Sprintf(", peak RSS %.0f MiB", mib(peak)), ", ")
	}
	if r.Error != "" {
		return o, fmt.Errorf("observer %s: %s", s.key, r.Error)
	}
	return o, werr
}

func (s *separate) read() (childReport, error) {
	var r childReport
	line, err := s.out.ReadBytes('\n')
	if err != nil {
		return r, fmt.Errorf("read its report: %w", err)
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("its report %q: %w", line, err)
	}
	return r, nil
}

func (s *separate) complaint() string {
	if t := strings.TrimSpace(s.stderr.String()); t != "" {
		return ": " + t
	}
	return ""
}

// windowEnv numbers the child's window, so each window's CPU profile
// goes to a file of its own.
const windowEnv = "NODEBENCH_WINDOW"

// observeChild is the child's side: it starts the observer on the lab's
// router namespace, says so, observes until its stdin closes, and writes
// what it observed.
func observeChild(spec string, only string) error {
	key, router, ok := strings.Cut(spec, ":")
	if !ok {
		return fmt.Errorf("bad observer spec %q", spec)
	}
	o, err := inProcessObserver(key)
	if err != nil {
		return err
	}
	b := &lab{r: netlab.Namespace{Name: router}}
	if b.only, err = parseTiers(only); err != nil {
		return err
	}
	if b.rInode, err = b.r.Inode(); err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	if err := o.start(b); err != nil {
		return err
	}
	if err := enc.Encode(childReport{Ready: true, CPU: cpuTime()}); err != nil {
		o.stop()
		return err
	}
	io.Copy(io.Discard, os.Stdin)
	got, err := o.stop()
	r := childReport{CPU: cpuTime(), Observed: &got}
	if err != nil {
		r.Error = err.Error()
	}
	return enc.Encode(r)
}

// blocker is a goroutine that does nothing but wait in epoll_wait on an
// empty epoll set, 20 ms at a time, as the ring buffer reader of
// cilium/ebpf does: in the benchmark's process ("blocker") or in a process
// of its own ("blocker-own"). It shows what sharing the load generator's
// process costs an observer that blocks in system calls.
type blocker struct {
	own  bool
	quit chan struct{}
	done chan struct{}
}

func (b *blocker) name() string {
	if b.own {
		return "epoll_wait loop (own process)"
	}
	return "epoll_wait loop (benchmark's process)"
}

func (b *blocker) start(*lab) error {
	efd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	b.quit, b.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(b.done)
		defer unix.Close(efd)
		evs := make([]unix.EpollEvent, 1)
		for {
			select {
			case <-b.quit:
				return
			default:
			}
			unix.EpollWait(efd, evs, 20)
		}
	}()
	return nil
}

func (b *blocker) stop() (observed, error) {
	close(b.quit)
	<-b.done
	return observed{NAT: -1, Lost: -1, Events: -1}, nil
}
