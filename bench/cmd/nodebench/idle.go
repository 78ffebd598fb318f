package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/nft/nftgen"
	"github.com/tracer-dev/tracer/internal/trace"
)

// idleServices is the size of the node the idle cost is measured on (its
// report says 5,000).
const idleServices = 5000

// idleResult is the full live pipeline's cost on a namespace holding
// kube-proxy's rules for idleServices Services, with no traffic: what the
// tracer costs a big node just by watching it.
type idleResult struct {
	Mode  string
	Rules string // what the namespace holds, counted
	// Start is live.Start's wall time: the programs, the first reading of
	// the rules and their parse.
	Start time.Duration
	// CPU is the CPU time this process and its waited-for children (the
	// watcher's commands) took over Window after the start.
	CPU, Window time.Duration
	Polls       uint64
	RuleReads   uint64
	// Changes are the commits made to the rules during the window (0 for
	// an idle node); Deferred the part reads the watcher put off as too
	// costly to repeat so soon (node.WatchStats.Deferred).
	Changes  int
	Deferred uint64
	Err      string
}

func (r idleResult) core() float64 { return r.CPU.Seconds() / r.Window.Seconds() }

// idleModes are the rule sets: kube-proxy's iptables mode through
// iptables-nft (iptables-restore), and its nftables mode (nft -f, the
// table of internal/nft/nftgen); change commits one more rule, as
// kube-proxy's sync does when a Service or endpoint changes.
var idleModes = []struct {
	mode   string
	load   func(ns netlab.Namespace) (string, error)
	change func(ns netlab.Namespace, k int) error
}{
	{"iptables (iptables-nft)", loadKubeProxyIPTables, changeKubeProxyIPTables},
	{"nftables", loadKubeProxyNFT, changeKubeProxyNFT},
}

// churnEvery is how often the rules change in the churning rows: a big
// cluster's kube-proxy syncs about that often.
const churnEvery = 2 * time.Second

func measureIdle(ctx context.Context, window time.Duration, only []event.Via) []idleResult {
	var out []idleResult
	for _, m := range idleModes {
		for _, churn := range []bool{false, true} {
			if ctx.Err() != nil {
				return out
			}
			var change func(netlab.Namespace, int) error
			if churn {
				change = m.change
			}
			logf("idle: %d Services in kube-proxy's %s mode, %s, rules changing: %v", idleServices, m.mode, window, churn)
			r, err := idleRun(ctx, m.load, change, window, only)
			r.Mode = m.mode
			if err != nil {
				r.Err = err.Error()
			}
			out = append(out, r)
		}
	}
	return out
}

// idleRun measures the live pipeline on a namespace load fills, change
// (when not nil) committing a rule every churnEvery.
func idleRun(ctx context.Context, load func(netlab.Namespace) (string, error), change func(netlab.Namespace, int) error, window time.Duration, only []event.Via) (idleResult, error) {
	var r idleResult
	l, err := netlab.New(fmt.Sprintf("trbidle%d", os.Getpid()%10000))
	if err != nil {
		return r, fmt.Errorf("lab: %w", err)
	}
	defer l.Close()
	ns, err := l.Namespace("node")
	if err != nil {
		return r, fmt.Errorf("lab namespace: %w", err)
	}
	inode, err := ns.Inode()
	if err != nil {
		return r, err
	}
	if r.Rules, err = load(ns); err != nil {
		return r, err
	}
	t0 := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p, err := live.Start(ctx, live.Config{
		Loader:    loader.Config{Netns: []uint32{inode}, NetnsPaths: []string{ns.Path()}, Only: only},
		NetnsPath: ns.Path(), NodeName: "bench", Command: "nodebench", FlowsNotKept: true,
	})
	if err != nil {
		return r, fmt.Errorf("start live pipeline: %w", err)
	}
	r.Start = time.Since(t0)
	done := make(chan error, 1)
	go func() {
		_, err := p.Run(ctx, live.Sink{Flow: func(*trace.Flow) {}})
		done <- err
	}()
	cpu0, w0 := cpuTime(), time.Now()
	end := time.After(window)
	tick := time.NewTicker(churnEvery)
	defer tick.Stop()
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-end:
			break wait
		case <-tick.C:
			if change == nil {
				continue
			}
			if err := change(ns, r.Changes); err != nil {
				return r, fmt.Errorf("change the rules: %w", err)
			}
			r.Changes++
		}
	}
	r.CPU, r.Window = cpuTime()-cpu0, time.Since(w0)
	st := p.Stats()
	r.Polls, r.RuleReads, r.Deferred = st.Node.Polls, st.Node.RuleReads, st.Node.Deferred
	cancel()
	rerr := <-done
	if err := p.Close(); err != nil {
		return r, fmt.Errorf("close live pipeline: %w", err)
	}
	if rerr != nil && ctx.Err() == nil {
		return r, fmt.Errorf("live pipeline: %w", rerr)
	}
	return r, nil
}

// loadKubeProxyIPTables gives ns the rules kube-proxy's iptables mode
// writes for idleServices ClusterIP Services of one port and one endpoint
// each: KUBE-SERVICES with a rule per Service, a KUBE-SVC chain and a
// KUBE-SEP chain each.
func loadKubeProxyIPTables(ns netlab.Namespace) (string, error) {
	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
	b.WriteString(":KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n")
	for i := range idleServices {
		fmt.Fprintf(&b, ":KUBE-SVC-%016X - [0:0]\n:KUBE-SEP-%016X - [0:0]\n", i, i)
	}
	b.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n")
	b.WriteString("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	b.WriteString("-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE --random-fully\n")
	rules := 5
	for i := range idleServices {
		svc, ep := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), fmt.Sprintf("10.244.%d.%d", 2+i/250, i%250+1)
		name := fmt.Sprintf("ns%d/svc:http", i)
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-SVC-%016X\n", svc, name, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%016X -m comment --comment \"%s -> %s:8080\" -j KUBE-SEP-%016X\n", i, name, ep, i)
		fmt.Fprintf(&b, "-A KUBE-SEP-%016X -s %s/32 -m comment --comment \"%s\" -j KUBE-MARK-MASQ\n", i, ep, name)
		fmt.Fprintf(&b, "-A KUBE-SEP-%016X -p tcp -m comment --comment \"%s\" -m tcp -j DNAT --to-destination %s:8080\n", i, name, ep)
		rules += 4
	}
	b.WriteString("COMMIT\n")
	if err := runStdin(ns, b.String(), "iptables-restore"); err != nil {
		return "", fmt.Errorf("iptables-restore: %w", err)
	}
	return fmt.Sprintf("%d iptables rules in %d chains (iptables-restore)", rules, 2*idleServices+3), nil
}

// loadKubeProxyNFT gives ns kube-proxy's nftables-mode table for
// idleServices Services of three endpoints each.
func loadKubeProxyNFT(ns netlab.Namespace) (string, error) {
	script, _, _ := nftgen.KubeProxy(idleServices, 3)
	if err := runStdin(ns, script, "nft", "-f", "-"); err != nil {
		return "", fmt.Errorf("nft -f: %w", err)
	}
	return fmt.Sprintf("table ip kube-proxy: %d Services of 3 endpoints (nft -f)", idleServices), nil
}

// changeKubeProxyIPTables commits one more rule to KUBE-SERVICES, at its
// head, as a new Service's rule moves the rest down.
func changeKubeProxyIPTables(ns netlab.Namespace, k int) error {
	addr := fmt.Sprintf("10.99.%d.%d/32", k/250, k%250+1)
	if out, err := ns.Run("iptables", "-t", "nat", "-I", "KUBE-SERVICES", "-d", addr, "-p", "tcp", "--dport", "80", "-j", "RETURN"); err != nil {
		return fmt.Errorf("iptables -I: %w: %s", err, out)
	}
	return nil
}

// changeKubeProxyNFT commits one more rule to a chain of kube-proxy's
// table (made at the first change).
func changeKubeProxyNFT(ns netlab.Namespace, k int) error {
	script := fmt.Sprintf("add rule ip kube-proxy nodebench-churn ip daddr 10.99.%d.%d tcp dport 80 return\n", k/250, k%250+1)
	if k == 0 {
		script = "add chain ip kube-proxy nodebench-churn\n" + script
	}
	return runStdin(ns, script, "nft", "-f", "-")
}

// runStdin runs a command in ns with input as its standard input.
func runStdin(ns netlab.Namespace, input, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(input)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := ns.RunCmd(cmd); err != nil {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

func (r *report) idleMarkdown(p printer) {
	if len(r.idle) == 0 {
		return
	}
	p("## 9. Watching a node of 5,000 Services: idle, and its rules changing\n\n")
	p("A throwaway namespace holding kube-proxy's rules for 5,000 ClusterIP Services, no traffic, and the full live pipeline on it (`live.Start` + `Run`, as `tracer trace`): ")
	p("the rules are read at the start and then polled every 2 s, with ipsets, native nftables tables, IPVS and listeners. ")
	p("In the rows with *changes*, one more rule is committed every %s during the window (an `iptables -I` at the head of KUBE-SERVICES; an `nft add rule` in kube-proxy's table), as a big cluster's kube-proxy syncs: each commit moves the nftables generation, so each poll after one reads again, unless reading costs more than the tracer allows itself (a part is read again no sooner than ten times its last read took). ", churnEvery)
	p("*CPU* is this process's and its waited-for children's (the watcher's commands) over the window after the start; *rule reads* are the polling rounds that ran iptables-save (the first reading included); *deferred* the part reads put off as too costly.\n\n")
	p("| kube-proxy mode | rules | changes | start | window | CPU | share of one core | polls | rule reads | deferred |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.idle {
		if x.Err != "" {
			p("| %s | not measured: %s | | | | | | | | |\n", x.Mode, x.Err)
			continue
		}
		p("| %s | %s | %d | %s | %s | %s | %.1f%% | %d | %d | %d |\n", x.Mode, x.Rules, x.Changes, x.Start.Round(time.Millisecond), x.Window.Round(time.Millisecond),
			x.CPU.Round(time.Millisecond), 100*x.core(), x.Polls, x.RuleReads, x.Deferred)
	}
	p("\n")
}
