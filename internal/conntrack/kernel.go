package conntrack

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netns"
)

// KernelTable reads entries straight from the kernel's conntrack table
// (the loader's BPF lookup), where a netlink GET costs the kernel a
// page-sized reply per entry: about 0.3 µs an entry against 3.4-4.8 in
// batched GETs (BenchmarkPrivCTLookup, BenchmarkPrivGetAll).
type KernelTable interface {
	// Answers reports whether LookupAll takes tu; the others are asked
	// for by netlink.
	Answers(tu event.Tuple) bool
	// LookupAll answers every tuple as a GET would (the entry holding it
	// as either tuple, default zone), in the namespace of the calling
	// thread.
	LookupAll(tus []event.Tuple, entries []Entry, found []bool) error
	Close() error
}

// kernelLookups runs a KernelTable on a thread of its own that stays in
// the tracker's namespace for the tracker's life (the kernel looks up in
// the namespace of the thread that asks), or in place for the caller's
// own namespace. After its first error it answers nothing, and the
// tracker's GETs take over.
type kernelLookups struct {
	table KernelTable
	calls chan kernelCall // nil: run in place
	exit  chan error

	mu      sync.Mutex
	failed  error
	closed  bool
	tus     []event.Tuple
	entries []Entry
	found   []bool
	mine    []int
	rest    []int
	done    chan error

	answered atomic.Uint64
}

type kernelCall struct {
	tus     []event.Tuple
	entries []Entry
	found   []bool
	done    chan error
}

// openKernelLookups opens the table and its thread; the error says why
// there are none.
func openKernelLookups(path string, open func() (KernelTable, error)) (*kernelLookups, error) {
	table, err := open()
	if err != nil {
		return nil, err
	}
	return startKernelLookups(path, table)
}

// kernelState is how many entries the kernel table was asked for, and
// why it answers none, "" while it does.
func (s *netlinkSource) kernelState() (uint64, string) {
	switch {
	case s.kernelErr != nil:
		return 0, s.kernelErr.Error()
	case s.kernel == nil:
		return 0, ""
	}
	if err := s.kernel.err(); err != nil {
		return s.kernel.answered.Load(), err.Error()
	}
	return s.kernel.answered.Load(), ""
}

// startKernelLookups opens table's thread in the namespace at path ("":
// the caller's, no thread).
func startKernelLookups(path string, table KernelTable) (*kernelLookups, error) {
	k := &kernelLookups{table: table, done: make(chan error, 1)}
	if path == "" {
		return k, nil
	}
	k.calls, k.exit = make(chan kernelCall), make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		k.exit <- netns.On(path, func() error {
			close(ready)
			for c := range k.calls {
				c.done <- table.LookupAll(c.tus, c.entries, c.found)
			}
			return nil
		})
	}()
	select {
	case <-ready:
		return k, nil
	case err := <-k.exit:
		table.Close()
		return nil, fmt.Errorf("start conntrack lookups in %s: %w", path, err)
	}
}

// inPlace reports whether the table runs on the caller's thread (the
// caller's own namespace).
func (k *kernelLookups) inPlace() bool { return k.calls == nil }

func (k *kernelLookups) lookupAll(tus []event.Tuple, entries []Entry, found []bool) error {
	if k.calls == nil {
		return k.table.LookupAll(tus, entries, found)
	}
	k.calls <- kernelCall{tus, entries, found, k.done}
	return <-k.done
}

// getAll answers tus into entries and found: the kernel table those it
// takes, get (netlink) the others, and all of them once the table failed.
func (k *kernelLookups) getAll(tus []event.Tuple, entries []Entry, found []bool, get func([]event.Tuple, []Entry, []bool) error) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.mine, k.rest = k.mine[:0], k.rest[:0]
	for i, tu := range tus {
		if k.failed == nil && !k.closed && k.table.Answers(tu) {
			k.mine = append(k.mine, i)
		} else {
			k.rest = append(k.rest, i)
		}
	}
	if len(k.mine) > 0 {
		if err := k.ask(k.mine, tus, entries, found, k.lookupAll); err != nil {
			k.failed = fmt.Errorf("conntrack lookups by BPF: %w", err)
			k.rest = append(k.rest, k.mine...)
		} else {
			k.answered.Add(uint64(len(k.mine)))
		}
	}
	if len(k.rest) > 0 {
		return k.ask(k.rest, tus, entries, found, get)
	}
	return nil
}

// ask answers the tuples at the indexes idx by lookup: through scratch,
// unless idx holds every index (each once), when they are asked in place.
func (k *kernelLookups) ask(idx []int, tus []event.Tuple, entries []Entry, found []bool, lookup func([]event.Tuple, []Entry, []bool) error) error {
	if len(idx) == len(tus) {
		return lookup(tus, entries, found)
	}
	n := len(idx)
	k.tus, k.entries, k.found = growTo(k.tus, n), growTo(k.entries, n), growTo(k.found, n)
	for j, i := range idx {
		k.tus[j] = tus[i]
	}
	if err := lookup(k.tus, k.entries, k.found); err != nil {
		return err
	}
	for j, i := range idx {
		entries[i], found[i] = k.entries[j], k.found[j]
	}
	return nil
}

func growTo[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// err is why the kernel table stopped answering, nil while it answers.
func (k *kernelLookups) err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.failed
}

// Close ends the thread; a lookup after it goes to netlink, which is
// closed with the tracker.
func (k *kernelLookups) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	var errs []error
	if k.calls != nil {
		close(k.calls)
		errs = append(errs, <-k.exit)
	}
	errs = append(errs, k.table.Close())
	return errors.Join(errs...)
}
