package conntrack

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// outsideNetpoller returns a duplicate of c's socket and closes c.
//
// A socket in Go's netpoller is in an edge-triggered epoll set, and every
// datagram queued on it wakes a thread parked in epoll_wait, whether or
// not a goroutine waits for it. The tracker's sockets receive one
// datagram per connection (a DESTROY, a lookup's reply), so on a busy
// node that is a futile wakeup per connection. netlink.Dial still makes
// the socket, in the right namespace; closing c takes it out of the
// netpoller (epoll_ctl DEL) while the duplicate keeps it open. The
// duplicate shares c's O_NONBLOCK: callers poll(2) when they must wait.
func outsideNetpoller(c *netlink.Conn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return -1, err
	}
	dup, derr := -1, error(nil)
	err = raw.Control(func(fd uintptr) { dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
	if err = errors.Join(err, derr); err != nil {
		c.Close()
		return -1, fmt.Errorf("duplicate netlink socket: %w", err)
	}
	if err := c.Close(); err != nil {
		unix.Close(dup)
		return -1, fmt.Errorf("close netlink socket's original descriptor: %w", err)
	}
	return dup, nil
}

// pollFor waits up to timeoutMs (-1: forever) for events on fd, retrying
// on EINTR; ready is false on timeout.
func pollFor(fd int, events int16, timeoutMs int) (ready bool, err error) {
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(fds, timeoutMs)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return n > 0, err
	}
}

// datagrams are receive slots for recvmmsg: slot bytes each.
type datagrams struct {
	data []byte
	slot int
	iovs []unix.Iovec
	hdrs []unix.Mmsghdr
}

func newDatagrams(n, slot int) *datagrams {
	d := &datagrams{data: make([]byte, n*slot), slot: slot, iovs: make([]unix.Iovec, n), hdrs: make([]unix.Mmsghdr, n)}
	for i := range d.hdrs {
		d.iovs[i].Base = &d.data[i*slot]
		d.iovs[i].SetLen(slot)
		d.hdrs[i].Hdr.Iov = &d.iovs[i]
		d.hdrs[i].Hdr.SetIovlen(1)
	}
	return d
}

// receive reads up to one datagram a slot without waiting.
func (d *datagrams) receive(fd int) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&d.hdrs[0])), uintptr(len(d.hdrs)), unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// at is the i-th datagram read; truncated says it did not fit its slot.
func (d *datagrams) at(i int) (b []byte, truncated bool) {
	h := &d.hdrs[i]
	return d.data[i*d.slot : i*d.slot+int(h.Len)], h.Hdr.Flags&unix.MSG_TRUNC != 0
}
