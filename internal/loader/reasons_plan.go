package loader

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"

	"github.com/tracer-dev/tracer/internal/event"
)

// Reasons lists, one hook a line, why each hook did or did not attach.
func (p Plan) Reasons() string {
	var b strings.Builder
	for _, h := range p {
		fmt.Fprintf(&b, "  %s: %s\n", h.Hook, h.Summary())
	}
	return b.String()
}

// Summary says in a line how the hook is attached, or why it is not.
func (h HookPlan) Summary() string {
	if h.Via != event.ViaNone {
		s := fmt.Sprintf("%s %s", h.Via, h.Target)
		if len(h.Attempts) > 1 {
			s += " (" + h.failures() + ")"
		}
		return s
	}
	if h.NotAsked {
		return "not attached: not asked for"
	}
	if len(h.Attempts) == 0 {
		return "not attached: no method selected"
	}
	return "not attached: " + h.failures()
}

func (h HookPlan) failures() string {
	var parts []string
	seen := map[string]bool{}
	for _, a := range h.Attempts {
		if a.Err == nil {
			continue
		}
		s := fmt.Sprintf("%s: %s", a.Via, h.explain(a))
		if !seen[s] {
			seen[s] = true
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "; ")
}

// Explain says why the attempt failed, in words a user understands.
func (a Attempt) Explain() string {
	if a.Err == nil {
		return ""
	}
	msg := a.Err.Error()
	lacking := strings.Contains(msg, "bad CO-RE relocation") || strings.Contains(msg, "th argument") ||
		strings.Contains(msg, "invalid bpf_context access") || errors.Is(a.Err, syscall.EINVAL) && a.Via == event.ViaTracepoint
	if a.Needs != "" && lacking && (a.Via == event.ViaTracepoint || kernelHasSymbol(a.Target)) {
		return "needs " + a.Needs + ", which this kernel lacks"
	}
	if a.Via == event.ViaFentry && kernelHasSymbol(a.Target) {
		if mod := moduleWithoutBTF(a.Target); mod != "" {
			return fmt.Sprintf("%s is in module %s, which has no BTF on this kernel (module BTF came in 5.11)", a.Target, mod)
		}
	}
	if why := a.needsSysAdmin(); why != "" {
		return why
	}
	return Explain(a.Via, a.Target, a.Err)
}

// needsSysAdmin says why the attempt failed when the kernel refused this
// process, not the hook: root would have attached it. fentry on a module's
// function attaches through the module's BTF, which the kernel hands out
// (BPF_BTF_GET_FD_BY_ID) only to CAP_SYS_ADMIN; Debian's kernels default
// kernel.perf_event_paranoid to 3, which keeps perf events, kprobes among
// them, to CAP_SYS_ADMIN as well.
func (a Attempt) needsSysAdmin() string {
	if a.Err == nil || hasCap(capSysAdmin) || !kernelHasSymbol(a.Target) {
		return ""
	}
	denied := errors.Is(a.Err, syscall.EPERM) || errors.Is(a.Err, syscall.EACCES)
	switch {
	case a.Via == event.ViaFentry && symbolModule(a.Target) != "" && moduleWithoutBTF(a.Target) == "" && (denied || errors.Is(a.Err, ebpf.ErrNotSupported)):
		return fmt.Sprintf("fentry on %s, in module %s, needs CAP_SYS_ADMIN: the kernel hands a module's BTF only to it", a.Target, symbolModule(a.Target))
	case a.Via == event.ViaKprobe && denied:
		return "kprobes need CAP_SYS_ADMIN here: kernel.perf_event_paranoid is " + perfEventParanoid() + ", which keeps perf events to it"
	}
	return ""
}

func perfEventParanoid() string {
	b, err := os.ReadFile("/proc/sys/kernel/perf_event_paranoid")
	if err != nil {
		return "unreadable"
	}
	return strings.TrimSpace(string(b))
}

// LostToPrivilege lists the hooks left without any method only because the
// process lacks CAP_SYS_ADMIN (root would attach them), with why.
func (p Plan) LostToPrivilege() []string {
	var out []string
	for _, h := range p {
		if h.Via != event.ViaNone {
			continue
		}
		for _, a := range h.Attempts {
			if why := a.needsSysAdmin(); why != "" {
				out = append(out, h.Hook.String()+" ("+why+")")
				break
			}
		}
	}
	return out
}

// Explain says why one of the hook's attempts failed. A kernel that
// attached other hooks by fentry does allow fentry: the trampoline refused
// this one function.
func (h HookPlan) Explain(a Attempt) string { return h.explain(a) }

func (h HookPlan) explain(a Attempt) string {
	e := a.Explain()
	if a.Via == event.ViaFentry && e == fentryUnsupported && h.fentryElsewhere {
		return fmt.Sprintf("the BPF trampoline cannot attach to %s on this kernel (functions with more than 6 arguments need Linux 6.5+)", a.Target)
	}
	return e
}

const fentryUnsupported = "this kernel does not allow fentry (BPF tracing) programs"

// Explain turns an attach error into words a user understands.
func Explain(via event.Via, target string, err error) string {
	msg := err.Error()
	if (via == event.ViaFentry || via == event.ViaKprobe) && !kernelHasSymbol(target) {
		return fmt.Sprintf("%s is not in the running kernel (its module is not loaded, or the kernel lacks it)", target)
	}
	switch {
	case via == event.ViaFentry && strings.Contains(msg, "not found"):
		return fmt.Sprintf("%s has no BTF here (the kernel lacks module BTF)", target)
	case via == event.ViaFentry && (errors.Is(err, syscall.EPERM) || errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, syscall.Errno(524))):
		return fentryUnsupported
	case via == event.ViaFentry && errors.Is(err, syscall.E2BIG):
		return fmt.Sprintf("this kernel cannot trace %s with fentry (too many arguments for its BPF trampoline)", target)
	case via == event.ViaKprobe && !hasKprobes():
		return "this kernel has no kprobes (CONFIG_KPROBES off)"
	case via == event.ViaTracepoint && (errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT)):
		return fmt.Sprintf("tracepoint %s does not exist on this kernel", target)
	case via == event.ViaTracepoint && errors.Is(err, syscall.EINVAL):
		return fmt.Sprintf("tracepoint %s has fewer arguments on this kernel", target)
	case via == event.ViaNetfilter && (errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EOPNOTSUPP)):
		return "this kernel has no BPF netfilter hooks (needs 6.4+ with CONFIG_NETFILTER_BPF_LINK)"
	case strings.Contains(msg, "bad CO-RE relocation"):
		return fmt.Sprintf("the kernel lacks the types the %s program reads", target)
	}
	if i := strings.Index(msg, "\n"); i > 0 {
		msg = msg[:i]
	}
	return msg
}

// hasKprobes: a kernel with kprobes has the kprobe PMU (4.17+) or the
// tracefs kprobe_events file.
func hasKprobes() bool {
	for _, p := range []string{"/sys/bus/event_source/devices/kprobe", "/sys/kernel/tracing/kprobe_events", "/sys/kernel/debug/tracing/kprobe_events"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// moduleWithoutBTF names the module a function lives in when that module
// has no BTF (kernels before 5.11 have none), else "".
func moduleWithoutBTF(sym string) string {
	mod := symbolModule(sym)
	if mod == "" {
		return ""
	}
	if _, err := os.Stat("/sys/kernel/btf/" + mod); err == nil {
		return ""
	}
	return mod
}
