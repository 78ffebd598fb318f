package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/trace"
)

// serve starts a Server on a unix socket in a temporary directory.
func serve(t *testing.T, srv *Server) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	go srv.Serve(l)
	t.Cleanup(func() { srv.Stop(time.Second) })
	c, err := Dial("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestServeHeaderFlowsAndSummary(t *testing.T) {
	h := NewHub()
	srv := &Server{Hub: h, Header: trace.Header{Type: trace.TypeHeader, Schema: "tracer/v1", Node: "node-a"},
		LostEvents: func() uint64 { return 7 }, Heartbeat: 50 * time.Millisecond}
	c := serve(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr, err := c.Header(ctx)
	if err != nil || hdr.Node != "node-a" {
		t.Fatalf("header %+v, %v", hdr, err)
	}
	s, err := c.Flows(ctx, FlowsRequest{Filter: "port:80"})
	if err != nil {
		t.Fatal(err)
	}
	// The first heartbeat says the stream is open (subscribed) before
	// anything is published.
	if m, err := s.Recv(); err != nil || m.Flow != nil || m.Time.IsZero() {
		t.Fatalf("first message %+v, %v: want a heartbeat", m, err)
	}
	want := testFlow("10.0.0.1:40000", "10.96.0.1:80", t0)
	want.Rule = &trace.Rule{Table: "nat", Chain: "KUBE-SEP-X", Text: "-A KUBE-SEP-X -j DNAT"}
	h.Publish(testFlow("10.0.0.1:40001", "10.96.0.1:443", t0)) // filtered out in the agent
	h.Publish(want)
	srv.Finish(trace.Summary{Type: trace.TypeSummary, Flows: 2})
	flows, last := readAll(t, s)
	if len(flows) != 1 || flows[0].Orig != want.Orig || flows[0].Rule.Text != want.Rule.Text || !flows[0].Time.Equal(want.Time) {
		t.Fatalf("got flows %+v, want only %+v", flows, want)
	}
	if last.Summary == nil || last.Summary.Flows != 2 || last.LostEvents != 7 {
		t.Errorf("last message %+v: want the summary and the lost counter", last)
	}
}

// A client that stops reading has its flows dropped and counted; the
// count reaches it once it reads again.
func TestServeCountsDropsForSlowClient(t *testing.T) {
	h := NewHub()
	srv := &Server{Hub: h, Heartbeat: time.Hour}
	c := serve(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Flows(ctx, FlowsRequest{Buffer: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return h.Subscribers() == 1 })
	// Flows big enough that gRPC's flow-control window (64 KiB) and
	// the socket fill long before 2,000 of them are sent.
	f := testFlow("10.0.0.1:40000", "10.96.0.1:80", t0)
	f.Explanation = strings.Repeat("x", 4096)
	for range 2000 {
		h.Publish(f)
	}
	srv.Finish(trace.Summary{Type: trace.TypeSummary})
	flows, last := readAll(t, s)
	got := len(flows)
	if got == 2000 || uint64(got)+last.Dropped != 2000 {
		t.Errorf("received %d flows, %d dropped: want drops, and the two to add up to 2000", got, last.Dropped)
	}
	t.Logf("received %d, dropped %d", got, last.Dropped)
}

func TestServeRejectsBadRequests(t *testing.T) {
	c := serve(t, &Server{Hub: NewHub()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, req := range []FlowsRequest{{Filter: "port:notaport"}, {Buffer: -1}, {Buffer: MaxBuffer + 1}} {
		s, err := c.Flows(ctx, req)
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(errors.Unwrap(err)) != codes.InvalidArgument {
			t.Errorf("request %+v: %v, want InvalidArgument", req, err)
		}
	}
}

// Health: alive and ready while serving, not ready once finished.
func TestServeHealth(t *testing.T) {
	srv := &Server{Hub: NewHub()}
	c := serve(t, srv)
	hc := healthpb.NewHealthClient(c.cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	check := func(service string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil || r.Status != want {
			t.Errorf("health %q: %v %v, want %v", service, r.GetStatus(), err, want)
		}
	}
	check("", healthpb.HealthCheckResponse_SERVING)
	check(ServiceName, healthpb.HealthCheckResponse_SERVING)

	// The probe listener answers health and nothing else.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeProbes(l)
	probe, err := Dial(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if r, err := healthpb.NewHealthClient(probe.cc).Check(ctx, &healthpb.HealthCheckRequest{Service: ServiceName}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("probe listener: %v %v", r.GetStatus(), err)
	}
	if _, err := probe.Header(ctx); status.Code(errors.Unwrap(err)) != codes.Unimplemented {
		t.Errorf("the probe listener serves the agent's header: %v", err)
	}

	srv.Finish(trace.Summary{})
	check(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
	}
}

// readAll reads s to its end: the flows, and the last message.
func readAll(t *testing.T, s *Stream) (flows []*trace.Flow, last Message) {
	t.Helper()
	for {
		m, err := s.Recv()
		if err == io.EOF {
			return flows, last
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Flow != nil {
			flows = append(flows, m.Flow)
		}
		last = m
	}
}

// A stream that goes quiet (an agent whose heartbeats stopped, a
// port-forward whose far end died) ends with that said, not a hang.
func TestStreamEndsWhenSilent(t *testing.T) {
	c := serve(t, &Server{Hub: NewHub(), Heartbeat: time.Hour})
	c.Silence = 300 * time.Millisecond
	s, err := c.Flows(context.Background(), FlowsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	_, err = s.Recv()
	if err == nil || !strings.Contains(err.Error(), "the agent, or the way to it, is gone") || time.Since(start) > 5*time.Second {
		t.Errorf("after %s: %v, want the silence said", time.Since(start), err)
	}
}

// The agent audits its node on request; one that does not says so.
func TestServeAudit(t *testing.T) {
	want := audit.Report{Node: "node-a", Walked: 12, Findings: []audit.Finding{{Severity: audit.Problem, Verdict: "hostport-hijack", Proto: "tcp", To: "10.96.0.20:3306"}}}
	c := serve(t, &Server{Hub: NewHub(), Audit: func(context.Context) (audit.Report, error) { return want, nil }})
	got, err := c.Audit(context.Background())
	if err != nil || got.Node != want.Node || got.Walked != 12 || len(got.Findings) != 1 || got.Findings[0].To != "10.96.0.20:3306" {
		t.Errorf("audit %+v, %v", got, err)
	}
	none := serve(t, &Server{Hub: NewHub()})
	if _, err := none.Audit(context.Background()); status.Code(errors.Unwrap(err)) != codes.Unimplemented {
		t.Errorf("an agent without an audit: %v, want Unimplemented", err)
	}
}
