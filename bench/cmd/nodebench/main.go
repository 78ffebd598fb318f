// Command nodebench measures what the tracer costs on a node and how much
// it can carry, side by side with what users would otherwise run
// (conntrack -E, nft tracing), and writes BENCHMARKS.md.
//
// As root it builds throwaway namespaces (client -> router with an
// iptables DNAT -> server), drives short-lived TCP connections through the
// DNAT and interleaves rounds with nothing attached, the tracer's kernel
// side (also with the kernel's BPF statistics on, for the programs' own
// cost; and with the conntrack tracker alone), the full live pipeline,
// conntrack -E and nft monitor trace.
// Without root only the userspace figures are measured.
//
// With -vm it also runs the overhead rounds in a QEMU guest per kernel
// (tests/vm's vmrun, command mode): the kprobe and fentry tiers this
// host's kernel lacks, measured under emulation. Each guest runs this
// binary with -json into vmrun's writable share, read back for section 7.
//
//	go run ./bench/cmd/nodebench [-rounds 6] [-round 5s] [-observers none,live] [-out BENCHMARKS.md]
//	go run ./bench/cmd/nodebench -vm "5.10 6.1 6.12" [-vm-rounds 4] [-vm-round 3s]
//	go run ./bench/cmd/nodebench -kernel=false -userside=false -vm 6.12 -out /tmp/vm.md
//
// NODEBENCH_CPUPROFILE=FILE writes a CPU profile of each full live
// pipeline window (FILE, FILE.2, ...) and of each conntrack tracker
// window (FILE-ct, ...); the observer's goroutines carry the label
// observer=live or observer=ct (-tagfocus observer=live keeps only them).
// Beside each goes FILE.allocs, the allocations of its process so far.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/loader"
)

type config struct {
	rounds    int
	round     time.Duration
	workers   int
	ramp      []int
	flood     []int // the flood ramp's rates, one-datagram connections a second
	drops     []int // the drop storms' rates, datagrams a second
	rampStep  time.Duration
	attach    int
	mem       []int
	feed      string // "RATE:MINUTES" of the store's long feed; "" skips it
	benchtime string
	out       string
	gotest    bool
	observers []observer
	userside  bool          // measure the userspace figures
	kernel    bool          // measure the kernel side on this host
	json      string        // the overhead rounds as JSON ("" for none)
	idle      time.Duration // window of the idle cost on 5,000 Services (0 skips it)
	only      []event.Via   // the tiers the tracer may attach by (-only; none: any)
	vm        vmConfig
}

func main() {
	var cfg config
	var ramp, flood, drops, mem, obs, childSpec, vmKernels, only string
	flag.IntVar(&cfg.rounds, "rounds", 6, "interleaved rounds of every variant")
	flag.DurationVar(&cfg.round, "round", 5*time.Second, "traffic per variant per round")
	flag.IntVar(&cfg.workers, "workers", 8, "client workers in the overhead rounds")
	flag.StringVar(&ramp, "ramp", "1,2,4,8,16,32", "client worker counts of the loss ramp")
	flag.StringVar(&flood, "flood", "20000,40000,60000,80000", "rates (one-datagram UDP connections a second) of the flood ramp, which then doubles while the tracer loses nothing and the machine keeps up (\"\" to skip)")
	flag.StringVar(&drops, "drops", "20000", "rates (datagrams a second) of the drop storms, the flood dropped before its DNAT, with and without a conntrack entry (\"\" to skip)")
	flag.DurationVar(&cfg.rampStep, "ramp-step", 5*time.Second, "traffic per ramp step")
	flag.IntVar(&cfg.attach, "attach", 5, "attach+detach repetitions")
	flag.DurationVar(&cfg.idle, "idle", 20*time.Second, "window of the idle cost on a namespace of 5,000 Services' rules, per kube-proxy mode (0 to skip)")
	flag.StringVar(&mem, "mem", "100000,1000000", "flow counts of the memory figures")
	flag.StringVar(&cfg.feed, "feed", "5000:60", "`RATE:MINUTES` of the UI store's synthetic feed, on a fake clock (\"\" to skip)")
	flag.StringVar(&cfg.benchtime, "benchtime", "1s", "go test -benchtime of the per-stage benchmarks")
	flag.BoolVar(&cfg.gotest, "gotest", true, "run the per-stage Go benchmarks (needs the go tool)")
	flag.StringVar(&cfg.out, "out", "BENCHMARKS.md", "report to write (\"\" for none)")
	flag.StringVar(&obs, "observers", strings.Join(observerKeys, ","), "observers of the overhead rounds (none is always one)")
	flag.StringVar(&childSpec, "child", "", "internal: measure in a child process")
	flag.BoolVar(&cfg.kernel, "kernel", true, "measure the kernel side (overhead rounds, loss ramp, attach) on this host")
	flag.BoolVar(&cfg.userside, "userside", true, "measure the userspace figures (throughput, memory, feed, Go benchmarks)")
	flag.StringVar(&cfg.json, "json", "", "also write the overhead rounds, BPF statistics and attach plan to this JSON `file`")
	flag.StringVar(&only, "only", "", "restrict the tracer to these tiers, comma separated (fentry, kprobe, tracepoint, netfilter; \"\" for any)")
	flag.StringVar(&vmKernels, "vm", "", "kernel series to also measure in QEMU guests (\"5.10 6.1 6.12\"; SERIES:TIER+TIER restricts the tiers, as -only; \"\" for none)")
	flag.IntVar(&cfg.vm.rounds, "vm-rounds", 4, "interleaved rounds of every observer in each guest")
	flag.DurationVar(&cfg.vm.round, "vm-round", 3*time.Second, "traffic per observer per round in each guest")
	flag.StringVar(&cfg.vm.observers, "vm-observers", "none,kernel,stats,ct,live", "observers of the guests' rounds")
	flag.DurationVar(&cfg.vm.timeout, "vm-timeout", 15*time.Minute, "kill a guest that has not finished after this long")
	flag.Parse()
	if spec, ok := strings.CutPrefix(childSpec, "observe:"); ok {
		if err := observeChild(spec, only); err != nil {
			fmt.Fprintln(os.Stderr, "nodebench:", err)
			os.Exit(1)
		}
		return
	}
	if childSpec != "" {
		if err := runChild(childSpec); err != nil {
			fmt.Fprintln(os.Stderr, "nodebench:", err)
			os.Exit(1)
		}
		return
	}
	var err error
	if _, err = observers(cfg.vm.observers); err != nil {
		fmt.Fprintln(os.Stderr, "nodebench: -vm-observers:", err)
		os.Exit(2)
	}
	if cfg.only, err = parseTiers(only); err != nil {
		fmt.Fprintln(os.Stderr, "nodebench: -only:", err)
		os.Exit(2)
	}
	cfg.vm.kernels = strings.FieldsFunc(vmKernels, func(r rune) bool { return r == ',' || r == ' ' })
	for _, e := range cfg.vm.kernels {
		if _, only := vmEntry(e); only != "" {
			if _, err := parseTiers(only); err != nil {
				fmt.Fprintf(os.Stderr, "nodebench: -vm %s: %v\n", e, err)
				os.Exit(2)
			}
		}
	}
	if cfg.ramp, err = ints(ramp); err != nil {
		fmt.Fprintln(os.Stderr, "nodebench: -ramp:", err)
		os.Exit(2)
	}
	if cfg.flood, err = ints(flood); err != nil {
		fmt.Fprintln(os.Stderr, "nodebench: -flood:", err)
		os.Exit(2)
	}
	if cfg.drops, err = ints(drops); err != nil {
		fmt.Fprintln(os.Stderr, "nodebench: -drops:", err)
		os.Exit(2)
	}
	if cfg.mem, err = ints(mem); err != nil {
		fmt.Fprintln(os.Stderr, "nodebench: -mem:", err)
		os.Exit(2)
	}
	if cfg.observers, err = observers(obs); err != nil {
		fmt.Fprintln(os.Stderr, "nodebench: -observers:", err)
		os.Exit(2)
	}
	if cfg.feed != "" {
		if _, err := parseFeed(cfg.feed); err != nil {
			fmt.Fprintln(os.Stderr, "nodebench: -feed:", err)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "nodebench:", err)
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
}

// report is every figure of one run.
type report struct {
	cfg                config
	started, ended     time.Time
	loadStart, loadEnd string
	// speedStart and speedEnd are cpuSpeed at the start and the end.
	speedStart, speedEnd time.Duration
	machine              machine
	commands             []string
	nft                  nftReport
	audit                auditReport
	idle                 []idleResult
	skippedKernel        string

	attach []attachTime
	plan   loader.Plan   // how the first attach attached each hook
	rounds []roundResult // overhead rounds, in run order
	ramp   []rampStep
	flood  []rampStep
	storms []dropStorm

	throughput childResult
	stages     []goBench
	memory     []childResult
	feed       childResult
	notes      []string
	previous   previousRun
	vm         []vmKernel // the overhead rounds in QEMU guests (-vm)
}

type attachTime struct{ Attach, Detach time.Duration }

type roundResult struct {
	Round   int
	Variant string
	Load    load
	Obs     observed
	// CPU is the CPU time of this process and its finished children
	// (conntrack, nft) from the start of the traffic until the observer
	// stopped: the load generator, the server, and the observer.
	CPU time.Duration
	// Machine is every CPU of the machine over the same window.
	Machine machineCPU
}

type rampStep struct {
	// Workers are the TCP ramp's client workers; Rate is the flood
	// ramp's asked rate, in connections a second.
	Workers int
	Rate    int
	// Live and LiveLoad are the flood ramp's second window at the same
	// rate, with the full live pipeline attached alone.
	Live     observed
	LiveLoad load
	Load     load
	Tracer   observed
	CT       observed
}

func run(ctx context.Context, cfg config) error {
	rep := &report{cfg: cfg, started: time.Now(), loadStart: loadavg(), machine: describeMachine(), speedStart: cpuSpeed()}
	rep.commands = append(rep.commands, strings.TrimSpace("go run ./bench/cmd/nodebench "+strings.Join(os.Args[1:], " ")))
	logf("load average %s", rep.loadStart)
	if !cfg.kernel {
		rep.skippedKernel = "not asked for (-kernel=false)"
	} else if os.Geteuid() != 0 {
		rep.skippedKernel = "not root: the kernel-side figures (overhead, loss, attach) need root"
	} else if err := loader.Preflight(loader.Needs{}); err != nil {
		rep.skippedKernel = fmt.Sprintf("kernel side unavailable: %v", err)
	}
	if rep.skippedKernel == "" {
		if err := kernelSide(ctx, rep); err != nil {
			return err
		}
		if cfg.idle > 0 {
			rep.idle = measureIdle(ctx, cfg.idle, cfg.only)
		}
	} else {
		logf("%s", rep.skippedKernel)
	}
	if cfg.userside {
		if err := userSide(ctx, rep); err != nil {
			return err
		}
	}
	rep.ended, rep.loadEnd, rep.speedEnd = time.Now(), loadavg(), cpuSpeed()
	if cfg.json != "" {
		if err := writeGuestResult(cfg.json, rep.guestResult()); err != nil {
			return err
		}
		logf("wrote %s", cfg.json)
	}
	if len(cfg.vm.kernels) > 0 {
		rep.vm = runVMs(ctx, cfg.vm)
		for _, k := range rep.vm {
			rep.commands = append(rep.commands, guestCommand(cfg.vm, k.Series, k.Only))
		}
	}
	fmt.Print(rep.table())
	if cfg.out != "" {
		if old, err := os.ReadFile(cfg.out); err == nil {
			rep.previous = readPrevious(string(old))
		}
		if err := os.WriteFile(cfg.out, []byte(rep.markdown()), 0o644); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		logf("wrote %s", cfg.out)
	}
	return nil
}

func kernelSide(ctx context.Context, rep *report) error {
	cfg := rep.cfg
	b, err := newLab(fmt.Sprintf("trbench%d", os.Getpid()%10000))
	if err != nil {
		return err
	}
	b.only = cfg.only
	defer func() {
		if err := b.close(); err != nil {
			logf("remove lab: %v", err)
		}
	}()
	// Warm up (ARP, conntrack, page cache) and check the path works.
	if l, err := b.traffic(ctx, 2, time.Second); err != nil || l.OK == 0 {
		return fmt.Errorf("traffic through the DNAT does not flow (%d ok, %d failed): %v", l.OK, l.Failed, err)
	}

	logf("attach+detach of the whole hook set, %d times", cfg.attach)
	// The whole set is what the live pipeline attaches: conntrack's ends
	// for its tracker of R too.
	whole := b.loaderConfig()
	whole.ConntrackNetns = whole.Netns
	for range cfg.attach {
		t0 := time.Now()
		t, err := loader.Open(whole)
		if err != nil {
			return fmt.Errorf("attach: %w", err)
		}
		t1 := time.Now()
		if rep.plan == nil {
			rep.plan = t.Plan
		}
		if err := t.Close(); err != nil {
			return fmt.Errorf("detach: %w", err)
		}
		rep.attach = append(rep.attach, attachTime{t1.Sub(t0), time.Since(t1)})
	}

	variants := cfg.observers
	for r := range cfg.rounds {
		for k := range variants {
			v := variants[(k+r)%len(variants)] // rotate so no variant always follows another
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := v.start(b); err != nil {
				return fmt.Errorf("round %d %s: %w", r+1, v.name(), err)
			}
			cpu0, m0 := cpuTime(), readMachineCPU()
			l, terr := b.traffic(ctx, cfg.workers, cfg.round)
			o, serr := v.stop()
			cpu, m := cpuTime()-cpu0-o.SetupCPU, readMachineCPU().since(m0)
			if terr != nil {
				return terr
			}
			if serr != nil {
				return fmt.Errorf("round %d %s: %w", r+1, v.name(), serr)
			}
			rep.rounds = append(rep.rounds, roundResult{r + 1, v.name(), l, o, cpu, m})
			logf("round %d %-42s %8.0f conn/s (%d ok, %d failed) %.0f µs CPU/conn, machine %.0f%% busy, nat seen %d lost %d %s", r+1, v.name(),
				l.rate(), l.OK, l.Failed, float64(cpu.Microseconds())/float64(max(l.OK, 1)), 100*m.busyFraction(), o.NAT, o.Lost, o.Extra)
			time.Sleep(200 * time.Millisecond)
		}
	}

	logf("loss ramp: tracer and conntrack -E attached together")
	for w, ok := firstRampWorkers(cfg.ramp); ok; w, ok = nextRampWorkers(cfg.ramp, rep.ramp) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		step, err := rampOnce(b, func() (load, error) { return b.traffic(ctx, w, cfg.rampStep) })
		if err != nil {
			return fmt.Errorf("ramp %d workers: %w", w, err)
		}
		step.Workers = w
		rep.ramp = append(rep.ramp, step)
		logf("ramp %2d workers %8.0f conn/s (%d ok) tracer nat %d lost %d | conntrack -E %d %s", w, step.Load.rate(), step.Load.OK, step.Tracer.NAT, step.Tracer.Lost, step.CT.NAT, step.CT.Extra)
		time.Sleep(200 * time.Millisecond)
	}
	if len(cfg.flood) > 0 {
		logf("flood ramp: one-datagram UDP connections, tracer and conntrack -E attached together")
	}
	for rate, ok := firstRampWorkers(cfg.flood); ok; rate, ok = nextFloodRate(cfg.flood, rep.flood) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		flood := func() (load, error) { return b.flood(ctx, rate, cfg.rampStep) }
		step, err := rampOnce(b, flood)
		if err != nil {
			return fmt.Errorf("flood at %d a second: %w", rate, err)
		}
		live := "live not run: it lost at a lower rate"
		// R's UDP entries time out after floodUDPTimeout: let them go
		// before the next window fills the table again.
		if !liveLost(rep.flood) {
			time.Sleep(1500 * time.Millisecond)
			if step.Live, step.LiveLoad, err = observeAlone(b, "live", flood); err != nil {
				return fmt.Errorf("flood at %d a second, full live pipeline: %w", rate, err)
			}
			live = fmt.Sprintf("live at %.0f conn/s: nat %d lost %d flows %d (%s)", step.LiveLoad.rate(), step.Live.NAT, step.Live.Lost, step.Live.Flows, step.Live.Extra)
		}
		step.Rate = rate
		rep.flood = append(rep.flood, step)
		logf("flood %7d/s asked %8.0f conn/s (%d NAT decisions, %d send errors) tracer nat %d lost %d | conntrack -E %d %s | %s", rate, step.Load.rate(), step.Load.OK, step.Load.Failed,
			step.Tracer.NAT, step.Tracer.Lost, step.CT.NAT, step.CT.Extra, live)
		time.Sleep(1500 * time.Millisecond)
	}
	rep.storms, err = dropStorms(ctx, b, cfg.drops, cfg.rampStep)
	return err
}

// observeAlone runs traffic with one observer attached.
func observeAlone(b *lab, key string, traffic func() (load, error)) (observed, load, error) {
	o, err := newObserver(key)
	if err != nil {
		return observed{}, load{}, err
	}
	if err := o.start(b); err != nil {
		return observed{}, load{}, err
	}
	l, terr := traffic()
	got, serr := o.stop()
	if err := errors.Join(terr, serr); err != nil {
		return observed{}, load{}, err
	}
	return got, l, nil
}

// rampOnce is one step of a loss ramp: the tracer's kernel side and
// conntrack -E attached together while traffic runs.
func rampOnce(b *lab, traffic func() (load, error)) (rampStep, error) {
	tr, err := newObserver("kernel")
	if err != nil {
		return rampStep{}, err
	}
	ct := &conntrackE{}
	if err := tr.start(b); err != nil {
		return rampStep{}, err
	}
	if err := ct.start(b); err != nil {
		tr.stop()
		return rampStep{}, err
	}
	l, terr := traffic()
	co, cerr := ct.stop()
	to, serr := tr.stop()
	if terr != nil {
		return rampStep{}, terr
	}
	if cerr != nil || serr != nil {
		return rampStep{}, errors.Join(cerr, serr)
	}
	return rampStep{Load: l, Tracer: to, CT: co}, nil
}

// maxRampWorkers bounds the ramp's extension.
const maxRampWorkers = 256

func firstRampWorkers(listed []int) (int, bool) {
	if len(listed) == 0 {
		return 0, false
	}
	return listed[0], true
}

// nextRampWorkers is the ramp's next worker count: the listed ones, then
// double the last while the tracer has lost nothing and the rate still
// rises by 5% a step, so the ramp ends where the tracer loses or where the
// machine cannot connect faster, whichever comes first.
func nextRampWorkers(listed []int, done []rampStep) (int, bool) {
	if len(done) < len(listed) {
		return listed[len(done)], true
	}
	if len(done) < 2 {
		return 0, false
	}
	last, prev := done[len(done)-1], done[len(done)-2]
	lost := last.Tracer.lostOrMissed(last.Load) > 0
	rising := last.Load.rate() >= 1.05*prev.Load.rate()
	if lost || !rising || last.Workers*2 > maxRampWorkers {
		return 0, false
	}
	return last.Workers * 2, true
}

// maxFloodRate bounds the flood ramp's extension.
const maxFloodRate = 2_560_000

// nextFloodRate is the flood ramp's next rate: the listed ones, then
// double the last while the tracer's kernel side has lost nothing and the
// machine made at least 80% of the rate asked, so the ramp ends where the
// kernel side loses or where the machine cannot send faster. The full
// live pipeline's window is left out from its first loss on (liveLost).
func nextFloodRate(listed []int, done []rampStep) (int, bool) {
	if len(done) < len(listed) {
		return listed[len(done)], true
	}
	if len(done) == 0 {
		return 0, false
	}
	last := done[len(done)-1]
	keptUp := last.Load.rate() >= 0.8*float64(last.Rate)
	if last.Tracer.lostOrMissed(last.Load) > 0 || !keptUp || last.Rate*2 > maxFloodRate {
		return 0, false
	}
	return last.Rate * 2, true
}

// liveLost says whether the full live pipeline lost or missed NAT
// decisions in a flood step already.
func liveLost(done []rampStep) bool {
	return slices.ContainsFunc(done, func(s rampStep) bool { return s.LiveLoad.OK > 0 && s.Live.lostOrMissed(s.LiveLoad) > 0 })
}

// lostOrMissed is what an observer lost of l's: the larger of its lost
// counters and the NAT decisions the kernel made that it never reported.
// The two are mostly the same events (the ring buffer had no room for
// them), so adding them would count those twice.
func (o observed) lostOrMissed(l load) int64 { return max(o.Lost, missed(l.OK, o.NAT)) }

func userSide(ctx context.Context, rep *report) error {
	logf("userspace throughput, one core")
	var err error
	if rep.throughput, err = child("throughput"); err != nil {
		return err
	}
	for _, n := range rep.cfg.mem {
		for _, kind := range []string{"joiner", "store"} {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			logf("memory: %s with %d flows", kind, n)
			r, err := child(fmt.Sprintf("mem:%s:%d", kind, n))
			if err != nil {
				return err
			}
			rep.memory = append(rep.memory, r)
		}
	}
	if rep.cfg.feed != "" && ctx.Err() == nil {
		logf("store under a feed of %s (flows/s:minutes)", rep.cfg.feed)
		if rep.feed, err = child("feed:" + rep.cfg.feed); err != nil {
			return err
		}
	}
	if rep.cfg.gotest {
		logf("per-stage Go benchmarks")
		stages, cmdline, err := goBenchmarks(rep.cfg.benchtime)
		if err != nil {
			rep.notes = append(rep.notes, fmt.Sprintf("per-stage benchmarks failed: %v", err))
		}
		rep.stages = stages
		rep.commands = append(rep.commands, cmdline)
		logf("nftables rule source: 5,000 Services")
		var nftCmd string
		rep.nft, nftCmd = measureNFT(rep.cfg.benchtime)
		rep.commands = append(rep.commands, nftCmd)
		logf("tracer audit: 5,000 Services")
		var auditCmd string
		rep.audit, auditCmd = measureAudit(rep.cfg.benchtime)
		rep.commands = append(rep.commands, auditCmd)
	}
	return nil
}

// cpuTime is the user+system CPU time of this process and of its
// children that have been waited for.
func cpuTime() time.Duration {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// machineCPU is the machine's CPU time from /proc/stat, all CPUs, in
// clock ticks: busy is everything but idle and iowait.
type machineCPU struct{ Busy, Total uint64 }

func readMachineCPU() machineCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}
	}
	var m machineCPU
	for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal
		n, _ := strconv.ParseUint(v, 10, 64)
		m.Total += n
		if i != 3 && i != 4 {
			m.Busy += n
		}
	}
	return m
}

func (m machineCPU) since(start machineCPU) machineCPU {
	return machineCPU{m.Busy - start.Busy, m.Total - start.Total}
}

func (m machineCPU) busyFraction() float64 {
	if m.Total == 0 {
		return math.NaN()
	}
	return float64(m.Busy) / float64(m.Total)
}

type machine struct {
	CPU      string
	Cores    int
	Memory   string
	Kernel   string
	Iptables string
}

// cpuSpeed is how long one core takes for a fixed piece of work like the
// pipeline's (sorting, then a map of 1M keys, mostly cache misses), best
// of 5: two runs of this program compare only as far as their machines
// do, and two machines of one description (cloud instances of the same
// CPU name) can differ by half.
func cpuSpeed() time.Duration {
	best := time.Duration(math.MaxInt64)
	for range 5 {
		rng := rand.New(rand.NewPCG(1, 2))
		xs := make([]uint64, 1<<20)
		for i := range xs {
			xs[i] = rng.Uint64()
		}
		start := time.Now()
		slices.Sort(xs)
		counts := make(map[uint64]int)
		for _, x := range xs {
			counts[x>>44]++
		}
		best = min(best, time.Since(start))
	}
	return best
}

func describeMachine() machine {
	m := machine{Kernel: unameR(), Iptables: "not found"}
	if out, err := exec.Command("iptables", "-V").Output(); err == nil {
		m.Iptables = strings.TrimSpace(string(out))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok && m.CPU == "" {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
			}
			if strings.HasPrefix(l, "processor") {
				m.Cores++
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		l, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(l)
		if len(f) >= 2 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			m.Memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	return m
}

func unameR() string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return "unknown"
	}
	var b []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
