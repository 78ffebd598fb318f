package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/mdlayher/netlink"

	"github.com/tracer-dev/tracer/internal/event"
)

// errOverrun is what a source's Receive returns when the kernel dropped
// events because the socket's receive buffer was full (ENOBUFS): the table
// is then stale in an unknown way and must be re-dumped.
var errOverrun = errors.New("conntrack event socket overrun (ENOBUFS): events were lost")

// errClosed ends the reader when the source was closed.
var errClosed = errors.New("conntrack source closed")

// change is one conntrack event, already converted.
type change struct {
	entry   Entry
	destroy bool
}

// source is where a Tracker gets its table and its changes from: netlink in
// production, a fake in the unit tests (overruns cannot be provoked on
// demand without root).
type source interface {
	// Dump returns every entry of the namespace's table now.
	Dump() ([]Entry, error)
	// Receive blocks for the next changes. errOverrun says events were
	// lost since the last call (the source stays usable); errClosed that
	// Close was called.
	Receive() ([]change, error)
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

// netlinkSource has an event socket (every event, or with a targeted
// tracker a destroyReader) that only ever receives multicast events, and
// dumps, queries and gets go over their own sockets so that their replies
// never interleave with events or each other. query carries the requests
// ti-mo/conntrack cannot make (a dump filtered by source); getter the
// single-entry GETs.
type netlinkSource struct {
	events   *netfilter.Conn
	destroys *destroyReader
	dumper   *ct.Conn
	query    *netfilter.Conn
	getter   *getter
	// kernel answers the GETs it takes (Options.Kernel); kernelErr is
	// why there is none.
	kernel    *kernelLookups
	kernelErr error
	// decodeErrors counts event messages ti-mo/conntrack could not parse.
	decodeErrors atomic.Uint64
	closed       chan struct{}
}

// dialNetlink opens the sockets in the namespace whose fd is nsFD (0: the
// caller's): an event socket in every conntrack group, or (targeted) a
// destroyReader. mdlayher/socket creates the socket on a locked thread
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
	switch {
	case opts.FedDestroys:
		// The kernel side reports the ends; no event socket at all.
	case opts.Targeted:
		if s.destroys, err = newDestroyReader(cfg, readBuffer); err != nil {
			return err
		}
	default:
		if s.events, err = dialEvents(cfg, readBuffer); err != nil {
			return err
		}
	}
	if s.dumper, err = ct.Dial(cfg); err != nil {
		return fmt.Errorf("open conntrack dump socket: %w", err)
	}
	if s.query, err = netfilter.Dial(cfg); err != nil {
		return fmt.Errorf("open conntrack query socket: %w", err)
	}
	s.getter, err = newGetter(cfg)
	return err
}

// dialEvents opens the socket of every conntrack event. It joins the groups
// before the first dump, so that no change between the dump and the
// subscription can be missed.
func dialEvents(cfg *netlink.Config, readBuffer int) (*netfilter.Conn, error) {
	evc, err := netfilter.Dial(cfg)
	if err != nil {
		return nil, fmt.Errorf("open conntrack event socket: %w", err)
	}
	if readBuffer > 0 {
		if err := evc.SetReadBuffer(readBuffer); err != nil {
			evc.Close()
			return nil, fmt.Errorf("set conntrack event socket buffer: %w", err)
		}
	}
	if err := evc.JoinGroups(netfilter.GroupsCT); err != nil {
		evc.Close()
		return nil, fmt.Errorf("join conntrack event groups: %w", err)
	}
	return evc, nil
}

func (s *netlinkSource) Dump() ([]Entry, error) {
	flows, err := s.dumper.Dump(nil)
	if err != nil {
		return nil, fmt.Errorf("dump conntrack table: %w", err)
	}
	out := make([]Entry, 0, len(flows))
	for i := range flows {
		out = append(out, fromFlow(&flows[i]))
	}
	return out, nil
}

func (s *netlinkSource) Receive() ([]change, error) {
	msgs, err := s.events.Receive()
	if err != nil {
		select {
		case <-s.closed:
			return nil, errClosed
		default:
		}
		if errors.Is(err, unix.ENOBUFS) {
			return nil, errOverrun
		}
		return nil, fmt.Errorf("receive conntrack events: %w", err)
	}
	out := make([]change, 0, len(msgs))
	for _, m := range msgs {
		var ev ct.Event
		if err := ev.Unmarshal(m); err != nil || ev.Flow == nil {
			s.decodeErrors.Add(1)
			continue
		}
		switch ev.Type {
		case ct.EventNew, ct.EventUpdate:
			out = append(out, change{entry: fromFlow(ev.Flow)})
		case ct.EventDestroy:
			out = append(out, change{entry: fromFlow(ev.Flow), destroy: true})
		}
	}
	return out, nil
}

func (s *netlinkSource) decodeErrorCount() uint64 {
	n := s.decodeErrors.Load()
	if s.destroys != nil {
		n += s.destroys.decodeErrors.Load()
	}
	return n
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
	if s.events != nil {
		errs = append(errs, s.events.Close())
	}
	if s.destroys != nil {
		errs = append(errs, s.destroys.Close())
	}
	if s.dumper != nil {
		errs = append(errs, s.dumper.Close())
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

// Drain hands over the DESTROY events queued now (targeted sources).
func (s *netlinkSource) Drain(fn func(change)) error {
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
