package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/trace"
)

// maxHeaderBytes bounds the header a client accepts: the node state
// snapshot of a node with thousands of Services is megabytes of rules.
const maxHeaderBytes = 256 << 20

// Client is a connection to one agent.
type Client struct {
	Target string
	// Silence bounds a header call, and a stream's time without a
	// message (DefaultSilence when 0).
	Silence time.Duration
	cc      *grpc.ClientConn
}

func (c *Client) silence() time.Duration {
	if c.Silence > 0 {
		return c.Silence
	}
	return DefaultSilence
}

// Dial prepares a connection to the agent at target: HOST:PORT, or
// unix:PATH for its unix socket. Nothing is sent until the first call.
// The connection is plaintext: the agent listens on loopback and a unix
// socket, and remote clients reach it through the API server's
// port-forward, which authenticates and encrypts.
func Dial(target string) (*Client, error) {
	if target == "" {
		return nil, errors.New("dial agent: empty address")
	}
	addr := target
	if path, ok := strings.CutPrefix(target, "unix:"); ok {
		addr = "unix://" + strings.TrimPrefix(path, "//")
	} else {
		addr = "passthrough:///" + target
	}
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxHeaderBytes)))
	if err != nil {
		return nil, fmt.Errorf("dial agent %s: %w", target, err)
	}
	return &Client{Target: target, cc: cc}, nil
}

// inJSON picks the agent service's codec for a call; the health service
// on the same connection speaks protobuf.
var inJSON = grpc.CallContentSubtype(codecName)

// Close closes the connection.
func (c *Client) Close() error { return c.cc.Close() }

// Header asks the agent for its trace header, waiting Silence at most.
func (c *Client) Header(ctx context.Context) (trace.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, c.silence())
	defer cancel()
	var h trace.Header
	if err := c.cc.Invoke(ctx, headerMethod, &HeaderRequest{}, &h, inJSON); err != nil {
		return h, fmt.Errorf("agent %s: %w", c.Target, plain(err))
	}
	if h.Type != trace.TypeHeader {
		return h, fmt.Errorf("agent %s: header: type %q, want %q", c.Target, h.Type, trace.TypeHeader)
	}
	return h, nil
}

// Audit asks the agent to audit its node as it stands now, waiting
// Silence at most.
func (c *Client) Audit(ctx context.Context) (audit.Report, error) {
	ctx, cancel := context.WithTimeout(ctx, c.silence())
	defer cancel()
	var r audit.Report
	if err := c.cc.Invoke(ctx, auditMethod, &AuditRequest{}, &r, inJSON); err != nil {
		return r, fmt.Errorf("agent %s: audit: %w", c.Target, plain(err))
	}
	return r, nil
}

// Message is one message of a stream, its flow parsed and checked.
type Message struct {
	Flow       *trace.Flow // nil for a heartbeat or the last message
	Time       time.Time   // the agent's clock when it sent the message
	Dropped    uint64
	LostEvents uint64
	// TracerCPUMillis and TracerRSSKiB are the agent's cost, in a
	// heartbeat; zero when the message does not say.
	TracerCPUMillis int64
	TracerRSSKiB    uint64
	Summary         *trace.Summary // set in the last message
}

// DefaultSilence is how long a stream may go without a message before it
// is taken for broken: the agent sends one at least every
// DefaultHeartbeat, and a way to it that died (a port-forward whose far
// end went away) can leave the connection open with nothing coming.
const DefaultSilence = 10 * DefaultHeartbeat

// errSilent ends a stream that went quiet for its client's Silence.
var errSilent = fmt.Errorf("the agent, or the way to it, is gone: no message came for longer than %d heartbeats", DefaultSilence/DefaultHeartbeat)

// Stream is a client's stream of flows from one agent.
type Stream struct {
	target   string
	s        grpc.ClientStream
	ctx      context.Context
	cancel   context.CancelCauseFunc
	silence  time.Duration
	watchdog *time.Timer
}

// Flows opens a stream of the agent's flows; ctx ends it, and so does
// Silence without a message.
func (c *Client) Flows(ctx context.Context, req FlowsRequest) (*Stream, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	st, err := c.openFlows(ctx, req)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	st.ctx, st.cancel, st.silence = ctx, cancel, c.silence()
	st.watchdog = time.AfterFunc(st.silence, func() { cancel(errSilent) })
	return st, nil
}

// Close ends the stream.
func (s *Stream) Close() {
	s.watchdog.Stop()
	s.cancel(nil)
}

func (c *Client) openFlows(ctx context.Context, req FlowsRequest) (*Stream, error) {
	s, err := c.cc.NewStream(ctx, &serviceDesc.Streams[0], flowsMethod, inJSON)
	if err == nil {
		err = s.SendMsg(&req)
	}
	if err == nil {
		err = s.CloseSend()
	}
	if err != nil {
		return nil, fmt.Errorf("agent %s: open flows: %w", c.Target, plain(err))
	}
	return &Stream{target: c.Target, s: s}, nil
}

// Recv returns the next message; io.EOF once the agent ended the stream
// after its last message.
func (s *Stream) Recv() (Message, error) {
	var raw FlowsMessage
	if err := s.s.RecvMsg(&raw); err != nil {
		if err == io.EOF {
			return Message{}, io.EOF
		}
		if cause := context.Cause(s.ctx); errors.Is(cause, errSilent) {
			err = cause
		}
		return Message{}, fmt.Errorf("agent %s: %w", s.target, plain(err))
	}
	s.watchdog.Reset(s.silence)
	m, err := decodeMessage(&raw)
	if err != nil {
		return Message{}, fmt.Errorf("agent %s: %w", s.target, err)
	}
	return m, nil
}

// decodeMessage checks a message as it came off the wire.
func decodeMessage(raw *FlowsMessage) (Message, error) {
	m := Message{Time: raw.Time, Dropped: raw.Dropped, LostEvents: raw.LostEvents, Summary: raw.Summary,
		TracerCPUMillis: raw.TracerCPUMillis, TracerRSSKiB: raw.TracerRSSKiB}
	if len(raw.Flow) > 0 {
		f, err := trace.ParseFlow(raw.Flow)
		if err != nil {
			return Message{}, err
		}
		m.Flow = f
	}
	return m, nil
}

// plain says a gRPC failure in the words of what happened: the transport's
// nesting ("rpc error: code = Unavailable desc = connection error: desc =
// ...") reduced to its cause. The status stays reachable with errors.As.
func plain(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unavailable:
		if i := strings.LastIndex(msg, "dial "); i >= 0 {
			return &statusError{"unreachable: " + strings.TrimSuffix(msg[i:], `"`), err}
		}
		return &statusError{"the agent went away: " + msg, err}
	case codes.InvalidArgument:
		return &statusError{"refused the request: " + msg, err}
	case codes.Canceled, codes.DeadlineExceeded:
		return err
	}
	return &statusError{st.Code().String() + ": " + msg, err}
}

type statusError struct {
	msg string
	err error
}

func (e *statusError) Error() string { return e.msg }
func (e *statusError) Unwrap() error { return e.err }
