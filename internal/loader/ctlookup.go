package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// CTLookup asks the kernel's conntrack table for entries through its BPF
// lookup kfunc (bpf_xdp_ct_lookup, Linux 5.18 and later): one
// BPF_PROG_TEST_RUN of bpf/ctlookup.c answers CTQuerySlots tuples, where
// netlink costs a GET and a page-sized reply each. The table is the
// network namespace of the thread that calls LookupAll. It is not safe for
// concurrent use.
type CTLookup struct {
	objs ctlookupObjects
	buf  []byte
}

// CTQuerySlots is how many tuples one run answers.
const CTQuerySlots = 32

// The layout of struct ct_query (bpf/ctlookup.c); layout_test.go checks
// it against the generated ctlookupCtQuery.
const (
	ctQuerySize     = 96
	ctQueryFamily   = 0
	ctQueryProto    = 1
	ctQueryFound    = 2
	ctQueryTCPState = 3
	ctQueryZone     = 4
	ctQueryStatus   = 8
	ctQueryMark     = 12
	ctQueryTuple    = 20
	ctQueryReply    = 56
	ctTupleSize     = 36
)

// CTEntry is a conntrack entry as the kernel holds it.
type CTEntry struct {
	Orig, Reply  event.Tuple
	Status, Mark uint32
	Zone         uint16
	// TCPState is enum tcp_conntrack (0 for other protocols).
	TCPState uint8
}

// OpenCTLookup loads the lookup program; it fails on kernels without the
// conntrack kfuncs (before 5.18, or conntrack without BTF).
func OpenCTLookup() (*CTLookup, error) {
	c := &CTLookup{buf: make([]byte, CTQuerySlots*ctQuerySize)}
	if err := loadCtlookupObjects(&c.objs, nil); err != nil {
		// kallsyms is read only to explain a failure: it is a read of
		// the whole table, which a tracker starting need not pay for.
		if _, ok, readable := kernelSymbol(ctLookupKfunc); readable && !ok {
			return nil, fmt.Errorf("load conntrack lookup program: the kernel has no %s (conntrack's kfuncs came in Linux 5.18)", ctLookupKfunc)
		}
		return nil, fmt.Errorf("load conntrack lookup program: %w", err)
	}
	return c, nil
}

const ctLookupKfunc = "bpf_xdp_ct_lookup"

// CTLookupExpected reports whether kallsyms lists the lookup kfunc, so
// that OpenCTLookup should succeed once nf_conntrack is loaded.
func CTLookupExpected() bool {
	_, ok, _ := kernelSymbol(ctLookupKfunc)
	return ok
}

// Close releases the program.
func (c *CTLookup) Close() error {
	if err := c.objs.Close(); err != nil {
		return fmt.Errorf("close conntrack lookup program: %w", err)
	}
	return nil
}

// CTLookupAnswers reports whether LookupAll can be asked for tu: the
// kfunc looks up TCP and UDP only.
func CTLookupAnswers(tu event.Tuple) bool {
	return (tu.Proto == unix.IPPROTO_TCP || tu.Proto == unix.IPPROTO_UDP) &&
		tu.Src.IsValid() && tu.Src.Is4() == tu.Dst.Is4()
}

// LookupAll answers every tuple (each one CTLookupAnswers takes) into
// entries and found, as long as tus: the entry holding it as either of
// its tuples, in the default zone.
func (c *CTLookup) LookupAll(tus []event.Tuple, entries []CTEntry, found []bool) error {
	for start := 0; start < len(tus); start += CTQuerySlots {
		end := min(start+CTQuerySlots, len(tus))
		if err := c.run(tus[start:end], entries[start:end], found[start:end]); err != nil {
			return err
		}
	}
	return nil
}

var errNotAnswerable = errors.New("conntrack lookup: only TCP and UDP tuples of one family")

func (c *CTLookup) run(tus []event.Tuple, entries []CTEntry, found []bool) error {
	data := c.buf[:len(tus)*ctQuerySize]
	clear(data)
	for i, tu := range tus {
		if !CTLookupAnswers(tu) {
			return fmt.Errorf("%w: %v", errNotAnswerable, tu)
		}
		q := data[i*ctQuerySize:]
		q[ctQueryFamily] = unix.AF_INET6
		if tu.Src.Is4() {
			q[ctQueryFamily] = unix.AF_INET
		}
		q[ctQueryProto] = tu.Proto
		putCTTuple(q[ctQueryTuple:], tu)
	}
	ret, err := c.objs.CtLookup.Run(&ebpf.RunOptions{Data: data, DataOut: data})
	if err != nil {
		return fmt.Errorf("run conntrack lookup program: %w", err)
	}
	if ret != xdpPass {
		return fmt.Errorf("run conntrack lookup program: returned %d", ret)
	}
	for i, tu := range tus {
		q := data[i*ctQuerySize:]
		found[i] = q[ctQueryFound] != 0
		if !found[i] {
			entries[i] = CTEntry{}
			continue
		}
		entries[i] = CTEntry{
			Orig:     ctTuple(q[ctQueryTuple:], tu),
			Reply:    ctTuple(q[ctQueryReply:], tu),
			Status:   binary.NativeEndian.Uint32(q[ctQueryStatus:]),
			Mark:     binary.NativeEndian.Uint32(q[ctQueryMark:]),
			Zone:     binary.NativeEndian.Uint16(q[ctQueryZone:]),
			TCPState: q[ctQueryTCPState],
		}
	}
	return nil
}

const xdpPass = 2

func putCTTuple(b []byte, tu event.Tuple) {
	if tu.Src.Is4() {
		s, d := tu.Src.As4(), tu.Dst.As4()
		copy(b[0:], s[:])
		copy(b[16:], d[:])
	} else {
		s, d := tu.Src.As16(), tu.Dst.As16()
		copy(b[0:], s[:])
		copy(b[16:], d[:])
	}
	binary.BigEndian.PutUint16(b[32:], tu.SrcPort)
	binary.BigEndian.PutUint16(b[34:], tu.DstPort)
}

// ctTuple reads a tuple the program wrote, of the family and protocol of
// the one asked for (an entry's tuples share them).
func ctTuple(b []byte, asked event.Tuple) event.Tuple {
	tu := event.Tuple{
		SrcPort: binary.BigEndian.Uint16(b[32:]),
		DstPort: binary.BigEndian.Uint16(b[34:]),
		Proto:   asked.Proto,
	}
	if asked.Src.Is4() {
		tu.Src = netip.AddrFrom4([4]byte(b[0:4]))
		tu.Dst = netip.AddrFrom4([4]byte(b[16:20]))
	} else {
		tu.Src = netip.AddrFrom16([16]byte(b[0:16]))
		tu.Dst = netip.AddrFrom16([16]byte(b[16:32]))
	}
	return tu
}
