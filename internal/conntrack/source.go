package conntrack

import (
	"errors"
	"fmt"
	"net/netip"

	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"

	"github.com/mdlayher/netlink"

	"github.com/tracer-dev/tracer/internal/event"
)

// errOverrun is what a drain returns when the kernel dropped DESTROY
// events because the socket's receive buffer was full (ENOBUFS).
var errOverrun = errors.New("conntrack event socket overrun (ENOBUFS): events were lost")

// errClosed is what a drain returns once the source was closed.
var errClosed = errors.New("conntrack source closed")

// source is where a Tracker asks for live entries: netlink in production,
// a fake in the unit tests (overruns cannot be provoked on demand without
// root). The netlink source is also a drainer of DESTROYs.
type source interface {
	// Get asks for the live entry holding tu as either of its tuples; ok
	// is false when the table has none.
	Get(tu event.Tuple) (e Entry, ok bool, err error)
	// GetAll is Get of every tuple, answered into entries and found
	// (as long as tus).
	GetAll(tus []event.Tuple, entries []Entry, found []bool) error
	// DumpSource returns the live entries whose original tuple leaves
	// from src.
	DumpSource(proto uint8, src netip.AddrPort) ([]Entry, error)
	Close() error
}

// netlinkSource has a DESTROY event socket (destroys, none when the ends
// are fed) that only ever receives multicast events; queries and gets go
// over their own sockets so that their replies never interleave with
// events or each other. query carries the dumps filtered by source (which
// ti-mo/conntrack cannot ask for); getter the GETs.
type netlinkSource struct {
	destroys *destroyReader
	query    *netfilter.Conn
	getter   *getter
	// kernel answers the GETs it takes (Options.Kernel); kernelErr is
	// why there is none.
	kernel    *kernelLookups
	kernelErr error
	closed    chan struct{}
}

// dialNetlink opens the sockets in the namespace whose fd is nsFD (0: the
// caller's). mdlayher/socket creates the socket on a locked thread
// switched into that namespace and switches back, so no goroutine is left
// in it.
func dialNetlink(nsFD int, readBuffer int, opts Options) (*netlinkSource, error) {
	s := &netlinkSource{closed: make(chan struct{})}
	if err := s.dial(&netlink.Config{NetNS: nsFD}, readBuffer, opts); err != nil {
		s.closeSockets()
		return nil, err
	}
	return s, nil
}

func (s *netlinkSource) dial(cfg *netlink.Config, readBuffer int, opts Options) error {
	var err error
	// Where the kernel side reports the ends, no event socket at all.
	if !opts.FedDestroys {
		if s.destroys, err = newDestroyReader(cfg, readBuffer); err != nil {
			return err
		}
	}
	if s.query, err = netfilter.Dial(cfg); err != nil {
		return fmt.Errorf("open conntrack query socket: %w", err)
	}
	s.getter, err = newGetter(cfg)
	return err
}

func (s *netlinkSource) decodeErrorCount() uint64 {
	if s.destroys == nil {
		return 0
	}
	return s.destroys.decodeErrors.Load()
}

func (s *netlinkSource) Close() error {
	close(s.closed)
	if err := s.closeSockets(); err != nil {
		return fmt.Errorf("close conntrack sockets: %w", err)
	}
	return nil
}

// closeSockets closes the sockets that were opened.
func (s *netlinkSource) closeSockets() error {
	var errs []error
	if s.destroys != nil {
		errs = append(errs, s.destroys.Close())
	}
	if s.query != nil {
		errs = append(errs, s.query.Close())
	}
	if s.getter != nil {
		errs = append(errs, s.getter.Close())
	}
	if s.kernel != nil {
		errs = append(errs, s.kernel.Close())
	}
	return errors.Join(errs...)
}

// Drain hands over the DESTROY events queued now.
func (s *netlinkSource) Drain(fn func(Entry)) error {
	err := s.destroys.drain(fn)
	select {
	case <-s.closed:
		return errClosed
	default:
	}
	return err
}

// fromFlow converts ti-mo's flow into an Entry. Seen is left to the caller,
// which stamps the time it processed the change.
func fromFlow(f *ct.Flow) Entry {
	e := Entry{
		Orig:   fromTuple(f.TupleOrig),
		Reply:  fromTuple(f.TupleReply),
		Status: uint32(f.Status),
		Mark:   f.Mark,
		Zone:   f.Zone,
	}
	if f.ProtoInfo.TCP != nil {
		e.State = TCPStateName(f.ProtoInfo.TCP.State)
	}
	e.Replied = e.Status&StatusSeenReply != 0
	return e
}

// fromTuple keys ICMP the way conntrack (and the BPF side's event.Tuple)
// does: the echo id as source port, type<<8|code as destination port.
func fromTuple(t ct.Tuple) event.Tuple {
	out := event.Tuple{
		Src:     unmap(t.IP.SourceAddress),
		Dst:     unmap(t.IP.DestinationAddress),
		Proto:   t.Proto.Protocol,
		SrcPort: t.Proto.SourcePort,
		DstPort: t.Proto.DestinationPort,
	}
	if t.Proto.ICMPv4 || t.Proto.ICMPv6 || t.Proto.Protocol == 1 || t.Proto.Protocol == 58 {
		out.SrcPort = t.Proto.ICMPID
		out.DstPort = uint16(t.Proto.ICMPType)<<8 | uint16(t.Proto.ICMPCode)
	}
	return out
}

func unmap(a netip.Addr) netip.Addr {
	if a.Is4In6() {
		return a.Unmap()
	}
	return a
}
