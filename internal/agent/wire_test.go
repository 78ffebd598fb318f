package agent

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// traceFlows are the flows of the repository's recorded traces, as the
// server encodes them (trace.FlowEncoder).
func traceFlows(t testing.TB) [][]byte {
	t.Helper()
	paths, err := filepath.Glob("../../testdata/traces/*.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("../audit/testdata/*.ndjson")
	var lines [][]byte
	var enc trace.FlowEncoder
	for _, p := range append(paths, more...) {
		tr, err := trace.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range tr.Flows {
			line, err := enc.AppendFlow(nil, f)
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, line)
		}
	}
	if len(lines) < 10 {
		t.Fatalf("%d flows in the recorded traces", len(lines))
	}
	return lines
}

// TestFlowsMessageMarshalsAsEncodingJSON: the codec's own encoding of a
// flows message is encoding/json's, byte for byte: flows of every
// recorded trace, a heartbeat, the last message with its summary.
func TestFlowsMessageMarshalsAsEncodingJSON(t *testing.T) {
	at := time.Date(2026, 12, 6, 19, 0, 0, 123456789, time.FixedZone("x", 3600))
	msgs := []FlowsMessage{
		{Time: at},
		{Time: at, Dropped: 7, LostEvents: 1 << 40},
		{Time: at, TracerCPUMillis: 1234, TracerRSSKiB: 61 << 10},
		{Summary: &trace.Summary{Type: trace.TypeSummary, Flows: 3, Verdicts: map[string]int{"ok": 2, "reset": 1}}},
	}
	for i, line := range traceFlows(t) {
		msgs = append(msgs, FlowsMessage{Flow: line, Time: at.Add(time.Duration(i)), Dropped: uint64(i)})
	}
	for i := range msgs {
		got, err := jsonCodec{}.Marshal(&msgs[i])
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(&msgs[i])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("message %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

func BenchmarkFlowsMessageMarshal(b *testing.B) {
	lines := traceFlows(b)
	msg := FlowsMessage{Flow: lines[0], Time: time.Now(), Dropped: 3, LostEvents: 4}
	b.SetBytes(int64(len(msg.Flow)))
	for b.Loop() {
		if _, err := (jsonCodec{}).Marshal(&msg); err != nil {
			b.Fatal(err)
		}
	}
}
