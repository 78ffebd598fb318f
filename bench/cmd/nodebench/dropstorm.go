package main

import (
	"context"
	"fmt"
	"time"
)

// A drop storm is the flood's datagrams dropped in R before its DNAT:
// every datagram is a drop the tracer reports, joins and writes, the load
// of a node whose firewall or conntrack table is turning connections
// away. Its cost is the full live pipeline's own CPU per drop.
type dropStorm struct {
	Kind string
	Rate int
	// Load's OK is the DROP rule's own packet count over the window.
	Load load
	Live observed
}

// stormKind is where R drops the storm: a table and the DROP rule's
// matches beyond the flood's address and port.
type stormKind struct {
	name, table string
	match       []string
}

// stormKinds: in mangle, after conntrack gave each datagram its new
// entry, as a firewall rule on conntrack's NEW drops; in raw, before
// conntrack, as a raw table rule (and conntrack itself, its table full)
// drops a packet that has no entry.
var stormKinds = []stormKind{
	{"new connections, each with its new conntrack entry (mangle PREROUTING, `-m conntrack --ctstate NEW -j DROP`)", "mangle", []string{"-m", "conntrack", "--ctstate", "NEW"}},
	{"packets without a conntrack entry (raw PREROUTING, `-j DROP`)", "raw", nil},
}

// rule is the iptables command that adds (-I) or deletes (-D) k's rule.
func (k stormKind) rule(op string) []string {
	r := append([]string{"iptables", "-t", k.table, op, "PREROUTING", "-d", vip, "-p", "udp", "--dport", fmt.Sprint(uport)}, k.match...)
	return append(r, "-j", "DROP")
}

// dropStorms runs each kind of storm at each rate with the full live
// pipeline attached alone.
func dropStorms(ctx context.Context, b *lab, rates []int, d time.Duration) ([]dropStorm, error) {
	var out []dropStorm
	for _, rate := range rates {
		for _, k := range stormKinds {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			s, err := b.dropStorm(ctx, k, rate, d)
			if err != nil {
				return out, fmt.Errorf("drop storm in %s at %d a second: %w", k.table, rate, err)
			}
			out = append(out, s)
			logf("drop storm %-6s %6d/s: %d drops at %.0f/s, live saw %d events, lost %d, own CPU %s (%.1f µs a drop; %s)",
				k.table, rate, s.Load.OK, s.Load.rate(), s.Live.Events, s.Live.Lost, s.Live.OwnCPU.Round(time.Millisecond), s.ownPerDrop(), s.Live.Extra)
		}
	}
	return out, nil
}

// dropStorm runs one storm once R's table is empty (settleConntrack: the
// flood's entries, and a storm's before it).
func (b *lab) dropStorm(ctx context.Context, k stormKind, rate int, d time.Duration) (dropStorm, error) {
	if err := b.settleConntrack(ctx); err != nil {
		return dropStorm{}, err
	}
	if err := nsRun(b.r, k.rule("-I")...); err != nil {
		return dropStorm{}, err
	}
	defer nsRun(b.r, k.rule("-D")...)
	count := func() (uint64, error) { return b.r.RulePackets(k.table, "-A PREROUTING", "-j DROP") }
	live, l, err := observeAlone(b, "live", func() (load, error) { return b.floodCounted(ctx, rate, d, count) })
	if err != nil {
		return dropStorm{}, err
	}
	return dropStorm{Kind: k.name, Rate: rate, Load: l, Live: live}, nil
}

// settleConntrack waits, up to a minute, until R's conntrack table holds
// fewer than settledEntries: a flood before leaves hundreds of thousands
// of entries that end over the next seconds, whose ends would be the
// storm's load too.
func (b *lab) settleConntrack(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := b.r.Run("cat", "/proc/sys/net/netfilter/nf_conntrack_count")
		if err != nil {
			return fmt.Errorf("read R's conntrack count: %w", err)
		}
		var n int
		if _, err := fmt.Sscan(out, &n); err != nil {
			return fmt.Errorf("read R's conntrack count %q: %w", out, err)
		}
		if n < settledEntries || time.Now().After(deadline) || ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(500 * time.Millisecond)
	}
}

const settledEntries = 1000

// ownPerDrop is the live pipeline's own CPU per drop, in µs.
func (s dropStorm) ownPerDrop() float64 {
	if s.Load.OK == 0 {
		return 0
	}
	return float64(s.Live.OwnCPU.Microseconds()) / float64(s.Load.OK)
}

func (r *report) stormMarkdown(p printer) {
	if len(r.storms) == 0 {
		return
	}
	p("### 3c. Drop storms\n\n")
	p("The flood's datagrams, dropped in R before its DNAT: every one is a drop the full live pipeline (alone, as in 3b) reports, joins and writes as a flow, the load of a node whose firewall or full conntrack table is turning connections away. ")
	p("*drops* is the DROP rule's own packet count over the %s window; *events* what the tracer delivered; *own CPU* its process's CPU time over the window, and per drop.\n\n", r.cfg.rampStep)
	p("| dropped | asked/s | drops | drops/s | events | lost | own CPU | own µs/drop | the pipeline says |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.storms {
		p("| %s | %d | %d | %.0f | %d | %d | %s | %.1f | %s |\n", s.Kind, s.Rate, s.Load.OK, s.Load.rate(), s.Live.Events, s.Live.Lost, s.Live.OwnCPU.Round(time.Millisecond), s.ownPerDrop(), s.Live.Extra)
	}
	p("\n")
}
