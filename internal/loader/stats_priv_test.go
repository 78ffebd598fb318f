package loader

import (
	"slices"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
)

// TestProgramStatsCount makes real DNAT'd connections through a throwaway
// router namespace with run statistics enabled, and checks that the
// kernel counted runs and run time for the program of the NAT hook, and
// that every attached hook has its program in the statistics.
func TestProgramStatsCount(t *testing.T) {
	requirePrivileged(t)
	tp := newTopology(t)
	serve(t, tp.s, sAddr+":8080")
	run(t, tp.r, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", vip, "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", sAddr+":8080")
	ino, err := tp.r.Inode()
	must(t, err)
	trc, err := Open(Config{Netns: []uint32{ino}, NetnsPaths: []string{tp.r.Path()}})
	must(t, err)
	defer trc.Close()
	stats, err := EnableRunStats()
	must(t, err)
	defer stats.Close()
	before := natStat(t, trc)
	const conns = 20
	for range conns {
		mustConnect(t, tp.c, vip+":80")
	}
	after := natStat(t, trc)
	t.Logf("%s (%s): %d runs, %v run time over %d connections", after.Program, after.Via,
		after.Runs-before.Runs, after.RunTime-before.RunTime, conns)
	if after.Runs-before.Runs < conns {
		t.Errorf("%s ran %d times for %d DNAT'd connections, want at least one run each", after.Program, after.Runs-before.Runs, conns)
	}
	if after.RunTime <= before.RunTime {
		t.Errorf("%s run time did not advance: %v then %v", after.Program, before.RunTime, after.RunTime)
	}
	all, err := trc.ProgramStats()
	must(t, err)
	for _, hp := range trc.Plan {
		served := slices.ContainsFunc(all, func(s ProgramStat) bool { return slices.Contains(s.Hooks, hp.Hook) })
		if hp.Via != event.ViaNone && !served {
			t.Errorf("hook %s is attached (%s) but no program's statistics name it: %+v", hp.Hook, hp.Via, all)
		}
	}
}

// natStat is the statistics of the program that reports NAT decisions
// (the DNAT one when the netfilter tier serves NAT with two programs).
func natStat(t *testing.T, trc *Tracer) ProgramStat {
	t.Helper()
	all, err := trc.ProgramStats()
	must(t, err)
	for _, s := range all {
		if slices.Contains(s.Hooks, event.HookNFNat) {
			return s
		}
	}
	t.Fatalf("no attached program serves %s: %+v", event.HookNFNat, all)
	return ProgramStat{}
}
