package loader

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ringWaiter waits for the ring buffer to hold a record in Go's network
// poller, which parks the goroutine, rather than in the ring buffer
// reader's own epoll_wait, which blocks an OS thread in a system call for
// up to pollEvery at a time. The Go scheduler retakes such a thread's
// processor and hands it on each time, and that churn slows every other
// goroutine of the process: a goroutine that only looped on a 20 ms
// epoll_wait took 17% of the connection rate of a load generator in the
// same process (nodebench's blocker observer; BENCHMARKS.md). The tracer's
// own pipeline shares its process with the reader.
type ringWaiter struct {
	f    *os.File
	conn syscall.RawConn
	// done is the poller's readiness test: ready says whether a record
	// is there to read. It is asked before each park and after each
	// wakeup: the poller is edge-triggered, and the records the programs
	// submit without waking the reader show only to it.
	done func(uintptr) bool
}

// newRingWaiter registers a duplicate of the ring buffer map's descriptor
// with the network poller. The duplicate shares the map's open file, so
// it is readable exactly when the map is (the kernel's ring buffer poll).
func newRingWaiter(m *ebpf.Map, ready func() bool) (*ringWaiter, error) {
	fd, err := unix.FcntlInt(uintptr(m.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate ring buffer descriptor: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ring buffer descriptor non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(fd), "ringbuf")
	// A descriptor the poller does not take has no deadlines.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("ring buffer in the network poller: %w", err)
	}
	conn, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ring buffer in the network poller: %w", err)
	}
	return &ringWaiter{f: f, conn: conn, done: func(uintptr) bool { return ready() }}, nil
}

// wait returns when ready reports true, or with os.ErrDeadlineExceeded at
// deadline, or with an error once closed.
func (w *ringWaiter) wait(deadline time.Time) error {
	if err := w.f.SetReadDeadline(deadline); err != nil {
		return err
	}
	return w.conn.Read(w.done)
}

func (w *ringWaiter) Close() error { return w.f.Close() }
