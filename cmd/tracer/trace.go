package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/trace"
)

func init() {
	commands["trace"] = command{
		summary: "stream explained flows to stdout (-o json: NDJSON; --events: the raw kernel events)",
		run:     runTrace,
	}
}

// traceOptions are the flags `tracer trace` and `tracer ui` share.
type traceOptions struct {
	output     string
	filter     string
	netns      string
	allNetns   bool
	duration   time.Duration
	readyFile  string
	only       string
	record     string
	events     bool
	kubeconfig string
	metadata   string
	node       string
	linger     time.Duration
	ringBuffer string
}

func (o *traceOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.filter, "filter", "", "filter `EXPR`: pod:NS/NAME, ns:NS, port:N, ip:ADDR|CIDR, verdict:ID, proto:P, node:NAME (agents, connect), words; terms AND, !term negates")
	fs.StringVar(&o.netns, "netns", "", "observe the network namespace at `PATH` (e.g. /run/netns/NAME) instead of the caller's")
	fs.BoolVar(&o.allNetns, "all-netns", false, "report kernel decisions from every network namespace")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (e.g. 30s); 0 runs until interrupted")
	fs.StringVar(&o.readyFile, "ready-file", "", "create `PATH` once every hook that can attach is attached")
	fs.StringVar(&o.only, "only", "", "use only these attach methods, comma-separated (fentry,kprobe,tracepoint,netfilter)")
	fs.StringVar(&o.record, "record", "", "also write the whole trace (header, flows, summary) to `FILE`")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "pod and Service metadata from the cluster of this kubeconfig (in a pod: the in-cluster config)")
	fs.StringVar(&o.metadata, "metadata", "", "pod and Service metadata from `FILE`: kubectl get pods,services,endpointslices -A -o json")
	fs.StringVar(&o.node, "node", "", "this node's name (default: the hostname)")
	fs.DurationVar(&o.linger, "linger", join.DefaultLinger, "how long a flow waits for more of its events before it is diagnosed")
	fs.StringVar(&o.ringBuffer, "ring-buffer", defaultRingBuffer, "the kernel's buffer for the tracer's records takes `SIZE` (a power of two, 64KiB to 1GiB; about 208 bytes a record); beyond it events are lost, and counted")
}

// defaultRingBuffer is loader.DefaultRingBuffer as the flag spells it.
const defaultRingBuffer = "16MiB"

// ringBufferSize validates --ring-buffer.
func (o *traceOptions) ringBufferSize() (int, error) {
	n, err := parseSize(o.ringBuffer)
	if err == nil {
		err = loader.CheckRingBuffer(n)
	}
	if err != nil {
		return 0, usagef("--ring-buffer %q: %v", o.ringBuffer, err)
	}
	return int(n), nil
}

func runTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o traceOptions
	fs := newFlagSet("trace", stderr)
	fs.StringVar(&o.output, "o", "text", "output format: text or json (NDJSON)")
	fs.BoolVar(&o.events, "events", false, "stream the raw kernel events instead of joined flows")
	o.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.output != "text" && o.output != "json" {
		return usagef("-o %q: want text or json", o.output)
	}
	p, flt, err := o.start(ctx, "trace", stderr)
	if err != nil {
		return err
	}
	defer p.Close()
	return streamFlows(ctx, p, o, flt.OnNode(p.Header().Node), stdout, stderr)
}

// start validates the flags, checks privileges and attaches the pipeline.
func (o *traceOptions) start(ctx context.Context, command string, stderr io.Writer, checks ...func() error) (*live.Pipeline, filter.Filter, error) {
	cfg, flt, err := o.pipelineConfig(ctx, stderr)
	if err != nil {
		return nil, flt, err
	}
	// What the command needs beyond its flags (the UI: a terminal) is
	// checked once the flags are known good, before anything attaches.
	for _, check := range checks {
		if err := check(); err != nil {
			return nil, flt, err
		}
	}
	cfg.Command = command
	// trace writes each flow and the UI's store copies it; the agent's
	// hub queues flows for its clients, so it keeps them.
	cfg.FlowsNotKept = command == "trace" || command == "ui"
	if command == "trace" {
		// The UI owns the terminal; it finds the changes in its summary.
		cfg.OnHookChange = func(c trace.HookChange) {
			fmt.Fprintf(stderr, "tracer: %s hook %s: %s\n", c.Time.Local().Format(time.TimeOnly), c.Hook, c.Why)
		}
	}
	if err := preflight(o.needs()); err != nil {
		return nil, flt, err
	}
	p, err := live.Start(ctx, cfg)
	if errors.Is(err, loader.ErrNoPrivilege) {
		return nil, flt, usageError{err}
	}
	return p, flt, err
}

// needs: --netns reads another namespace's rules and conntrack and
// attaches netfilter programs there, all through setns.
func (o *traceOptions) needs() loader.Needs {
	if o.netns == "" {
		return loader.Needs{}
	}
	return loader.Needs{
		SysAdmin: "--netns enters the namespace (setns) to attach netfilter programs there and read its rules and conntrack",
		SysAdminFix: "run as root, or run the tracer inside that namespace without --netns: nsenter --net=" + o.netns +
			" setpriv --reuid=USER --init-groups --inh-caps=" + loader.LeastCaps + " --ambient-caps=" + loader.LeastCaps + " tracer trace ...",
	}
}

// pipelineConfig validates the flags into the pipeline's configuration.
func (o *traceOptions) pipelineConfig(ctx context.Context, stderr io.Writer) (live.Config, filter.Filter, error) {
	var cfg live.Config
	if o.duration < 0 {
		return cfg, filter.Filter{}, usagef("--duration %s: must not be negative", o.duration)
	}
	if o.linger < 0 {
		return cfg, filter.Filter{}, usagef("--linger %s: must not be negative", o.linger)
	}
	// A recording that cannot be written is found before anything attaches.
	if err := probeRecord(o.record); err != nil {
		return cfg, filter.Filter{}, err
	}
	if o.netns != "" && o.allNetns {
		return cfg, filter.Filter{}, usagef("--netns and --all-netns exclude each other")
	}
	if o.kubeconfig != "" && o.metadata != "" {
		return cfg, filter.Filter{}, usagef("--kubeconfig and --metadata exclude each other")
	}
	vias, err := parseVias(o.only)
	if err != nil {
		return cfg, filter.Filter{}, err
	}
	flt, err := parseFilter(o.filter)
	if err != nil {
		return cfg, filter.Filter{}, err
	}
	if cfg.Loader.RingBuffer, err = o.ringBufferSize(); err != nil {
		return cfg, flt, err
	}
	cfg.Loader.Only = vias
	applyKernelFilter(&cfg.Loader, flt)
	if !o.allNetns {
		path := o.netns
		if path == "" {
			path = "/proc/self/ns/net"
		} else {
			cfg.Loader.NetnsPaths = []string{path}
			cfg.NetnsPath = path
		}
		ino, err := netnsInode(path)
		if err != nil {
			return cfg, flt, usagef("--netns %s: %v", path, err)
		}
		cfg.Loader.Netns = []uint32{ino}
	}
	cfg.NodeName = o.node
	if cfg.NodeName == "" {
		cfg.NodeName = hostname()
	}
	cfg.Linger = o.linger
	cfg.Filter = o.filter
	if err := attachMetadata(ctx, &cfg, o.kubeconfig, o.metadata, stderr); err != nil {
		return cfg, flt, err
	}
	return cfg, flt, nil
}

// netnsInode identifies a network namespace by its nsfs inode, as the
// kernel's net->ns.inum does.
func netnsInode(path string) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("not a network namespace: %w", err)
	}
	var fst unix.Statfs_t
	if err := unix.Statfs(path, &fst); err != nil {
		return 0, fmt.Errorf("not a network namespace: %w", err)
	}
	if fst.Type != unix.NSFS_MAGIC && fst.Type != unix.PROC_SUPER_MAGIC {
		return 0, errors.New("not a network namespace (not on nsfs)")
	}
	return uint32(st.Ino), nil
}

// streamFlows writes the header, every flow (or event) that passes the
// filter, and on the way out the summary with the lost counters, so the
// output and the recording are complete after SIGINT or --duration.
func streamFlows(ctx context.Context, p *live.Pipeline, o traceOptions, flt filter.Filter, stdout, stderr io.Writer) error {
	hdr := p.Header()
	for _, w := range hdr.Warnings {
		fmt.Fprintf(stderr, "tracer: warning: %s\n", w)
	}
	out, err := newOutput(o, hdr, stdout)
	if err != nil {
		return err
	}
	if o.readyFile != "" {
		if err := os.WriteFile(o.readyFile, []byte("ready\n"), 0o644); err != nil {
			out.abort()
			return fmt.Errorf("write ready file: %w", err)
		}
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	// A failed write (a full disk, a closed pipe) ends the trace at once:
	// tracing on would drop what the user believes is being kept.
	ctx, out.stop = context.WithCancel(ctx)
	defer out.stop()
	var writeErr error
	emit := func(f *trace.Flow) {
		if writeErr == nil && (flt.Empty() || flt.Match(f)) {
			if writeErr = out.flow(f); writeErr != nil {
				out.stop()
			}
		}
	}
	var onEvent func(event.Event)
	if o.events {
		emit = func(*trace.Flow) {}
		onEvent = func(ev event.Event) {
			e := trace.EventOf(ev, p.Names())
			if writeErr == nil && (flt.Empty() || flt.Match(eventFlow(&e))) {
				if writeErr = out.event(&e); writeErr != nil {
					out.stop()
				}
			}
		}
	}
	p.RecordStates(out.state)
	sum, err := p.Run(ctx, live.Sink{Flow: emit, Event: onEvent, Flush: out.flushing(&writeErr)})
	p.RecordStates(nil)
	return errors.Join(err, writeErr, out.close(sum))
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// output writes the stream to stdout (text or NDJSON) and, with --record,
// the whole trace to a file. It holds the lines of a burst of flows until
// the pipeline ends the burst (flush): one write for each instead of one
// a flow (trace.Writer's Batch).
type output struct {
	text       *bufio.Writer
	json       *trace.Writer
	record     *trace.Writer
	recordPath string
	// mu keeps a state change's text line, written from the node
	// watcher, whole among the flows'; stateErr is its first write error.
	mu       sync.Mutex
	stateErr error
	// stop ends the trace after a failed write.
	stop context.CancelFunc
}

func newOutput(o traceOptions, h trace.Header, stdout io.Writer) (*output, error) {
	out := &output{}
	var err error
	if o.output == "json" {
		if out.json, err = trace.NewWriter(stdout, h); err != nil {
			return nil, fmt.Errorf("write header: %w", err)
		}
		out.json.Batch()
	} else {
		fmt.Fprintln(stdout, textHeader(h))
		out.text = bufio.NewWriterSize(stdout, 64<<10)
	}
	if o.record != "" {
		if out.record, err = trace.Create(o.record, h); err != nil {
			return nil, usagef("--record %s: %v", o.record, err)
		}
		out.record.Batch()
		out.recordPath = o.record
	}
	return out, nil
}

// flushing is the pipeline's Sink.Flush for o: it writes what the stream
// and the recording hold, unless a write failed before; the first
// failure is kept in writeErr and ends the trace.
func (o *output) flushing(writeErr *error) func() {
	return func() {
		if *writeErr != nil {
			return
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		if *writeErr = errors.Join(o.flushText(), o.each((*trace.Writer).Flush)); *writeErr != nil {
			o.stop()
		}
	}
}

// flushText writes the text stream's held lines.
func (o *output) flushText() error {
	if o.text == nil {
		return nil
	}
	if err := o.text.Flush(); err != nil {
		return fmt.Errorf("stdout: %w", err)
	}
	return nil
}

// each writes to the JSON stream and the recording, naming the one that
// failed.
func (o *output) each(fn func(w *trace.Writer) error) error {
	var errs []error
	if o.json != nil {
		if err := fn(o.json); err != nil {
			errs = append(errs, fmt.Errorf("stdout: %w", err))
		}
	}
	if o.record != nil {
		if err := fn(o.record); err != nil {
			errs = append(errs, fmt.Errorf("--record %s (what was written before stays readable: tracer replay %s): %w", o.recordPath, o.recordPath, err))
		}
	}
	return errors.Join(errs...)
}

func (o *output) flow(f *trace.Flow) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.text != nil {
		if _, err := fmt.Fprintln(o.text, flowLine(f)); err != nil {
			return err
		}
	}
	return o.each(func(w *trace.Writer) error { return w.WriteFlow(f) })
}

func (o *output) event(e *trace.Event) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.text != nil {
		if _, err := fmt.Fprintln(o.text, eventLine(*e)); err != nil {
			return err
		}
	}
	return o.each(func(w *trace.Writer) error { return w.WriteEvent(e) })
}

// state writes a change of the node's state: a comment line in text, a
// state line in the trace.
func (o *output) state(c *trace.StateChange) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stateErr != nil {
		return
	}
	if o.text != nil {
		_, o.stateErr = fmt.Fprintf(o.text, "# %s %s\n", c.Time.Local().Format("15:04:05.000"), describeState(c))
	}
	if err := o.each(func(w *trace.Writer) error { return w.WriteState(c) }); err != nil && o.stateErr == nil {
		o.stateErr = err
	}
	if o.stateErr != nil && o.stop != nil {
		o.stop()
	}
}

func (o *output) close(sum trace.Summary) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return errors.Join(o.stateErr, o.closeWriters(sum))
}

func (o *output) closeWriters(sum trace.Summary) error {
	if o.text != nil {
		fmt.Fprintf(o.text, "# %d flows, %d events, %d lost\n", sum.Flows, sum.Events, sum.LostEvents)
		if sum.ConntrackDrops > 0 {
			fmt.Fprintf(o.text, "# conntrack itself dropped %d packets (its table full or insert clashes lost: conntrack -S)\n", sum.ConntrackDrops)
		}
	}
	return errors.Join(o.flushText(), o.each(func(w *trace.Writer) error {
		w.SetLoss(sum)
		return w.Close()
	}))
}

func (o *output) abort() {
	if o.record != nil {
		o.record.Abort()
	}
}

func textHeader(h trace.Header) string {
	var parts []string
	for _, hk := range h.Hooks {
		parts = append(parts, hk.Hook+"="+hk.Via)
	}
	return fmt.Sprintf("# tracer on %s, kernel %s; hooks: %s", h.Node, h.Kernel, strings.Join(parts, " "))
}

// flowLine is the text form of a flow: time, proto, the tuple and where it
// went, the verdict, and the explanation.
func flowLine(f *trace.Flow) string {
	went := ""
	if f.Reply != nil && f.Reply.Src != f.Orig.Dst {
		went = " => " + f.Reply.Src
	}
	return fmt.Sprintf("%s %-6s %s -> %s%s  [%s] %s", f.Time.Local().Format("15:04:05.000"), f.Proto,
		f.Orig.Src, f.Orig.Dst, went, f.Verdict, f.Explanation)
}

// eventLine is the text form of a raw event.
func eventLine(r trace.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-12s %-6s", r.Time.Local().Format("15:04:05.000000"), r.Kind, r.Proto)
	// NAT and IPVS read best from the connection as the client made it.
	t := r.Orig
	if t == nil || r.Packet != nil && r.To == "" {
		t = r.Packet
	}
	if t != nil {
		fmt.Fprintf(&b, " %s -> %s", t.Src, t.Dst)
	}
	if r.To != "" {
		fmt.Fprintf(&b, " => %s", r.To)
	}
	if r.Reason != "" {
		fmt.Fprintf(&b, " (%s)", r.Reason)
	}
	fmt.Fprintf(&b, "  [%s via %s", r.Hook, r.Via)
	if r.NFHook != "" {
		fmt.Fprintf(&b, " at %s", r.NFHook)
	}
	b.WriteString("]")
	return b.String()
}

// describeState says in a text line what a state line records.
func describeState(c *trace.StateChange) string {
	var node, said []string
	for _, part := range c.Changed {
		switch part {
		case trace.PartMetadata:
			m := c.Metadata
			said = append(said, fmt.Sprintf("metadata changed: pods %d new or changed, %d gone; services %d new or changed, %d gone",
				len(m.Pods), len(m.PodsGone), len(m.Services), len(m.ServicesGone)))
		case trace.PartWarnings:
			if len(c.Warnings) == 0 {
				said = append(said, "node state fully readable again")
			}
			for _, w := range c.Warnings {
				said = append(said, "warning: "+w)
			}
		default:
			node = append(node, part)
		}
	}
	if len(node) > 0 {
		said = append([]string{"node state changed: " + strings.Join(node, " ")}, said...)
	}
	return strings.Join(said, "; ")
}
