package loader

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// EnableRunStats makes the kernel count the runs and run time of every BPF
// program until the returned Closer is closed. It uses the BPF_ENABLE_STATS
// command rather than the kernel.bpf_stats_enabled sysctl, so the setting
// belongs to this process and ends with it: the tracer never changes the
// system it observes.
func EnableRunStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable bpf run statistics: %w", err)
	}
	return c, nil
}

// ProgramStat is what the kernel counted for one attached program. The
// counters are cumulative since the program was loaded and advance only
// while run statistics are enabled (by anyone), so callers take differences.
type ProgramStat struct {
	// Program is its name in bpf/tracer.c.
	Program string
	Via     event.Via
	// Hooks are the hooks whose events it reports (a netfilter-tier
	// program serves several).
	Hooks   []event.Hook
	Runs    uint64
	RunTime time.Duration
}

// attachedProgram is a program of the object that some hook attached.
type attachedProgram struct {
	name string
	via  event.Via
	hook event.Hook // the hook whose ladder attached it (not for netfilter)
	prog *ebpf.Program
	link link.Link // nil for the netfilter tier, whose links serve several hooks
}

// ProgramStats returns the kernel's run count and run time of every
// attached program, in attach order.
func (t *Tracer) ProgramStats() ([]ProgramStat, error) {
	t.attachMu.Lock()
	defer t.attachMu.Unlock()
	out := make([]ProgramStat, 0, len(t.progs))
	for _, a := range t.progs {
		s, err := a.prog.Stats()
		if err != nil {
			return nil, fmt.Errorf("read run statistics of %s: %w", a.name, err)
		}
		out = append(out, ProgramStat{Program: a.name, Via: a.via, Hooks: programHooks(t.Plan, a),
			Runs: s.RunCount, RunTime: s.Runtime})
	}
	return out, nil
}

// programHooks lists the hooks of the plan a program serves: the hook
// that attached it, or for the netfilter tier every hook it stands in for.
func programHooks(plan Plan, a attachedProgram) []event.Hook {
	if a.via != event.ViaNetfilter {
		return []event.Hook{a.hook}
	}
	var hooks []event.Hook
	for _, hp := range plan {
		if hp.Via == event.ViaNetfilter && nfServes(a.name, nfRoleOf(hp.Hook)) {
			hooks = append(hooks, hp.Hook)
		}
	}
	return hooks
}

// nfServes says the netfilter tier attaches program for a hook of role
// (nfAttachments is where that is decided).
func nfServes(program string, role uint32) bool {
	return role != 0 && slices.ContainsFunc(nfAttachments(role), func(a nfAttach) bool { return a.prog == program })
}

// nfRoleOf is the netfilter role of a hook's netfilter rung (0: none).
func nfRoleOf(h event.Hook) uint32 {
	i := slices.IndexFunc(ladders[h], func(r rung) bool { return r.attach == nil })
	if i < 0 {
		return 0
	}
	return ladders[h][i].nfRole
}
