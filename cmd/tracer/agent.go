package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/agent"
	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/trace"
)

func init() {
	commands["agent"] = command{
		summary: "serve this node's flows to tracer connect (gRPC on loopback and a unix socket)",
		run:     runAgent,
	}
}

// defaultAgentListen is loopback: a hostNetwork agent on 0.0.0.0 would
// hand every flow of the node to anyone who can reach it. Remote clients
// come through the API server's port-forward, which reaches loopback.
const defaultAgentListen = "127.0.0.1:4245"

type agentOptions struct {
	trace  traceOptions
	listen string
	socket string
	health string
}

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o agentOptions
	fs := newFlagSet("agent", stderr)
	o.trace.register(fs)
	fs.StringVar(&o.listen, "listen", defaultAgentListen, "serve gRPC on TCP `HOST:PORT` (\"\" for none)")
	fs.StringVar(&o.socket, "socket", "", "also serve gRPC on a unix socket at `PATH`")
	fs.StringVar(&o.health, "health", "", "serve the gRPC health service alone on `HOST:PORT`, for kubelet's probes (a hostNetwork pod is probed on the node's address, where flows must not be served)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.listen == "" && o.socket == "" {
		return usagef("--listen and --socket both empty: the agent would serve no one")
	}
	// The addresses are taken once the flags are known good and before
	// anything attaches: a port in use is found with nothing to undo.
	var lns []net.Listener
	var probes net.Listener
	defer func() { closeAll(append(lns, probes)) }()
	p, flt, err := o.trace.start(ctx, "agent", stderr, func() (err error) {
		if lns, err = o.listeners(); err != nil {
			return err
		}
		probes, err = listenTCP("--health", o.health)
		return err
	})
	if err != nil {
		return err
	}
	defer p.Close()
	rec, err := agentRecording(o.trace.record, p.Header())
	if err != nil {
		return err
	}
	ctx, rec.stop = context.WithCancel(ctx)
	defer rec.stop()
	hub := agent.NewHub()
	srv := &agent.Server{Hub: hub, Header: p.Header(), LostEvents: func() uint64 { return p.Stats().Lost }, Usage: agentUsage,
		Audit: func(context.Context) (audit.Report, error) { return auditState(p.Header().Node, p.State()) }}
	srv.Start()
	failed := make(chan error, len(lns)+1)
	serve := func(fn func(net.Listener) error, l net.Listener) {
		// A listener that fails ends the agent: it would be alive and
		// serve no one.
		if err := fn(l); err != nil {
			failed <- err
			rec.stop()
		}
	}
	for _, l := range lns {
		go serve(srv.Serve, l)
	}
	if probes != nil {
		go serve(srv.ServeProbes, probes)
	}
	fmt.Fprintf(stderr, "tracer: agent of node %s serving on %s\n", p.Header().Node, listenerNames(lns))
	if o.trace.readyFile != "" {
		if err := os.WriteFile(o.trace.readyFile, []byte("ready\n"), 0o644); err != nil {
			srv.Stop(0)
			rec.abort()
			return fmt.Errorf("write ready file: %w", err)
		}
	}
	var writeErr error
	emit := func(f *trace.Flow) {
		// Each flow names its node, so a client's node: term matches
		// in the agent.
		f.Node = p.Header().Node
		if !flt.Empty() && !flt.Match(f) {
			return
		}
		hub.Publish(f)
		if writeErr == nil && rec.record != nil {
			if writeErr = rec.flow(f); writeErr != nil {
				rec.stop()
			}
		}
	}
	p.RecordStates(rec.state)
	sum, runErr := p.Run(ctx, live.Sink{Flow: emit, Flush: rec.flushing(&writeErr)})
	p.RecordStates(nil)
	for len(failed) > 0 {
		runErr = errors.Join(runErr, <-failed)
	}
	// The clients get what their buffers hold and the summary; they have
	// a moment to read it before the connections close.
	srv.Finish(sum)
	srv.Stop(2 * time.Second)
	return errors.Join(runErr, writeErr, rec.close(sum))
}

// listeners opens the TCP address and the unix socket.
func (o agentOptions) listeners() ([]net.Listener, error) {
	var lns []net.Listener
	if o.listen != "" {
		l, err := listenTCP("--listen", o.listen)
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
	}
	if o.socket != "" {
		l, err := listenUnix(o.socket)
		if err != nil {
			closeAll(lns)
			return nil, err
		}
		lns = append(lns, l)
	}
	return lns, nil
}

// listenTCP opens addr for flag; nil for "".
func listenTCP(flag, addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, usagef("%s %q: %v", flag, addr, err)
	}
	l, err := net.ListenTCP("tcp", a)
	if err != nil {
		return nil, usagef("%s: %v", flag, err)
	}
	return l, nil
}

// listenUnix serves on a unix socket only its owner may use: the flows
// of a node are its traffic. A socket left by an agent that died is
// replaced; any other file is not.
func listenUnix(path string) (net.Listener, error) {
	if strings.ContainsRune(path, 0) || strings.HasPrefix(path, "@") {
		return nil, usagef("--socket %q: want a file path (abstract sockets have no permissions)", path)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, usagef("--socket %s: exists and is not a socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, usagef("--socket %s: another agent serves on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--socket %s: remove the stale socket: %w", path, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, usagef("--socket: %v", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, usagef("--socket %s: %v", path, err)
	}
	return l, nil
}

func closeAll(lns []net.Listener) {
	for _, l := range lns {
		if l != nil {
			l.Close()
		}
	}
}

func listenerNames(lns []net.Listener) string {
	var names []string
	for _, l := range lns {
		a := l.Addr()
		if a.Network() == "unix" {
			names = append(names, "unix:"+a.String())
		} else {
			names = append(names, a.String())
		}
	}
	return strings.Join(names, " and ")
}

// agentRecording is the agent's --record: the trace a `tracer trace`
// would record, and nothing on stdout.
func agentRecording(path string, h trace.Header) (*output, error) {
	out := &output{stop: func() {}}
	if path == "" {
		return out, nil
	}
	w, err := trace.Create(path, h)
	if err != nil {
		return nil, usagef("--record %s: %v", path, err)
	}
	w.Batch()
	out.record, out.recordPath = w, path
	return out, nil
}

// agentUsage is what the agent's process has cost its node, for its
// heartbeats: CPU time in ms, resident size in KiB.
func agentUsage() (cpuMillis int64, rssKiB uint64) {
	u := live.ReadSelfUsage()
	return u.CPU.Milliseconds(), u.RSS >> 10
}
