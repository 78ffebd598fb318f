package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// getter asks the kernel for one conntrack entry at a time, without
// ti-mo/conntrack's per-call allocations and acknowledgement: the kernel
// answers a GET inside the sendmsg that carries it, so its reply is
// already queued when one recvmsg reads it into a reused buffer. The
// socket is outside Go's netpoller (outsideNetpoller), where each reply
// would wake a parked thread for nothing.
type getter struct {
	mu     sync.Mutex
	fd     int
	closed bool
	seq    uint32
	req    []byte
	buf    []byte
	batch  *datagrams
}

// getTimeout bounds a wait for a reply the kernel did not queue at once.
const getTimeout = 5 * time.Second

func newGetter(cfg *netlink.Config) (*getter, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("open conntrack get socket: %w", err)
	}
	fd, err := outsideNetpoller(c)
	if err != nil {
		return nil, fmt.Errorf("open conntrack get socket: %w", err)
	}
	return &getter{fd: fd, req: make([]byte, 0, 128), buf: make([]byte, 16<<10)}, nil
}

func (g *getter) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	if err := unix.Close(g.fd); err != nil {
		return fmt.Errorf("close conntrack get socket: %w", err)
	}
	return nil
}

// ctnetlink message and attribute numbers (linux/netfilter/nfnetlink.h,
// nfnetlink_conntrack.h).
const (
	nfnlSubsysCTNetlink = 1
	ctMsgNew            = 0
	ctaTupleReply       = 2
	ctaStatus           = 3
	ctaProtoInfo        = 4
	ctaMark             = 8
	ctaZone             = 18
	ctaIPv4Dst          = 2
	ctaIPv6Dst          = 4
	ctaProtoDstPort     = 3
	ctaProtoICMPType    = 5
	ctaProtoICMPCode    = 6
	ctaProtoICMPv6Type  = 8
	ctaProtoICMPv6Code  = 9
	ctaProtoInfoTCP     = 1
	ctaProtoInfoTCPSt   = 1
	nlaNested           = 0x8000
	nlaTypeMask         = 0x3fff
	nlmsgHdrLen         = 16
	nfgenHdrLen         = 4
)

// get returns the live entry holding tu as either tuple; ok is false when
// the kernel has none.
func (g *getter) get(tu event.Tuple) (e Entry, ok bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return Entry{}, false, errClosed
	}
	g.seq++
	g.req = appendGetRequest(g.req[:0], tu, g.seq)
	if err := g.send(); err != nil {
		return Entry{}, false, fmt.Errorf("send conntrack get: %w", err)
	}
	for {
		n, err := g.receive()
		if err != nil {
			return Entry{}, false, fmt.Errorf("receive conntrack get reply: %w", err)
		}
		e, ok, done, err := parseGetReply(g.buf[:n], g.seq)
		if done {
			return e, ok, err
		}
		// A stale reply to an earlier request: read on.
	}
}

// send writes the request: a netlink socket's unaddressed write goes to the
// kernel, and needs no address allocated per request as sendto does.
func (g *getter) send() error {
	_, err := g.whenReady(unix.POLLOUT, "socket not writable", func() (int, error) { return unix.Write(g.fd, g.req) })
	return err
}

// receive reads a reply; the socket is non-blocking, and read returns no
// sender address to allocate, as recvfrom does.
func (g *getter) receive() (int, error) {
	return g.whenReady(unix.POLLIN, "no reply", func() (int, error) { return unix.Read(g.fd, g.buf) })
}

// whenReady runs op on the non-blocking socket until it neither would
// block nor was interrupted, waiting up to getTimeout for events in
// between; what names the timeout.
func (g *getter) whenReady(events int16, what string, op func() (int, error)) (int, error) {
	for {
		n, err := op()
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			return n, err
		}
		if ready, err := pollFor(g.fd, events, int(getTimeout.Milliseconds())); err != nil || !ready {
			return 0, errors.Join(err, fmt.Errorf("%s in %v", what, getTimeout))
		}
	}
}

// appendGetRequest appends an IPCTNL_MSG_CT_GET of tu's entry, without
// NLM_F_ACK: the reply is the entry or an error, never both.
func appendGetRequest(b []byte, tu event.Tuple, seq uint32) []byte {
	start := len(b)
	family := byte(unix.AF_INET)
	if tu.Src.Is6() {
		family = unix.AF_INET6
	}
	b = binary.NativeEndian.AppendUint32(b, 0) // length, set below
	b = binary.NativeEndian.AppendUint16(b, nfnlSubsysCTNetlink<<8|ipctnlMsgCTGet)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_REQUEST)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0) // port id: the kernel's
	b = append(b, family, 0, 0, 0)             // nfgenmsg: family, version, res_id
	b = appendNested(b, ctaTupleOrig, func(b []byte) []byte { return appendTuple(b, tu) })
	binary.NativeEndian.PutUint32(b[start:], uint32(len(b)-start))
	return b
}

func appendTuple(b []byte, tu event.Tuple) []byte {
	b = appendNested(b, ctaTupleIP, func(b []byte) []byte {
		if tu.Src.Is6() {
			s, d := tu.Src.As16(), tu.Dst.As16()
			return appendAttr(appendAttr(b, ctaIPv6Src, s[:]), ctaIPv6Dst, d[:])
		}
		s, d := tu.Src.As4(), tu.Dst.As4()
		return appendAttr(appendAttr(b, ctaIPv4Src, s[:]), ctaIPv4Dst, d[:])
	})
	return appendNested(b, ctaTupleProto, func(b []byte) []byte {
		b = appendAttr(b, ctaProtoNum, []byte{tu.Proto})
		switch tu.Proto {
		case unix.IPPROTO_ICMP:
			return appendICMP(b, tu, ctaProtoICMPID, ctaProtoICMPType, ctaProtoICMPCode)
		case unix.IPPROTO_ICMPV6:
			return appendICMP(b, tu, ctaProtoICMPv6ID, ctaProtoICMPv6Type, ctaProtoICMPv6Code)
		}
		b = appendAttr(b, ctaProtoSrcPort, be16(tu.SrcPort))
		return appendAttr(b, ctaProtoDstPort, be16(tu.DstPort))
	})
}

// appendICMP keys ICMP as event.Tuple does: echo id in SrcPort,
// type<<8|code in DstPort.
func appendICMP(b []byte, tu event.Tuple, id, typ, code uint16) []byte {
	b = appendAttr(b, id, be16(tu.SrcPort))
	b = appendAttr(b, typ, []byte{byte(tu.DstPort >> 8)})
	return appendAttr(b, code, []byte{byte(tu.DstPort)})
}

// be16 is n in network order, as an attribute's payload.
func be16(n uint16) []byte { return []byte{byte(n >> 8), byte(n)} }

func appendAttr(b []byte, typ uint16, data []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(data)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func appendNested(b []byte, typ uint16, children func([]byte) []byte) []byte {
	start := len(b)
	b = binary.NativeEndian.AppendUint16(b, 0)
	b = binary.NativeEndian.AppendUint16(b, typ|nlaNested)
	b = children(b)
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	return b
}

// parseGetReply reads the datagram answering request seq: done is false
// when it answers another request.
func parseGetReply(b []byte, seq uint32) (e Entry, ok, done bool, err error) {
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < nlmsgHdrLen || l > len(b) {
			return Entry{}, false, true, errors.New("conntrack get reply: truncated message")
		}
		msg, typ := b[:l], binary.NativeEndian.Uint16(b[4:6])
		b = b[min(align4(l), len(b)):]
		if seqOf(msg) != seq {
			continue
		}
		switch typ {
		case unix.NLMSG_ERROR:
			if len(msg) < nlmsgHdrLen+4 {
				return Entry{}, false, true, errors.New("conntrack get reply: truncated error")
			}
			errno := -int32(binary.NativeEndian.Uint32(msg[nlmsgHdrLen:]))
			if errno == int32(unix.ENOENT) {
				return Entry{}, false, true, nil
			}
			return Entry{}, false, true, fmt.Errorf("conntrack get: %w", unix.Errno(errno))
		case nfnlSubsysCTNetlink<<8 | ctMsgNew:
			if len(msg) < nlmsgHdrLen+nfgenHdrLen {
				return Entry{}, false, true, errors.New("conntrack get reply: truncated entry")
			}
			e, err := parseEntry(msg[nlmsgHdrLen+nfgenHdrLen:])
			return e, err == nil, true, err
		}
	}
	return Entry{}, false, false, nil
}

// seqOf is the sequence number of the netlink message b starts with.
func seqOf(b []byte) uint32 { return binary.NativeEndian.Uint32(b[8:12]) }

func align4(n int) int { return (n + 3) &^ 3 }

// attrs calls fn for each netlink attribute in b.
func attrs(b []byte, fn func(typ uint16, data []byte) error) error {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return errors.New("conntrack entry: truncated attribute")
		}
		if err := fn(binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask, b[4:l]); err != nil {
			return err
		}
		b = b[min(align4(l), len(b)):]
	}
	return nil
}

// parseEntry reads the attributes of a ctnetlink entry as fromFlow reads
// ti-mo/conntrack's Flow.
func parseEntry(b []byte) (Entry, error) {
	var e Entry
	err := attrs(b, func(typ uint16, d []byte) error {
		var err error
		switch typ {
		case ctaTupleOrig:
			e.Orig, err = parseTuple(d)
		case ctaTupleReply:
			e.Reply, err = parseTuple(d)
		case ctaStatus:
			e.Status, err = be32(d)
		case ctaMark:
			e.Mark, err = be32(d)
		case ctaZone:
			if len(d) < 2 {
				return errors.New("conntrack entry: short zone")
			}
			e.Zone = binary.BigEndian.Uint16(d)
		case ctaProtoInfo:
			e.State, err = parseTCPState(d)
		}
		return err
	})
	e.Replied = e.Status&StatusSeenReply != 0
	return e, err
}

func be32(d []byte) (uint32, error) {
	if len(d) < 4 {
		return 0, errors.New("conntrack entry: short u32")
	}
	return binary.BigEndian.Uint32(d), nil
}

func parseTCPState(d []byte) (string, error) {
	var state string
	err := attrs(d, func(typ uint16, d []byte) error {
		if typ != ctaProtoInfoTCP {
			return nil
		}
		return attrs(d, func(typ uint16, d []byte) error {
			if typ == ctaProtoInfoTCPSt && len(d) >= 1 {
				state = TCPStateName(d[0])
			}
			return nil
		})
	})
	return state, err
}

func parseTuple(d []byte) (event.Tuple, error) {
	var tu event.Tuple
	var icmpID uint16
	var icmpType, icmpCode uint8
	err := attrs(d, func(typ uint16, d []byte) error {
		switch typ {
		case ctaTupleIP:
			return attrs(d, func(typ uint16, d []byte) error {
				a, ok := netip.AddrFromSlice(d)
				switch {
				case !ok:
					return errors.New("conntrack entry: bad address")
				case typ == ctaIPv4Src || typ == ctaIPv6Src:
					tu.Src = unmap(a)
				case typ == ctaIPv4Dst || typ == ctaIPv6Dst:
					tu.Dst = unmap(a)
				}
				return nil
			})
		case ctaTupleProto:
			return attrs(d, func(typ uint16, d []byte) error {
				switch {
				case len(d) == 0:
					return errors.New("conntrack entry: empty protocol attribute")
				case typ == ctaProtoNum:
					tu.Proto = d[0]
				case (typ == ctaProtoSrcPort || typ == ctaProtoDstPort || typ == ctaProtoICMPID || typ == ctaProtoICMPv6ID) && len(d) < 2:
					return errors.New("conntrack entry: short port")
				case typ == ctaProtoSrcPort:
					tu.SrcPort = binary.BigEndian.Uint16(d)
				case typ == ctaProtoDstPort:
					tu.DstPort = binary.BigEndian.Uint16(d)
				case typ == ctaProtoICMPID || typ == ctaProtoICMPv6ID:
					icmpID = binary.BigEndian.Uint16(d)
				case typ == ctaProtoICMPType || typ == ctaProtoICMPv6Type:
					icmpType = d[0]
				case typ == ctaProtoICMPCode || typ == ctaProtoICMPv6Code:
					icmpCode = d[0]
				}
				return nil
			})
		}
		return nil
	})
	if tu.Proto == unix.IPPROTO_ICMP || tu.Proto == unix.IPPROTO_ICMPV6 {
		tu.SrcPort, tu.DstPort = icmpID, uint16(icmpType)<<8|uint16(icmpCode)
	}
	return tu, err
}
