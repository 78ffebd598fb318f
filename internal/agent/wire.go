package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"

	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/trace"
)

// The agent's gRPC service carries the trace format itself (docs/
// trace-format.md) as JSON, not a second schema in protobuf: a flow on the
// wire is the line a trace file holds, checked on arrival as a file's
// line is (trace.ParseFlow). Health checks use the standard protobuf
// service beside it.
const (
	// ServiceName is the agent's gRPC service, also the health service
	// name whose status is the agent's readiness.
	ServiceName = "tracer.v1.Agent"
	codecName   = "tracer-json"
)

func init() { encoding.RegisterCodec(jsonCodec{}) }

type jsonCodec struct{}

func (jsonCodec) Name() string { return codecName }

func (jsonCodec) Marshal(v any) ([]byte, error) {
	if m, ok := v.(*FlowsMessage); ok {
		// The flow and room for the counters and the time.
		return m.appendJSON(make([]byte, 0, len(m.Flow)+128))
	}
	return json.Marshal(v)
}

func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// HeaderRequest asks for the agent's trace header: the node, its kernel,
// the hook plan and the node state warnings.
type HeaderRequest struct{}

// FlowsRequest opens a client's stream.
type FlowsRequest struct {
	// Filter is the filter language of --filter, applied in the agent.
	Filter string `json:"filter,omitempty"`
	// Buffer is how many flows the agent holds for this client while it
	// reads slower than they come: 0 for DefaultBuffer, at most MaxBuffer.
	Buffer int `json:"buffer,omitempty"`
}

// FlowsMessage is one message of a client's stream: a flow, or a
// heartbeat without one, and the counters as they stand.
type FlowsMessage struct {
	// Flow is one flow as a trace line writes it.
	Flow json.RawMessage `json:"flow,omitempty"`
	// Time is the agent's clock when it sent the message: a heartbeat
	// says the node had nothing older to send, and merging reads clock
	// skew from it.
	Time time.Time `json:"time"`
	// Dropped counts the flows this client's buffer had no room for.
	Dropped uint64 `json:"dropped"`
	// LostEvents counts the kernel events the agent's pipeline lost.
	LostEvents uint64 `json:"lost_events"`
	// TracerCPUMillis and TracerRSSKiB, in heartbeats, are what the
	// agent's process has cost its node: its CPU time so far and its
	// resident size now. Zero: not said (an older agent, a flow message).
	TracerCPUMillis int64  `json:"tracer_cpu_ms,omitempty"`
	TracerRSSKiB    uint64 `json:"tracer_rss_kib,omitempty"`
	// Summary, in the last message, is the pipeline's summary: the agent
	// stopped tracing.
	Summary *trace.Summary `json:"summary,omitempty"`
}

// appendJSON appends json.Marshal(m), byte for byte, without the pass
// encoding/json makes over a RawMessage to check and compact it: 6.5 to
// 9 µs for a message with a 900-byte flow against 1 µs
// (BenchmarkFlowsMessageMarshal), once per flow and client on the node.
// m.Flow is trace.FlowEncoder's line, compact and escaped as
// encoding/json escapes.
func (m *FlowsMessage) appendJSON(b []byte) ([]byte, error) {
	b = append(b, '{')
	if len(m.Flow) > 0 {
		b = append(b, `"flow":`...)
		b = append(b, m.Flow...)
		b = append(b, ',')
	}
	// Time's JSON is its text quoted; appended in place, not allocated.
	b, err := m.Time.AppendText(append(b, `"time":"`...))
	if err != nil {
		return nil, fmt.Errorf("encode flows message time: %w", err)
	}
	b = append(b, '"')
	b = strconv.AppendUint(append(b, `,"dropped":`...), m.Dropped, 10)
	b = strconv.AppendUint(append(b, `,"lost_events":`...), m.LostEvents, 10)
	if m.TracerCPUMillis != 0 {
		b = strconv.AppendInt(append(b, `,"tracer_cpu_ms":`...), m.TracerCPUMillis, 10)
	}
	if m.TracerRSSKiB != 0 {
		b = strconv.AppendUint(append(b, `,"tracer_rss_kib":`...), m.TracerRSSKiB, 10)
	}
	if m.Summary != nil {
		s, err := json.Marshal(m.Summary)
		if err != nil {
			return nil, fmt.Errorf("encode flows message summary: %w", err)
		}
		b = append(append(b, `,"summary":`...), s...)
	}
	return append(b, '}'), nil
}

// AuditRequest asks the agent to audit its node as it stands
// (tracer audit, on the state the pipeline holds).
type AuditRequest struct{}

// agentService is what the service description dispatches to.
type agentService interface {
	header(context.Context) (trace.Header, error)
	audit(context.Context) (audit.Report, error)
	flows(*FlowsRequest, grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*agentService)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Header",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			if err := dec(new(HeaderRequest)); err != nil {
				return nil, err
			}
			return srv.(agentService).header(ctx)
		},
	}, {
		MethodName: "Audit",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			if err := dec(new(AuditRequest)); err != nil {
				return nil, err
			}
			return srv.(agentService).audit(ctx)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Flows",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			req := new(FlowsRequest)
			if err := stream.RecvMsg(req); err != nil {
				return fmt.Errorf("read flows request: %w", err)
			}
			return srv.(agentService).flows(req, stream)
		},
	}},
	Metadata: "internal/agent/wire.go",
}

const (
	headerMethod = "/" + ServiceName + "/Header"
	auditMethod  = "/" + ServiceName + "/Audit"
	flowsMethod  = "/" + ServiceName + "/Flows"
)
