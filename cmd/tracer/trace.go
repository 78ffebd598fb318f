package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/trace"
)

func init() {
	commands["trace"] = command{
		summary: "stream the kernel's decisions to stdout (-o json: NDJSON)",
		run:     runTrace,
	}
}

// traceOptions are the flags of `tracer trace`.
type traceOptions struct {
	output    string
	filter    string
	netns     string
	allNetns  bool
	duration  time.Duration
	readyFile string
	only      string
}

func runTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o traceOptions
	fs := newFlagSet("trace", stderr)
	fs.StringVar(&o.output, "o", "text", "output format: text or json (NDJSON)")
	fs.StringVar(&o.filter, "filter", "", "filter expression (port:N, ip:ADDR|CIDR, proto:P, ...)")
	fs.StringVar(&o.netns, "netns", "", "observe this network namespace (a path like /run/netns/NAME) instead of the caller's")
	fs.BoolVar(&o.allNetns, "all-netns", false, "report decisions in every network namespace")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (e.g. 30s); 0 runs until interrupted")
	fs.StringVar(&o.readyFile, "ready-file", "", "create this file once every hook that can attach is attached")
	fs.StringVar(&o.only, "only", "", "use only these attach methods, comma-separated (fentry,kprobe,tracepoint,netfilter)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := o.loaderConfig()
	if err != nil {
		return err
	}
	f, _ := parseFilter(o.filter) // validated by loaderConfig
	if err := preflight(); err != nil {
		return err
	}
	t, err := loader.Open(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	return streamEvents(ctx, t, o, f, stdout)
}

// loaderConfig validates the flags into the kernel side's configuration.
func (o traceOptions) loaderConfig() (loader.Config, error) {
	var cfg loader.Config
	if o.output != "text" && o.output != "json" {
		return cfg, usagef("-o %q: want text or json", o.output)
	}
	if o.duration < 0 {
		return cfg, usagef("--duration %s: must not be negative", o.duration)
	}
	if o.netns != "" && o.allNetns {
		return cfg, usagef("--netns and --all-netns exclude each other")
	}
	vias, err := parseVias(o.only)
	if err != nil {
		return cfg, err
	}
	cfg.Only = vias
	f, err := parseFilter(o.filter)
	if err != nil {
		return cfg, err
	}
	applyKernelFilter(&cfg, f)
	if !o.allNetns {
		path := o.netns
		if path == "" {
			path = "/proc/self/ns/net"
		} else {
			cfg.NetnsPaths = []string{path}
		}
		ino, err := netnsInode(path)
		if err != nil {
			return cfg, usagef("--netns %s: %v", path, err)
		}
		cfg.Netns = ino
	}
	return cfg, nil
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

// streamEvents writes the header, every event, and on the way out the
// summary with the lost counters, so the output is complete after SIGINT.
func streamEvents(ctx context.Context, t *loader.Tracer, o traceOptions, f filter.Filter, stdout io.Writer) error {
	if o.readyFile != "" {
		if err := os.WriteFile(o.readyFile, []byte("ready\n"), 0o644); err != nil {
			return fmt.Errorf("write ready file: %w", err)
		}
	}
	out := newEventWriter(o.output, stdout)
	hdr := trace.Header{Type: trace.TypeHeader, Schema: trace.Schema, Node: hostname(), Kernel: live.KernelRelease(),
		Started: time.Now().UTC(), Command: "trace", Filter: o.filter, Hooks: live.HookRecords(t.Plan)}
	if err := out.header(hdr); err != nil {
		return err
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	stop := context.AfterFunc(ctx, func() { t.Close() })
	defer stop()

	sum := trace.Summary{Type: trace.TypeSummary}
	var raw ringbuf.Record
	var readErr error
	for {
		ev, err := t.Next(&raw)
		if errors.Is(err, os.ErrClosed) {
			break
		}
		if err != nil {
			sum.DecodeErrors++
			continue
		}
		rec := ev.Record(t.Reasons())
		if !f.Empty() && !f.Match(eventFlow(&rec)) {
			continue
		}
		sum.Events++
		if err := out.event(rec); err != nil {
			readErr = err
			break
		}
	}
	lost, err := t.Lost()
	if err != nil {
		return errors.Join(readErr, err)
	}
	sum.LostByHook = map[string]uint64{}
	for h, n := range lost {
		sum.LostByHook[h.String()] = n
		sum.LostEvents += n
	}
	sum.Ended = time.Now().UTC()
	return errors.Join(readErr, out.summary(sum))
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// eventWriter renders the stream as NDJSON or as one line per event.
type eventWriter struct {
	json bool
	w    io.Writer
	enc  *json.Encoder
}

func newEventWriter(format string, w io.Writer) *eventWriter {
	return &eventWriter{json: format == "json", w: w, enc: json.NewEncoder(w)}
}

func (e *eventWriter) header(h trace.Header) error {
	if e.json {
		return e.enc.Encode(h)
	}
	var parts []string
	for _, hk := range h.Hooks {
		parts = append(parts, hk.Hook+"="+hk.Via)
	}
	_, err := fmt.Fprintf(e.w, "# tracer on %s, kernel %s; hooks: %s\n", h.Node, h.Kernel, strings.Join(parts, " "))
	return err
}

func (e *eventWriter) event(r trace.Event) error {
	if e.json {
		r.Type = trace.TypeEvent
		return e.enc.Encode(r)
	}
	_, err := fmt.Fprintln(e.w, eventLine(r))
	return err
}

func (e *eventWriter) summary(s trace.Summary) error {
	if e.json {
		return e.enc.Encode(s)
	}
	_, err := fmt.Fprintf(e.w, "# %d events, %d lost\n", s.Events, s.LostEvents)
	return err
}

// eventLine is the text form: time, kind, tuple, what it became, where seen.
func eventLine(r trace.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-12s %-5s", r.Time.Local().Format("15:04:05.000000"), r.Kind, r.Proto)
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
