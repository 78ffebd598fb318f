package loader

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// ourPrograms lists loaded programs whose names are ours (every program in
// bpf/tracer.c is named tr_*).
func ourPrograms(t testing.TB) []string {
	var names []string
	id := ebpf.ProgramID(0)
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return names
		}
		if err != nil {
			t.Fatalf("list programs: %v", err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err == nil && strings.HasPrefix(info.Name, "tr_") {
			names = append(names, info.Name)
		}
	}
}

func TestCloseDetachesEverything(t *testing.T) {
	requirePrivileged(t)
	// An earlier test's tracer in this process may still be being freed.
	if before := programsLeft(t); len(before) > 0 {
		t.Fatalf("programs of another tracer are loaded already: %v", before)
	}
	start := time.Now()
	tr, err := Open(Config{})
	if err != nil {
		t.Fatal(err)
	}
	attached := time.Since(start)
	if len(ourPrograms(t)) == 0 {
		t.Fatal("no tr_* program is loaded after Open")
	}
	start = time.Now()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("attach %v, detach %v, %d of %d hooks", attached, time.Since(start), tr.Plan.Attached(), len(tr.Plan))
	if err := tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if left := programsLeft(t); len(left) > 0 {
		t.Errorf("programs still loaded 3s after Close: %v", left)
	}
}

// programsLeft is ourPrograms once they are gone or 3 s have passed: the
// kernel frees programs after an RCU grace period, so a tracer just
// closed may still show for a moment.
func programsLeft(t testing.TB) []string {
	var left []string
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if left = ourPrograms(t); len(left) == 0 {
			return nil
		}
	}
	return left
}

// BenchmarkAttachDetach times Open and Close of the whole hook set.
func BenchmarkAttachDetach(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for b.Loop() {
		tr, err := Open(Config{})
		if err != nil {
			b.Fatal(err)
		}
		if err := tr.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCloseInterruptsNext: a reader parked on a quiet ring buffer returns
// os.ErrClosed as soon as another goroutine closes the tracer (the signal
// path), and nothing reads the unmapped ring after.
func TestCloseInterruptsNext(t *testing.T) {
	requirePrivileged(t)
	// A namespace inode nothing has: the ring buffer stays empty.
	tr, err := Open(Config{Netns: []uint32{1}})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := tr.Next()
		got <- err
	}()
	time.Sleep(3 * pollEvery)
	start := time.Now()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("Next after Close: %v, want os.ErrClosed", err)
		}
		t.Logf("Next returned %v after Close", time.Since(start))
	case <-time.After(2 * time.Second):
		t.Fatal("Next still blocked 2s after Close")
	}
	if _, err := tr.NextOrEmpty(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("NextOrEmpty on a closed tracer: %v, want os.ErrClosed", err)
	}
}
