package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnlGroupCTDestroy is NFNLGRP_CONNTRACK_DESTROY.
const nfnlGroupCTDestroy = 3

// ctMsgDelete is IPCTNL_MSG_CT_DELETE, the type of a DESTROY event.
const ctMsgDelete = 2

// destroysRead is how many DESTROYs one recvmmsg reads: each is a
// datagram of its own, and one read each was a third of the reader's time.
const destroysRead = 32

// destroySlot holds one DESTROY: a few hundred bytes, under 1 KiB with
// every optional attribute (counters, timestamps, labels, helper, secctx).
// One that does not fit is counted as not decoded.
const destroySlot = 4096

// destroyReader is a targeted tracker's event socket: DESTROY events only,
// read without blocking whenever the tracker asks, so that a lookup can
// take in every DESTROY the kernel queued before it answered "no such
// entry".
//
// The socket is outside Go's netpoller (outsideNetpoller) and polled only
// while wait runs, so the DESTROYs that arrive during the wait loop's
// batch wake nobody.
type destroyReader struct {
	// mu keeps fd open while a wait or a drain uses it; Close takes it
	// for writing after waking the wait.
	mu      sync.RWMutex
	fd      int
	wake    int // an eventfd that Close writes to end a wait
	closing atomic.Bool
	dgrams  *datagrams
	// overrun keeps an ENOBUFS that wait took from the socket for the
	// next drain to report.
	overrun      atomic.Bool
	decodeErrors atomic.Uint64
}

func newDestroyReader(cfg *netlink.Config, readBuffer int) (*destroyReader, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("open conntrack destroy event socket: %w", err)
	}
	if err := joinDestroys(c, readBuffer); err != nil {
		c.Close()
		return nil, err
	}
	fd, err := outsideNetpoller(c)
	if err != nil {
		return nil, fmt.Errorf("open conntrack destroy event socket: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open conntrack destroy reader's eventfd: %w", err)
	}
	return &destroyReader{fd: fd, wake: wake, dgrams: newDatagrams(destroysRead, destroySlot)}, nil
}

func joinDestroys(c *netlink.Conn, readBuffer int) error {
	if readBuffer > 0 {
		if err := c.SetReadBuffer(readBuffer); err != nil {
			return fmt.Errorf("set conntrack event socket buffer: %w", err)
		}
	}
	if err := c.JoinGroup(nfnlGroupCTDestroy); err != nil {
		return fmt.Errorf("join conntrack destroy events: %w", err)
	}
	return nil
}

// Close ends a wait in progress and closes the socket.
func (d *destroyReader) Close() error {
	d.closing.Store(true)
	one := [8]byte{1}
	_, werr := unix.Write(d.wake, one[:])
	d.mu.Lock()
	defer d.mu.Unlock()
	err := errors.Join(werr, unix.Close(d.fd), unix.Close(d.wake))
	if err != nil {
		return fmt.Errorf("close conntrack destroy event socket: %w", err)
	}
	return nil
}

// wait blocks until an event (or an overrun) is queued, or Close is
// called.
func (d *destroyReader) wait() error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for !d.closing.Load() {
		fds := []unix.PollFd{{Fd: int32(d.fd), Events: unix.POLLIN}, {Fd: int32(d.wake), Events: unix.POLLIN}}
		_, err := unix.Poll(fds, -1)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("wait for conntrack events: %w", err)
		case fds[1].Revents != 0:
			return nil
		case fds[0].Revents&unix.POLLERR != 0:
			// The socket's error is ENOBUFS, an overrun: reading takes it.
			var one [1]byte
			if _, _, rerr := unix.Recvfrom(d.fd, one[:], unix.MSG_PEEK|unix.MSG_DONTWAIT); errors.Is(rerr, unix.ENOBUFS) {
				d.overrun.Store(true)
			}
			return nil
		case fds[0].Revents != 0:
			return nil
		}
	}
	return nil
}

// drain hands every DESTROY queued now to fn without blocking.
func (d *destroyReader) drain(fn func(change)) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closing.Load() {
		return nil
	}
	for {
		n, err := d.dgrams.receive(d.fd)
		switch {
		case errors.Is(err, unix.EAGAIN):
			if d.overrun.Swap(false) {
				return errOverrun
			}
			return nil
		case errors.Is(err, unix.ENOBUFS):
			d.overrun.Store(true)
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("receive conntrack events: %w", err)
		}
		for i := range n {
			b, truncated := d.dgrams.at(i)
			if truncated {
				d.decodeErrors.Add(1)
				continue
			}
			d.parse(b, fn)
		}
	}
}

// parse hands the DESTROY events of one datagram to fn.
func (d *destroyReader) parse(b []byte, fn func(change)) {
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < nlmsgHdrLen+nfgenHdrLen || l > len(b) {
			d.decodeErrors.Add(1)
			return
		}
		msg, typ := b[:l], binary.NativeEndian.Uint16(b[4:6])
		b = b[min(align4(l), len(b)):]
		if typ != nfnlSubsysCTNetlink<<8|ctMsgDelete {
			continue
		}
		e, err := parseEntry(msg[nlmsgHdrLen+nfgenHdrLen:])
		if err != nil {
			d.decodeErrors.Add(1)
			continue
		}
		fn(change{entry: e, destroy: true})
	}
}
