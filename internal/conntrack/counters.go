package conntrack

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"

	"github.com/tracer-dev/tracer/internal/trace"
)

// CounterSample is one reading of a namespace's conntrack counters, the
// ones `conntrack -C` and `conntrack -S` print.
type CounterSample struct {
	At      time.Time
	Entries uint32
	Max     uint32 // net.netfilter.nf_conntrack_max
	// Drop and InsertFailed are summed over the CPUs. Drop counts packets
	// conntrack itself dropped: a new connection's when the table is full
	// and holds nothing early drop may evict, or a packet whose insert
	// clash could not be resolved (InsertFailed rises too).
	Drop, InsertFailed uint64
}

// statsReader is the ctnetlink statistics a Counters reads; a fake in the
// unit tests.
type statsReader interface {
	StatsGlobal() (ct.StatsGlobal, error)
	Stats() ([]ct.Stats, error)
	Close() error
}

// Counters samples a namespace's conntrack counters and keeps the recent
// readings, so that a drop the kernel reported can be set beside what
// conntrack's own counters did around it.
type Counters struct {
	mu      sync.Mutex
	conn    statsReader
	now     func() time.Time
	keep    time.Duration
	samples []CounterSample // oldest first
	first   CounterSample
}

// OpenCounters opens ctnetlink in the namespace at netnsPath ("" is the
// caller's) and takes the first reading. keep is how long readings are
// kept: longer than a flow may wait before it is diagnosed.
func OpenCounters(netnsPath string, keep time.Duration) (*Counters, error) {
	var c *ct.Conn
	err := withNetns(netnsPath, func(nsFD int) (err error) {
		c, err = ct.Dial(&netlink.Config{NetNS: nsFD})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open conntrack counters: %w", err)
	}
	return newCounters(c, keep, time.Now)
}

func newCounters(r statsReader, keep time.Duration, now func() time.Time) (*Counters, error) {
	c := &Counters{conn: r, now: now, keep: keep}
	s, err := c.Sample()
	if err != nil {
		r.Close()
		return nil, err
	}
	c.first = s
	return c, nil
}

// Sample reads the counters now and keeps the reading.
func (c *Counters) Sample() (CounterSample, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sampleLocked()
}

func (c *Counters) sampleLocked() (CounterSample, error) {
	g, err := c.conn.StatsGlobal()
	if err != nil {
		return CounterSample{}, fmt.Errorf("read conntrack table size: %w", err)
	}
	cpus, err := c.conn.Stats()
	if err != nil {
		return CounterSample{}, fmt.Errorf("read conntrack statistics: %w", err)
	}
	s := CounterSample{At: c.now(), Entries: g.Entries, Max: g.MaxEntries}
	for _, st := range cpus {
		s.Drop += uint64(st.Drop)
		s.InsertFailed += uint64(st.InsertFailed)
	}
	c.samples = append(c.samples, s)
	cut := sort.Search(len(c.samples), func(i int) bool { return s.At.Sub(c.samples[i].At) <= c.keep })
	// The reading just before the window stays: it is the "before" of a
	// drop at the window's start.
	if cut > 1 {
		c.samples = append(c.samples[:0], c.samples[cut-1:]...)
	}
	return s, nil
}

// Around is what conntrack's counters did around a drop at t: the
// readings just before and just after it (read now if none is after it
// yet). ok is false when no reading precedes t, so the counters cannot
// say what happened then.
func (c *Counters) Around(t time.Time) (trace.ConntrackTable, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.samples), func(i int) bool { return c.samples[i].At.After(t) })
	if i == 0 {
		return trace.ConntrackTable{}, false
	}
	before := c.samples[i-1]
	var after CounterSample
	if i < len(c.samples) {
		after = c.samples[i]
	} else {
		var err error
		if after, err = c.sampleLocked(); err != nil {
			return trace.ConntrackTable{}, false
		}
	}
	return trace.ConntrackTable{
		Entries:      max(before.Entries, after.Entries),
		Max:          after.Max,
		Drops:        rise(before.Drop, after.Drop),
		InsertFailed: rise(before.InsertFailed, after.InsertFailed),
	}, true
}

// First is the first reading, taken when the counters were opened.
func (c *Counters) First() CounterSample {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first
}

// Drops is how much the drop counter rose since the first reading.
func (c *Counters) Drops() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.samples) == 0 {
		return 0
	}
	return rise(c.first.Drop, c.samples[len(c.samples)-1].Drop)
}

// rise is how much a counter went up; the kernel's per-CPU counters are
// 32 bits and may wrap, which reads as no rise rather than a huge one.
func rise(before, after uint64) uint64 {
	if after < before {
		return 0
	}
	return after - before
}

// Close closes the netlink socket.
func (c *Counters) Close() error { return c.conn.Close() }
