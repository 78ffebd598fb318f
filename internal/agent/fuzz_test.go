package agent

import (
	"testing"
)

// FuzzDecodeMessage: whatever an agent (or anything posing as one) sends,
// the client decodes it or says why, and a flow it accepts is a flow a
// trace reader would accept.
func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte(`{"flow":{"type":"flow","time":"2026-12-03T06:00:00Z","proto":"tcp","orig":{"src":"10.0.0.1:1","dst":"10.96.0.1:80"},"events":[]},"time":"2026-12-03T06:00:01Z","dropped":2,"lost_events":1}`))
	f.Add([]byte(`{"time":"2026-12-03T06:00:01Z","dropped":0,"lost_events":0,"summary":{"type":"summary","flows":3}}`))
	f.Add([]byte(`{"flow":{"type":"event"}}`))
	f.Add([]byte(`{"flow":"x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var raw FlowsMessage
		if (jsonCodec{}).Unmarshal(data, &raw) != nil {
			return
		}
		m, err := decodeMessage(&raw)
		if err != nil {
			return
		}
		if m.Flow != nil && (m.Flow.Time.IsZero() || m.Flow.Proto == "") {
			t.Fatalf("accepted a flow a trace would refuse: %+v", m.Flow)
		}
	})
}
