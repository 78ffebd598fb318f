package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnlGroupCTDestroy is NFNLGRP_CONNTRACK_DESTROY.
const nfnlGroupCTDestroy = 3

// ctMsgDelete is IPCTNL_MSG_CT_DELETE, the type of a DESTROY event.
const ctMsgDelete = 2

// destroyReader is a targeted tracker's event socket: DESTROY events only,
// read without blocking whenever the tracker asks, so that a lookup can
// take in every DESTROY the kernel queued before it answered "no such
// entry".
type destroyReader struct {
	conn *netlink.Conn
	raw  syscall.RawConn
	buf  []byte
	// overrun keeps an ENOBUFS that Wait's peek took from the socket
	// for the next Drain to report.
	overrun      atomic.Bool
	decodeErrors atomic.Uint64
}

func newDestroyReader(cfg *netlink.Config, readBuffer int) (*destroyReader, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("open conntrack destroy event socket: %w", err)
	}
	d := &destroyReader{conn: c, buf: make([]byte, 32<<10)}
	if err := d.setup(readBuffer); err != nil {
		c.Close()
		return nil, err
	}
	return d, nil
}

func (d *destroyReader) setup(readBuffer int) error {
	if readBuffer > 0 {
		if err := d.conn.SetReadBuffer(readBuffer); err != nil {
			return fmt.Errorf("set conntrack event socket buffer: %w", err)
		}
	}
	if err := d.conn.JoinGroup(nfnlGroupCTDestroy); err != nil {
		return fmt.Errorf("join conntrack destroy events: %w", err)
	}
	raw, err := d.conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("conntrack destroy event socket: %w", err)
	}
	d.raw = raw
	return nil
}

func (d *destroyReader) Close() error { return d.conn.Close() }

// wait blocks until an event (or an overrun) is queued.
func (d *destroyReader) wait() error {
	var one [1]byte
	err := d.raw.Read(func(fd uintptr) bool {
		_, _, rerr := unix.Recvfrom(int(fd), one[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if errors.Is(rerr, unix.ENOBUFS) {
			d.overrun.Store(true)
		}
		return !errors.Is(rerr, unix.EAGAIN)
	})
	if err != nil {
		return fmt.Errorf("wait for conntrack events: %w", err)
	}
	return nil
}

// drain hands every DESTROY queued now to fn without blocking. It goes
// through Control, not Read, so it never waits behind wait's read lock.
func (d *destroyReader) drain(fn func(change)) error {
	var rerr error
	err := d.raw.Control(func(fd uintptr) {
		for {
			n, _, err := unix.Recvfrom(int(fd), d.buf, unix.MSG_DONTWAIT)
			switch {
			case errors.Is(err, unix.EAGAIN):
				return
			case errors.Is(err, unix.ENOBUFS):
				d.overrun.Store(true)
				continue
			case err != nil:
				rerr = fmt.Errorf("receive conntrack events: %w", err)
				return
			}
			d.parse(d.buf[:n], fn)
		}
	})
	if err := errors.Join(err, rerr); err != nil {
		return err
	}
	if d.overrun.Swap(false) {
		return errOverrun
	}
	return nil
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
