package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tracer-dev/tracer/internal/conntrack"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/trace"
)

// An observer is what runs on the node while the traffic flows: nothing,
// the tracer's kernel side, the full live pipeline, conntrack -E or nft
// tracing. start returns once it is observing; stop ends it and says what
// it saw.
type observer interface {
	name() string
	start(b *lab) error
	stop() (observed, error)
}

// observed is what an observer reported about the window.
type observed struct {
	// NAT decisions of the lab's connections it reported (-1: not counted).
	NAT int64
	// Lost is what it says it lost itself (tracer: ring buffer full;
	// conntrack -E: ENOBUFS warnings), -1 when it cannot tell.
	Lost int64
	// Events is every event the tracer delivered (-1: not a tracer).
	Events int64
	// Programs is what the kernel's BPF statistics counted for each of
	// the tracer's programs over the window (only with stats on).
	Programs []programRun
	// Flows is the flows of the lab's connections the full live pipeline
	// reported (a flow to the VIP with a DNAT): one per connection when
	// the join keeps connections apart.
	Flows int64
	Extra string
	// SetupCPU is CPU time the round's reading counts but the observer
	// spent before it was observing (a child process's start and attach).
	SetupCPU time.Duration
	// OwnCPU is the CPU time of the observer's own process over the
	// window (0: it runs in this one).
	OwnCPU time.Duration
}

// programRun is one program's runs and run time over a window.
type programRun struct {
	Program, Via, Hooks string
	Runs                uint64
	RunTime             time.Duration
}

type none struct{}

func (none) name() string            { return "none" }
func (none) start(*lab) error        { return nil }
func (none) stop() (observed, error) { return observed{NAT: -1, Lost: -1, Events: -1}, nil }

var vipPort, vipUDPPort = net.JoinHostPort(vip, strconv.Itoa(vport)), net.JoinHostPort(vip, strconv.Itoa(uport))

// isLabDNAT says an event is the DNAT of a lab connection: TCP to VIP:80,
// or the flood's UDP to VIP:53.
func isLabDNAT(ev event.Event) bool {
	if ev.Kind != event.KindDNAT || ev.Orig.Dst != vipAddr {
		return false
	}
	return ev.Orig.Proto == syscall.IPPROTO_TCP && ev.Orig.DstPort == vport || ev.Orig.Proto == syscall.IPPROTO_UDP && ev.Orig.DstPort == uport
}

var vipAddr = netip.MustParseAddr(vip)

// kernelOnly is loader.Open observing R, with the ring buffer drained by
// a goroutine that decodes every record, as the live reader does.
type kernelOnly struct {
	// stats, when set, also has the kernel count each program's runs and
	// run time over the window (loader.EnableRunStats).
	stats    bool
	statsOff io.Closer
	base     []loader.ProgramStat
	// askEnds has the kernel side report R's conntrack entries' ends, as
	// the live pipeline does for its trackers; they go to ended, once
	// set, and count in ends, not in all.
	askEnds bool
	ended   atomic.Pointer[conntrack.Tracker]
	t       *loader.Tracer
	nat     atomic.Int64
	all     atomic.Int64
	ends    atomic.Int64
	errs    atomic.Int64
	done    chan struct{}
}

const (
	kernelName = "tracer (kernel side + drain)"
	statsName  = "tracer (kernel side + drain), BPF stats on"
)

func (k *kernelOnly) name() string {
	if k.stats {
		return statsName
	}
	return kernelName
}

func (k *kernelOnly) start(b *lab) error {
	cfg := b.loaderConfig()
	if k.askEnds {
		cfg.ConntrackNetns = cfg.Netns
	}
	t, err := loader.Open(cfg)
	if err != nil {
		return fmt.Errorf("attach tracer: %w", err)
	}
	k.t, k.done = t, make(chan struct{})
	if k.stats {
		if err := k.startStats(); err != nil {
			t.Close()
			return err
		}
	}
	k.nat.Store(0)
	k.all.Store(0)
	k.ends.Store(0)
	k.errs.Store(0)
	go func() {
		defer close(k.done)
		for {
			ev, err := t.Next()
			if errors.Is(err, os.ErrClosed) {
				return
			}
			if err != nil {
				k.errs.Add(1)
				continue
			}
			if ev.Kind == event.KindCTDestroy {
				k.ends.Add(1)
				if ct := k.ended.Load(); ct != nil {
					ct.Ended(conntrack.EndOf(ev))
				}
				continue
			}
			k.all.Add(1)
			if isLabDNAT(ev) {
				k.nat.Add(1)
			}
		}
	}()
	return nil
}

func (k *kernelOnly) stop() (observed, error) {
	time.Sleep(300 * time.Millisecond) // let the reader drain
	var lost uint64
	byHook, err := k.t.Lost()
	if err != nil {
		return observed{}, fmt.Errorf("read lost counters: %w", err)
	}
	for _, n := range byHook {
		lost += n
	}
	var serr error
	var runs []programRun
	if k.stats {
		runs, serr = k.stopStats()
	}
	cerr := k.t.Close()
	<-k.done
	o := observed{NAT: k.nat.Load(), Lost: int64(lost), Events: k.all.Load(), Programs: runs}
	if n := k.errs.Load(); n > 0 {
		o.Extra = fmt.Sprintf("%d decode errors", n)
	}
	return o, errors.Join(serr, cerr)
}

// startStats enables the kernel's run statistics and notes where each
// program's counters start (they are cumulative since its load).
func (k *kernelOnly) startStats() error {
	off, err := loader.EnableRunStats()
	if err != nil {
		return err
	}
	if k.base, err = k.t.ProgramStats(); err != nil {
		off.Close()
		return fmt.Errorf("read program statistics: %w", err)
	}
	k.statsOff = off
	return nil
}

// stopStats reads each program's counters, disables the statistics and
// returns what the window added.
func (k *kernelOnly) stopStats() ([]programRun, error) {
	now, err := k.t.ProgramStats()
	if cerr := k.statsOff.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("disable bpf run statistics: %w", cerr)
	}
	if err != nil {
		return nil, fmt.Errorf("read program statistics: %w", err)
	}
	var out []programRun
	for i, s := range now {
		var hooks []string
		for _, h := range s.Hooks {
			hooks = append(hooks, h.String())
		}
		r := programRun{Program: s.Program, Via: s.Via.String(), Hooks: strings.Join(hooks, ", "), Runs: s.Runs, RunTime: s.RunTime}
		if i < len(k.base) && k.base[i].Program == s.Program {
			r.Runs -= k.base[i].Runs
			r.RunTime -= k.base[i].RunTime
		}
		out = append(out, r)
	}
	return out, nil
}

// fullLive is live.Start + Run on R: kernel side, conntrack, node watcher,
// join, enrichment and diagnosis; flows are counted and written as
// NDJSON to a file, as `tracer trace -o json > FILE` writes them.
type fullLive struct {
	p   *live.Pipeline
	out *os.File
	// writes counts the trace writer's system calls.
	writes   countedWrites
	cancel   context.CancelFunc
	done     chan struct{}
	sum      trace.Summary
	err      error
	nat      atomic.Int64
	flows    atomic.Int64
	labFlows atomic.Int64
	// noCT counts the flows that came out without their conntrack entry.
	noCT atomic.Int64
	prof windowProfile
}

func (*fullLive) name() string { return "tracer (full live pipeline)" }

func (f *fullLive) start(b *lab) error {
	if err := f.prof.start(); err != nil {
		return err
	}
	var err error
	labelled("live", func(ctx context.Context) { err = f.startLabelled(ctx, b) })
	if err != nil {
		f.prof.stop()
	}
	return err
}

// startLabelled starts the pipeline; every goroutine it starts carries
// ctx's profiler labels.
func (f *fullLive) startLabelled(ctx context.Context, b *lab) error {
	ctx, cancel := context.WithCancel(ctx)
	p, err := live.Start(ctx, live.Config{
		Loader:    b.loaderConfig(),
		NetnsPath: b.r.Path(), NodeName: "bench", Command: "nodebench",
		FlowsNotKept: true, // as tracer trace: each flow is written, and counted
	})
	if err != nil {
		cancel()
		return fmt.Errorf("start live pipeline: %w", err)
	}
	// As `tracer trace -o json > FILE`, in batches: each write is a
	// system call, which a discarding writer would leave out.
	out, err := os.CreateTemp("", "nodebench-live-*.ndjson")
	if err != nil {
		cancel()
		p.Close()
		return fmt.Errorf("trace output: %w", err)
	}
	f.writes = countedWrites{w: out}
	w, err := trace.NewWriter(&f.writes, p.Header())
	if err != nil {
		cancel()
		p.Close()
		closeOutput(out)
		return fmt.Errorf("trace writer: %w", err)
	}
	w.Batch()
	f.p, f.out, f.cancel, f.done = p, out, cancel, make(chan struct{})
	f.nat.Store(0)
	f.flows.Store(0)
	f.labFlows.Store(0)
	f.noCT.Store(0)
	go func() {
		defer close(f.done)
		f.sum, f.err = p.Run(ctx, live.Sink{Flow: func(fl *trace.Flow) {
			f.flows.Add(1)
			if isLabFlow(fl) {
				f.labFlows.Add(1)
			}
			if fl.Conntrack == nil {
				f.noCT.Add(1)
			}
			w.WriteFlow(fl)
		}, Event: func(ev event.Event) {
			if isLabDNAT(ev) {
				f.nat.Add(1)
			}
		}, Flush: func() { w.Flush() }})
	}()
	return nil
}

func (f *fullLive) stop() (observed, error) {
	time.Sleep(300 * time.Millisecond)
	// The pipeline stops its programs and reads what they reported
	// before; what it cannot read in time it counts as lost.
	f.cancel()
	<-f.done
	st := f.p.Stats()
	cerr := errors.Join(f.p.Close(), closeOutput(f.out))
	perr := f.prof.stop()
	o := observed{NAT: f.nat.Load(), Lost: int64(f.sum.LostEvents), Events: int64(f.sum.Events), Flows: f.labFlows.Load(),
		Extra: fmt.Sprintf("%d flows, %d without conntrack, %d writes", f.flows.Load(), f.noCT.Load(), f.writes.n.Load())}
	if n := f.sum.ConntrackOverruns; n > 0 {
		o.Extra += fmt.Sprintf(", %d conntrack DESTROY overruns", n)
	}
	if n := f.sum.ConntrackEndsEvicted; n > 0 {
		o.Extra += fmt.Sprintf(", %d conntrack ends evicted within a linger of their end (table full)", n)
	}
	if f.sum.DecodeErrors > 0 {
		o.Extra += fmt.Sprintf(", %d decode errors", f.sum.DecodeErrors)
	}
	if st.ConntrackLookupsOff != "" {
		o.Extra += ", conntrack entries asked by netlink GETs: " + st.ConntrackLookupsOff
	} else {
		o.Extra += fmt.Sprintf(", %d conntrack entries asked by BPF", st.ConntrackKernelLookups)
	}
	return o, errors.Join(f.err, cerr, perr)
}

// countedWrites counts the Writes that reach w.
type countedWrites struct {
	w io.Writer
	n atomic.Int64
}

func (c *countedWrites) Write(b []byte) (int, error) {
	c.n.Add(1)
	return c.w.Write(b)
}

// closeOutput closes and removes a round's trace output: a round at
// 100,000 connections/s writes about 150 MB.
func closeOutput(f *os.File) error {
	return errors.Join(f.Close(), os.Remove(f.Name()))
}

func isLabFlow(f *trace.Flow) bool {
	return (f.Orig.Dst == vipPort || f.Orig.Dst == vipUDPPort) && slices.ContainsFunc(f.Events, func(e trace.Event) bool { return e.Kind == trace.KindDNAT })
}

// lineCounter runs a command in R and counts its stdout lines that match.
type lineCounter struct {
	cmd     *exec.Cmd
	match   func(string) bool
	lines   atomic.Int64
	total   atomic.Int64
	warns   atomic.Int64
	sample  string
	mu      sync.Mutex
	stderr  strings.Builder
	readers sync.WaitGroup
}

func (c *lineCounter) run(b *lab, args ...string) error {
	c.lines.Store(0)
	c.total.Store(0)
	c.warns.Store(0)
	c.stderr.Reset()
	c.sample = ""
	c.cmd = exec.Command("ip", append([]string{"netns", "exec", b.r.Name}, args...)...)
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	errOut, err := c.cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", args[0], err)
	}
	c.readers.Add(2)
	go func() {
		defer c.readers.Done()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.total.Add(1)
			if c.match(sc.Text()) {
				if c.lines.Add(1) == 1 {
					c.mu.Lock()
					c.sample = sc.Text()
					c.mu.Unlock()
				}
			}
		}
		io.Copy(io.Discard, out)
	}()
	go func() {
		defer c.readers.Done()
		sc := bufio.NewScanner(errOut)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "ENOBUFS") {
				c.warns.Add(1)
			}
			c.mu.Lock()
			if c.stderr.Len() < 2000 {
				c.stderr.WriteString(sc.Text() + "\n")
			}
			c.mu.Unlock()
		}
	}()
	// The tool needs a moment to subscribe before the traffic starts.
	time.Sleep(500 * time.Millisecond)
	if c.cmd.ProcessState != nil {
		return fmt.Errorf("%s exited early: %s", args[0], c.stderr.String())
	}
	return nil
}

// complaint is what the tool said on stderr: its ENOBUFS warnings, or
// its first line.
func (c *lineCounter) complaint() string {
	if w := c.warns.Load(); w > 0 {
		return fmt.Sprintf("%d ENOBUFS warnings", w)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	first, _, _ := strings.Cut(strings.TrimSpace(c.stderr.String()), "\n")
	return first
}

func (c *lineCounter) end() {
	time.Sleep(500 * time.Millisecond) // let it print what it has read
	c.cmd.Process.Signal(syscall.SIGINT)
	timer := time.AfterFunc(3*time.Second, func() { c.cmd.Process.Kill() })
	c.readers.Wait()
	c.cmd.Wait()
	timer.Stop()
}

// cpu is the tool's CPU time, once it has ended.
func (c *lineCounter) cpu() time.Duration {
	if c.cmd.ProcessState == nil {
		return 0
	}
	return c.cmd.ProcessState.UserTime() + c.cmd.ProcessState.SystemTime()
}

// conntrackE is `conntrack -E -e NEW` in R: one line per new connection,
// the NAT'd ones show VIP as the original destination and S in the reply.
type conntrackE struct{ lineCounter }

func (*conntrackE) name() string { return "conntrack -E -e NEW" }

func (c *conntrackE) start(b *lab) error {
	c.match = func(l string) bool {
		return strings.Contains(l, "dst="+vip+" ") && strings.Contains(l, "src="+sAddr+" ")
	}
	return c.run(b, "conntrack", "-E", "-e", "NEW")
}

func (c *conntrackE) stop() (observed, error) {
	c.end()
	return observed{NAT: c.lines.Load(), Lost: -1, Events: -1, Extra: c.complaint(), OwnCPU: c.cpu()}, nil
}

// nftTrace is nft tracing in R: a prerouting chain before conntrack sets
// nftrace on the lab's packets to VIP:80, and `nft monitor trace` prints
// every rule they meet; the NAT decision is the line of the nat table's
// DNAT rule (iptables-nft keeps its rules in nftables).
type nftTrace struct {
	lineCounter
	b *lab
}

const nftTable = "nodebench"

func (*nftTrace) name() string { return "nft monitor trace" }

func (n *nftTrace) start(b *lab) error {
	n.b = b
	script := fmt.Sprintf("add table ip %[1]s\nadd chain ip %[1]s pre { type filter hook prerouting priority -350; }\n"+
		"add rule ip %[1]s pre ip daddr %[2]s tcp dport %[3]d meta nftrace set 1\n", nftTable, vip, vport)
	cmd := exec.Command("ip", "netns", "exec", b.r.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft trace rule: %w: %s", err, out)
	}
	n.match = func(l string) bool {
		return strings.Contains(l, " nat PREROUTING rule ") && (strings.Contains(l, "DNAT") || strings.Contains(l, "dnat"))
	}
	return n.run(b, "nft", "monitor", "trace")
}

func (n *nftTrace) stop() (observed, error) {
	n.end()
	err := nsRun(n.b.r, "nft", "delete", "table", "ip", nftTable)
	extra := fmt.Sprintf("%d trace lines", n.total.Load())
	if c := n.complaint(); c != "" {
		extra += "; " + c
	}
	return observed{NAT: n.lines.Load(), Lost: -1, Events: -1, Extra: extra, OwnCPU: n.cpu()}, err
}

// ctTracker is the kernel side and drain of kernelOnly plus a conntrack
// tracker on R opened as the live pipeline opens its own, and nothing
// else (no lookups): what the tracker costs on its own is its difference
// to kernelOnly.
type ctTracker struct {
	kernelOnly
	ct   *conntrack.Tracker
	prof windowProfile
}

const ctName = "tracer (kernel side + drain + conntrack tracker)"

func (*ctTracker) name() string { return ctName }

func (c *ctTracker) start(b *lab) error {
	c.prof.suffix = "-ct"
	c.askEnds = true
	if err := c.prof.start(); err != nil {
		return err
	}
	if err := c.kernelOnly.start(b); err != nil {
		c.prof.stop()
		return err
	}
	opts := live.ConntrackOptions()
	opts.FedDestroys = c.t.Plan.Serves(event.HookCTDestroy)
	var err error
	labelled("ct", func(ctx context.Context) { c.ct, err = conntrack.OpenWith(ctx, b.r.Path(), opts) })
	if err != nil {
		c.kernelOnly.stop()
		c.prof.stop()
		return fmt.Errorf("open conntrack tracker: %w", err)
	}
	if opts.FedDestroys {
		c.ended.Store(c.ct)
	}
	return nil
}

func (c *ctTracker) stop() (observed, error) {
	o, err := c.kernelOnly.stop()
	st := c.ct.Stats()
	cerr := c.ct.Close()
	perr := c.prof.stop()
	from := "DESTROY events"
	if c.ended.Load() != nil {
		from = fmt.Sprintf("%d ends from the kernel side", c.ends.Load())
	}
	o.Extra = strings.TrimPrefix(fmt.Sprintf("%s; conntrack %d entries (%s), %d overruns", o.Extra, st.Entries, from, st.Overruns), "; ")
	return o, errors.Join(err, cerr, perr)
}
