package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Writer writes one trace: the header at creation, then flows and events,
// then the summary on Close. Every line is written with a single Write as
// soon as it is produced, so a reader of a stream (`tracer trace -o json`)
// sees each flow at once; a batching Writer (Batch) writes the lines of a
// burst together when its producer says the burst has ended (Flush).
// Writer is safe for concurrent use.
type Writer struct {
	mu      sync.Mutex
	out     io.Writer
	file    *os.File // set when writing to a file via Create
	path    string
	summary Summary
	closed  bool
	// buf holds the lines not yet written: one at a time, or a batch's
	// (batching); kept for the next.
	buf      []byte
	batching bool
	enc      FlowEncoder
	// Now stamps the summary's end time; tests replace it.
	Now func() time.Time
}

// NewWriter writes a trace to w, starting with h. The header's Type and
// Schema are filled in; Hooks is written as [] when empty.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	tw := &Writer{out: w, Now: time.Now}
	tw.summary = Summary{Type: TypeSummary, Verdicts: map[string]int{}}
	h.Type, h.Schema = TypeHeader, Schema
	if h.Hooks == nil {
		h.Hooks = []Hook{}
	}
	if err := tw.writeLine(&h); err != nil {
		return nil, fmt.Errorf("write trace header: %w", err)
	}
	return tw, nil
}

// Create writes a trace to path, replacing what was there. Every line goes
// to the file as it is produced, with no buffer in between, so whatever
// was recorded survives the tracer's SIGKILL: the file then reads back up
// to its last complete line, and the reader warns that its summary is
// missing. Abort removes the file instead.
func Create(path string, h Header) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create trace %s: %w", path, err)
	}
	w, err := NewWriter(f, h)
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("create trace %s: %w", path, err)
	}
	w.file, w.path = f, path
	return w, nil
}

// WriteFlow writes one flow and counts it for the summary.
func (w *Writer) WriteFlow(f *Flow) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fmt.Errorf("write flow: trace already closed")
	}
	rec := *f
	rec.Type = TypeFlow
	if rec.Events == nil {
		rec.Events = []Event{}
	}
	if err := w.put(func(b []byte) ([]byte, error) { return w.enc.AppendFlow(b, &rec) }); err != nil {
		return fmt.Errorf("write flow: %w", err)
	}
	w.summary.Flows++
	w.summary.Events += len(f.Events)
	if f.Verdict != "" {
		w.summary.Verdicts[f.Verdict]++
	}
	return nil
}

// WriteEvent writes one raw event (a decision not joined into a flow).
func (w *Writer) WriteEvent(e *Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fmt.Errorf("write event: trace already closed")
	}
	rec := *e
	rec.Type = TypeEvent
	if err := w.writeLine(&rec); err != nil {
		return fmt.Errorf("write event: %w", err)
	}
	w.summary.Events++
	return nil
}

// WriteState writes a change of the node's state.
func (w *Writer) WriteState(c *StateChange) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fmt.Errorf("write state change: trace already closed")
	}
	rec := *c
	rec.Type = TypeState
	if err := w.writeLine(&rec); err != nil {
		return fmt.Errorf("write state change: %w", err)
	}
	w.summary.StateChanges++
	return nil
}

// SetLoss records, for the summary, what the capture stage could not
// deliver or saw go wrong under it: s's lost events in total, by hook and
// left unread at the stop, its conntrack overruns, conntrack's
// own drops, the hooks lost or attached while tracing, how many
// conntrack entries BPF answered (or why none), and what the tracer's
// process cost. The capture stage calls it before Close.
func (w *Writer) SetLoss(s Summary) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.summary.LostEvents = s.LostEvents
	w.summary.LostByHook = s.LostByHook
	w.summary.ConntrackOverruns, w.summary.ConntrackEndsEvicted = s.ConntrackOverruns, s.ConntrackEndsEvicted
	w.summary.UnreadAtStop = s.UnreadAtStop
	w.summary.ConntrackSourceDumpsSkipped = s.ConntrackSourceDumpsSkipped
	w.summary.ConntrackDrops = s.ConntrackDrops
	w.summary.TracerCPUMillis, w.summary.TracerPeakRSSKiB = s.TracerCPUMillis, s.TracerPeakRSSKiB
	w.summary.ConntrackBPFLookups, w.summary.ConntrackLookupsOff = s.ConntrackBPFLookups, s.ConntrackLookupsOff
	w.summary.HookChanges = s.HookChanges
	w.summary.Nodes = s.Nodes
}

// batchBytes is how much a batching Writer holds before it writes
// without waiting for Flush: a burst of about 40 flows.
const batchBytes = 64 << 10

// Batch makes w hold the lines it is given until Flush, or until they
// reach batchBytes, and write them in one Write: one system call for a
// burst of flows instead of one each. A write of its own cost each flow
// written to a file about 1.5 µs more; at 60,000 connections/s the full
// live pipeline lost 1,437 events writing that way and none batched, in
// back-to-back runs of nodebench's flood ramp. Its producer calls Flush
// when a burst ends: the live pipeline's flows come out in bursts, one
// per expiry round (live.Sink). What a kill -9 loses is what was held:
// at most one burst, never part of a line.
func (w *Writer) Batch() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.batching = true
}

// Flush writes the lines a batching Writer holds.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.flush(); err != nil {
		return fmt.Errorf("write trace lines: %w", err)
	}
	return nil
}

func (w *Writer) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.out.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}

// put appends one line, which line appends to its argument, and writes
// it, or holds it when batching (otherwise w.buf is empty here: flush
// empties it). A line that fails to encode is not kept: w.buf is not
// moved past the lines before it.
func (w *Writer) put(line func([]byte) ([]byte, error)) error {
	b, err := line(w.buf)
	if err != nil {
		return err
	}
	w.buf = append(b, '\n')
	if w.batching && len(w.buf) < batchBytes {
		return nil
	}
	return w.flush()
}

// Close writes the summary and, for a file from Create, syncs and closes
// it. A trace cut short by SIGINT or SIGTERM is complete as long as the
// caller reaches Close. When a write fails (a full disk), the file keeps
// what was written before, readable as a cut-off trace.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	w.summary.Ended = w.Now().UTC()
	if len(w.summary.Verdicts) == 0 {
		w.summary.Verdicts = nil
	}
	// The summary goes out with the lines a batching Writer still holds.
	err := w.writeLine(&w.summary)
	if ferr := w.flush(); err == nil {
		err = ferr
	}
	if err != nil {
		err = fmt.Errorf("write trace summary: %w", err)
	}
	if w.file == nil {
		return err
	}
	if serr := w.file.Sync(); serr != nil && err == nil {
		err = fmt.Errorf("sync trace %s: %w", w.path, serr)
	}
	if cerr := w.file.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close trace %s: %w", w.path, cerr)
	}
	return err
}

// Abort drops a trace from Create: its file is removed. It is for traces
// that never started (a probe, a failed setup), not for recordings cut
// short, whose flows are worth keeping.
func (w *Writer) Abort() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.file != nil {
		w.file.Close()
		os.Remove(w.path)
	}
}

// writeLine marshals v and writes it with its newline in one Write (or
// holds it, batching), so concurrent readers of a pipe never see half a
// line.
func (w *Writer) writeLine(v any) error {
	return w.put(func(b []byte) ([]byte, error) {
		line, err := json.Marshal(v)
		return append(b, line...), err
	})
}
