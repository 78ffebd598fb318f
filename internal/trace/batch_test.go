package trace

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// batchingWriter is a Writer to out that batches, its header written.
func batchingWriter(t *testing.T, out io.Writer) *Writer {
	t.Helper()
	w, err := NewWriter(out, Header{Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	w.Batch()
	return w
}

func batchFlow(i int) *Flow {
	return &Flow{Time: time.Unix(int64(i), 0).UTC(), Proto: "tcp", Orig: Tuple{"10.0.0.1:1", "10.0.0.2:2"}, Verdict: VerdictOK}
}

// A batching Writer holds a burst's lines, of every kind, until Flush,
// then writes them in one Write, whole lines only.
func TestWriterBatchWritesABurstAtFlush(t *testing.T) {
	var writes countingWriter
	w := batchingWriter(t, &writes)
	for i := range 3 {
		if err := w.WriteFlow(batchFlow(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteEvent(&Event{Kind: KindDNAT, Time: time.Unix(5, 0).UTC()}); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteState(&StateChange{Time: time.Unix(6, 0).UTC()}); err != nil {
		t.Fatal(err)
	}
	if writes.n != 1 {
		t.Fatalf("%d writes before Flush; want the header's alone:\n%s", writes.n, writes.buf.String())
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(writes.buf.String(), "\n"), "\n")
	if writes.n != 2 || len(lines) != 6 {
		t.Fatalf("%d writes, %d lines after two Flushes; want 2 writes, 6 lines:\n%s", writes.n, len(lines), writes.buf.String())
	}
	for i, l := range lines[1:4] {
		f, err := ParseFlow([]byte(l))
		if err != nil || !f.Time.Equal(batchFlow(i).Time) {
			t.Errorf("line %d: %v, %q", i+2, err, l)
		}
	}
	if !strings.Contains(lines[4], `"type":"event"`) || !strings.Contains(lines[5], `"type":"state"`) {
		t.Errorf("the event and state lines: %q, %q", lines[4], lines[5])
	}
}

// A burst larger than batchBytes is written as it grows, in whole lines,
// without waiting for Flush.
func TestWriterBatchWritesWhenFull(t *testing.T) {
	var writes lineWrites
	w := batchingWriter(t, &writes)
	n := 0
	for writes.n < 3 {
		if err := w.WriteFlow(batchFlow(n)); err != nil {
			t.Fatal(err)
		}
		n++
	}
	for i, size := range writes.sizes[1:] {
		if size < batchBytes || size > batchBytes+1024 {
			t.Errorf("write %d of a full batch: %d bytes, want %d to %d", i+2, size, batchBytes, batchBytes+1024)
		}
	}
	if writes.partial {
		t.Error("a write ended inside a line")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got := bytes.Count(writes.buf.Bytes(), []byte(`"type":"flow"`)); got != n {
		t.Errorf("%d flows written of %d", got, n)
	}
}

// Close writes what a batching Writer holds with the summary; until then
// a file from Create holds what was flushed (what a kill -9 leaves).
func TestWriterBatchCloseWritesTheRest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.ndjson")
	w, err := Create(path, Header{Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	w.Batch()
	w.WriteFlow(batchFlow(1))
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	w.WriteFlow(batchFlow(2))
	cut, err := ReadFile(path)
	if err != nil || len(cut.Flows) != 1 || cut.Summary != nil {
		t.Fatalf("before Close: %v, %d flows, summary %v; want the flushed flow alone", err, len(cut.Flows), cut.Summary)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	tr, err := ReadFile(path)
	if err != nil || len(tr.Flows) != 2 || tr.Summary == nil || tr.Summary.Flows != 2 {
		t.Fatalf("after Close: %v, %d flows, summary %+v", err, len(tr.Flows), tr.Summary)
	}
}

// A flow that cannot be encoded leaves nothing in the batch; a write
// that fails is Flush's error.
func TestWriterBatchErrors(t *testing.T) {
	var writes countingWriter
	w := batchingWriter(t, &writes)
	w.WriteFlow(batchFlow(1))
	bad := batchFlow(2)
	bad.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := w.WriteFlow(bad); err == nil {
		t.Fatal("a flow in the year 10000 was encoded")
	}
	w.WriteFlow(batchFlow(3))
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(writes.buf.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want the header and 2 flows:\n%s", len(lines), writes.buf.String())
	}
	for _, l := range lines[1:] {
		if _, err := ParseFlow([]byte(l)); err != nil {
			t.Errorf("%v: %q", err, l)
		}
	}

	failing := &failAfter{ok: 1}
	w = batchingWriter(t, failing)
	if err := w.WriteFlow(batchFlow(1)); err != nil {
		t.Fatalf("a held flow failed: %v", err)
	}
	if err := w.Flush(); !errors.Is(err, errDiskFull) {
		t.Errorf("Flush of a failing writer: %v", err)
	}
}

// lineWrites records each Write's size and whether one ended mid-line.
type lineWrites struct {
	countingWriter
	sizes   []int
	partial bool
}

func (l *lineWrites) Write(p []byte) (int, error) {
	l.sizes = append(l.sizes, len(p))
	l.partial = l.partial || len(p) == 0 || p[len(p)-1] != '\n'
	return l.countingWriter.Write(p)
}

var errDiskFull = errors.New("no space left on device")

// failAfter takes ok writes, then fails.
type failAfter struct{ ok int }

func (f *failAfter) Write(p []byte) (int, error) {
	if f.ok == 0 {
		return 0, errDiskFull
	}
	f.ok--
	return len(p), nil
}
