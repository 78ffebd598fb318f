package node

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// slowRunner is fakeRunner with iptables-save taking as long as it does
// on a node of thousands of Services.
type slowRunner struct {
	*fakeRunner
	save time.Duration
}

func (s slowRunner) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if name == "iptables-save" && len(args) == 0 {
		time.Sleep(s.save)
	}
	return s.fakeRunner.run(ctx, name, args...)
}

// While every poll finds a new commit, a part whose read is costly is read
// no more often than readShare times its cost, and the state says so; a
// cheap one is read at every poll, without a note.
func TestWatcherPacesCostlyReads(t *testing.T) {
	if k := os.Getenv("TRACER_VM_KERNEL"); k != "" {
		t.Skipf("the pacing goes by the reads' wall time, which QEMU's emulation in the %s guest stretches tenfold and unevenly: the host tier runs this", k)
	}
	for _, c := range []struct {
		name      string
		save      time.Duration
		poll      time.Duration
		minReads  uint64
		maxReads  uint64
		wantNoted bool
	}{
		// Each read of 40 ms puts the next 400 ms off: in 1.2 s of
		// polls every 5 ms, 3 reads, not 240.
		{"costly", 40 * time.Millisecond, 5 * time.Millisecond, 2, 4, true},
		// A fake read takes a millisecond or so (now and then tens
		// under QEMU's emulation, which paces a few polls): nearly
		// every 50 ms poll reads.
		{"cheap", 0, 50 * time.Millisecond, 10, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := nftBackendRunner()
			var gen atomic.Uint32
			w, err := WatchWith(context.Background(), "", WatchOptions{Poll: c.poll, Runner: slowRunner{f, c.save}.run, pacedFrom: pacedFrom,
				nftGen:       func() (uint32, error) { return gen.Add(1), nil }, // a commit before every poll
				legacyTables: func() (legacyTables, error) { return legacyTables{}, nil }})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			start := time.Now()
			for time.Since(start) < 1200*time.Millisecond {
				waitPolls(t, w, 1)
			}
			elapsed := time.Since(start)
			reads := w.Stats().RuleReads
			if reads < c.minReads || (c.maxReads > 0 && reads > c.maxReads) {
				t.Errorf("iptables-save ran %d times in %v of polls; want %d to %d", reads, elapsed, c.minReads, c.maxReads)
			}
			note := strings.Join(w.Current().Notes(), "\n")
			if noted := strings.Contains(note, "iptables rules are read at most every"); noted != c.wantNoted {
				t.Errorf("notes %q", note)
			}
			if c.wantNoted && w.Stats().Deferred == 0 {
				t.Errorf("no read counted as deferred: %+v", w.Stats())
			}
			t.Logf("%d reads in %v, stats %+v", reads, elapsed, w.Stats())
		})
	}
}
