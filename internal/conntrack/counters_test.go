package conntrack

import (
	"errors"
	"testing"
	"time"

	ct "github.com/ti-mo/conntrack"
)

// fakeStats returns the readings of a scripted kernel, one per call.
type fakeStats struct {
	entries []uint32
	drops   []uint32 // per reading, split over two CPUs
	n       int
	fail    bool
}

func (f *fakeStats) StatsGlobal() (ct.StatsGlobal, error) {
	if f.fail {
		return ct.StatsGlobal{}, errors.New("netlink: operation not permitted")
	}
	return ct.StatsGlobal{Entries: f.entries[f.n], MaxEntries: 16}, nil
}

func (f *fakeStats) Stats() ([]ct.Stats, error) {
	d := f.drops[f.n]
	f.n++
	return []ct.Stats{{CPUID: 0, Drop: d / 2, InsertFailed: 1}, {CPUID: 1, Drop: d - d/2}}, nil
}

func (f *fakeStats) Close() error { return nil }

func TestCountersAround(t *testing.T) {
	base := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := base
	f := &fakeStats{entries: []uint32{3, 16, 16, 9, 9}, drops: []uint32{0, 0, 5, 7, 7}}
	c, err := newCounters(f, 10*time.Second, func() time.Time { return clock })
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		clock = base.Add(time.Duration(i) * time.Second)
		if _, err := c.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := c.Around(base.Add(-time.Millisecond)); ok {
		t.Error("a drop before the first reading got counters")
	}
	// Between the readings at 1s (16 entries, 0 drops) and 2s (16, 5).
	got, ok := c.Around(base.Add(1500 * time.Millisecond))
	if !ok || got.Entries != 16 || got.Max != 16 || got.Drops != 5 || !got.Full() {
		t.Errorf("around 1.5s: %+v %v, want 16/16 entries, 5 drops, full", got, ok)
	}
	// Between 2s (16, 5) and 3s (9, 7): the most entries of the two.
	if got, _ := c.Around(base.Add(2500 * time.Millisecond)); got.Entries != 16 || got.Drops != 2 {
		t.Errorf("around 2.5s: %+v, want 16 entries, 2 drops", got)
	}
	// After the newest reading: read now (4s: 9 entries, 7 drops).
	clock = base.Add(4 * time.Second)
	if got, _ := c.Around(base.Add(3500 * time.Millisecond)); got.Entries != 9 || got.Drops != 0 || got.Full() {
		t.Errorf("around 3.5s: %+v, want 9 entries, no drop, not full", got)
	}
	if d := c.Drops(); d != 7 {
		t.Errorf("Drops = %d, want 7", d)
	}
}

func TestCountersKeepsWindow(t *testing.T) {
	base := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := base
	n := 40
	f := &fakeStats{entries: make([]uint32, n), drops: make([]uint32, n)}
	for i := range f.drops {
		f.drops[i] = uint32(i)
	}
	c, err := newCounters(f, 5*time.Second, func() time.Time { return clock })
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		clock = base.Add(time.Duration(i) * time.Second)
		c.Sample()
	}
	if len(c.samples) > 7 {
		t.Errorf("kept %d readings for a 5s window at 1/s", len(c.samples))
	}
	if d := c.Drops(); d != uint64(n-1) {
		t.Errorf("Drops = %d after pruning, want %d (from the first reading)", d, n-1)
	}
	if _, ok := c.Around(base.Add(2 * time.Second)); ok {
		t.Error("a drop older than the window got counters")
	}
}

func TestCountersOpenError(t *testing.T) {
	if _, err := newCounters(&fakeStats{fail: true}, time.Second, time.Now); err == nil {
		t.Fatal("want the read error")
	}
}

func TestRiseWraps(t *testing.T) {
	if rise(10, 4) != 0 || rise(4, 10) != 6 {
		t.Error("rise")
	}
}
