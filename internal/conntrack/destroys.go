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

// destroyReader is a tracker's event socket: DESTROY events only,
// read without blocking whenever the tracker asks, so that a lookup can
// take in every DESTROY the kernel queued before it answered "no such
// entry".
//
// The socket is outside Go's netpoller (outsideNetpoller) and nothing
// polls it: the tracker's wait loop reads it on a timer, so a DESTROY
// wakes nobody.
type destroyReader struct {
	// mu keeps fd open while a drain uses it; Close takes it for
	// writing.
	mu           sync.RWMutex
	fd           int
	closing      atomic.Bool
	dgrams       *datagrams
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
	return &destroyReader{fd: fd, dgrams: newDatagrams(destroysRead, destroySlot)}, nil
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

// Close closes the socket once no drain uses it.
func (d *destroyReader) Close() error {
	d.closing.Store(true)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := unix.Close(d.fd); err != nil {
		return fmt.Errorf("close conntrack destroy event socket: %w", err)
	}
	return nil
}

// drain hands every DESTROY queued now to fn without blocking. An
// ENOBUFS (an overrun) is reported once what the socket still holds has
// been read.
func (d *destroyReader) drain(fn func(Entry)) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closing.Load() {
		return nil
	}
	overrun := false
	for {
		n, err := d.dgrams.receive(d.fd)
		switch {
		case errors.Is(err, unix.EAGAIN):
			if overrun {
				return errOverrun
			}
			return nil
		case errors.Is(err, unix.ENOBUFS):
			overrun = true
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
func (d *destroyReader) parse(b []byte, fn func(Entry)) {
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
		fn(e)
	}
}
