package live

import (
	"slices"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/conntrack"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/loader"
)

// kernelConntrack is the loader's BPF conntrack lookup as a tracker's
// KernelTable.
type kernelConntrack struct {
	lookup  *loader.CTLookup
	entries []loader.CTEntry
}

func openKernelConntrack() (conntrack.KernelTable, error) {
	l, err := loader.OpenCTLookup()
	if err != nil {
		return nil, err
	}
	return &kernelConntrack{lookup: l}, nil
}

func (k *kernelConntrack) Answers(tu event.Tuple) bool { return loader.CTLookupAnswers(tu) }

func (k *kernelConntrack) LookupAll(tus []event.Tuple, entries []conntrack.Entry, found []bool) error {
	k.entries = slices.Grow(k.entries[:0], len(tus))[:len(tus)]
	if err := k.lookup.LookupAll(tus, k.entries, found); err != nil {
		return err
	}
	for i, e := range k.entries {
		if !found[i] {
			entries[i] = conntrack.Entry{}
			continue
		}
		entries[i] = conntrack.Entry{Orig: e.Orig, Reply: e.Reply, Status: e.Status, Mark: e.Mark, Zone: e.Zone}
		if e.Orig.Proto == unix.IPPROTO_TCP {
			entries[i].State = conntrack.TCPStateName(e.TCPState)
		}
	}
	return nil
}

func (k *kernelConntrack) Close() error { return k.lookup.Close() }
