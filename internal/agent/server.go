package agent

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/trace"
)

// DefaultHeartbeat is how often an idle stream gets a message without a
// flow: the client knows the agent is alive, and the merge moves on.
const DefaultHeartbeat = time.Second

// Server serves a pipeline's flows from a Hub over gRPC.
type Server struct {
	Hub *Hub
	// Header is the pipeline's trace header.
	Header trace.Header
	// LostEvents reads the pipeline's lost-event counter; nil for none.
	LostEvents func() uint64
	// Usage reads what the agent's process has cost its node (its CPU
	// time in ms, its resident size in KiB), sent with each heartbeat;
	// nil: not sent.
	Usage func() (cpuMillis int64, rssKiB uint64)
	// Audit audits the node as the pipeline holds it now; nil: the agent
	// does not audit.
	Audit func(context.Context) (audit.Report, error)
	// Heartbeat is the idle stream's message interval (DefaultHeartbeat
	// when 0).
	Heartbeat time.Duration
	// Now is the agent's clock (time.Now when nil).
	Now func() time.Time

	grpc   *grpc.Server
	health *health.Server
	// probes serves the health service alone, for kubelet's gRPC probes
	// on an address that must not serve flows (the node's, with
	// hostNetwork).
	probes  *grpc.Server
	summary atomic.Pointer[trace.Summary]
}

// Start registers the service and the health service; it serves nothing
// until Serve. The health service says SERVING for "" (alive) and for
// ServiceName (ready: the pipeline is attached and flows are served).
func (s *Server) Start() {
	s.grpc = grpc.NewServer()
	s.health = health.NewServer()
	s.grpc.RegisterService(&serviceDesc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.probes = grpc.NewServer()
	healthpb.RegisterHealthServer(s.probes, s.health)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// Serve answers connections on l until Stop.
func (s *Server) Serve(l net.Listener) error {
	if err := s.grpc.Serve(l); err != nil {
		return fmt.Errorf("serve %s: %w", l.Addr(), err)
	}
	return nil
}

// ServeProbes answers health checks alone on l until Stop.
func (s *Server) ServeProbes(l net.Listener) error {
	if err := s.probes.Serve(l); err != nil {
		return fmt.Errorf("serve health on %s: %w", l.Addr(), err)
	}
	return nil
}

// Finish ends every stream with the pipeline's summary, once each has
// sent what its buffer holds, and says the agent is no longer ready.
func (s *Server) Finish(sum trace.Summary) {
	s.summary.Store(&sum)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	s.Hub.Close()
}

// Stop waits up to grace for the streams to end, then closes them.
func (s *Server) Stop(grace time.Duration) {
	s.health.Shutdown()
	s.probes.Stop()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		s.grpc.Stop()
	}
}

func (s *Server) header(context.Context) (trace.Header, error) { return s.Header, nil }

func (s *Server) audit(ctx context.Context) (audit.Report, error) {
	if s.Audit == nil {
		return audit.Report{}, status.Error(codes.Unimplemented, "this agent does not audit")
	}
	r, err := s.Audit(ctx)
	if err != nil {
		return r, status.Errorf(codes.Internal, "audit: %v", err)
	}
	return r, nil
}

func (s *Server) flows(req *FlowsRequest, stream grpc.ServerStream) error {
	flt, err := filter.Parse(req.Filter)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "filter: %v", err)
	}
	if req.Buffer < 0 || req.Buffer > MaxBuffer {
		return status.Errorf(codes.InvalidArgument, "buffer %d: want 0 (the default, %d) to %d flows", req.Buffer, DefaultBuffer, MaxBuffer)
	}
	sub := s.Hub.Subscribe(flt, req.Buffer)
	defer sub.Close()
	beat := time.NewTicker(s.heartbeat())
	defer beat.Stop()
	var line []byte
	var enc trace.FlowEncoder
	for {
		msg := FlowsMessage{}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-beat.C:
			if s.Usage != nil {
				msg.TracerCPUMillis, msg.TracerRSSKiB = s.Usage()
			}
		case f, ok := <-sub.Flows():
			if !ok {
				return s.send(stream, sub, FlowsMessage{Summary: s.summary.Load()})
			}
			if line, err = enc.AppendFlow(line[:0], f); err != nil {
				return status.Errorf(codes.Internal, "encode flow: %v", err)
			}
			msg.Flow = line
		}
		if err := s.send(stream, sub, msg); err != nil {
			return err
		}
	}
}

func (s *Server) send(stream grpc.ServerStream, sub *Subscription, msg FlowsMessage) error {
	msg.Time = s.now()
	msg.Dropped = sub.Dropped()
	if s.LostEvents != nil {
		msg.LostEvents = s.LostEvents()
	}
	return stream.SendMsg(&msg)
}

func (s *Server) heartbeat() time.Duration {
	if s.Heartbeat > 0 {
		return s.Heartbeat
	}
	return DefaultHeartbeat
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}
