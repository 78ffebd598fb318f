package loader

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Preflight failures: the caller cannot fix these by retrying, so the
// command reports them as bad input (exit 2) with what to do.
var (
	ErrNoBTF       = errors.New("kernel has no BTF at /sys/kernel/btf/vmlinux: tracer needs a kernel built with CONFIG_DEBUG_INFO_BTF (5.4+ distro kernels have it)")
	ErrNoPrivilege = errors.New("missing privileges")
)

// capability is one of capabilities(7) the tracer asks for, with what it
// is needed for, so a refusal can say what the user would lose.
type capability struct {
	bit  uint
	name string
	why  string
}

var (
	capBPF      = capability{39, "CAP_BPF", "to load the programs and maps"}
	capPerfmon  = capability{38, "CAP_PERFMON", "for tracing programs, which read kernel memory"}
	capNetAdmin = capability{12, "CAP_NET_ADMIN", "to attach netfilter programs and read conntrack, iptables, nftables, ipsets and IPVS"}
	capSysAdmin = capability{21, "CAP_SYS_ADMIN", ""}
)

// LeastCaps is what `tracer trace`, `ui` and `doctor` need in the
// namespace they run in, as setpriv(1) spells it.
const LeastCaps = "+bpf,+perfmon,+net_admin"

// Needs is what a command asks of the kernel beyond loading and attaching
// in its own network namespace.
type Needs struct {
	// SysAdmin, when set, says why the command also needs CAP_SYS_ADMIN
	// (entering or creating network namespaces) and what to do instead.
	SysAdmin    string
	SysAdminFix string
}

// PrivilegeError names each capability the process lacks and why the
// command needs it.
type PrivilegeError struct {
	Missing []string // capability names, e.g. CAP_PERFMON
	msg     string
}

func (e *PrivilegeError) Error() string        { return e.msg }
func (e *PrivilegeError) Is(target error) bool { return target == ErrNoPrivilege }

// Preflight checks what loading needs before anything is touched.
func Preflight(n Needs) error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("preflight: %w", ErrNoBTF)
	}
	caps, err := effectiveCaps()
	if err != nil {
		return fmt.Errorf("preflight: read capabilities: %w", err)
	}
	if err := checkCaps(caps, n); err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("preflight: %w", memlockError(err))
	}
	return nil
}

// memlockError explains a refused memlock limit: kernels before 5.11
// charge BPF maps and programs to RLIMIT_MEMLOCK, and raising its hard
// limit needs CAP_SYS_RESOURCE.
func memlockError(err error) error {
	if !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("raise memlock limit: %w", err)
	}
	var lim unix.Rlimit
	limit := "lower"
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil {
		limit = fmt.Sprintf("%d bytes", lim.Max)
	}
	return &PrivilegeError{
		Missing: []string{"CAP_SYS_RESOURCE"},
		msg: "missing CAP_SYS_RESOURCE (this kernel charges BPF maps to RLIMIT_MEMLOCK, as kernels before 5.11 do, and its hard limit here is " +
			limit + "): grant it, or start the tracer with no memlock limit (prlimit --memlock=unlimited, systemd LimitMEMLOCK=infinity, docker --ulimit memlock=-1)",
	}
}

// checkCaps compares an effective capability set with what n needs.
// CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON, as the kernel's
// bpf_capable and perfmon_capable let it.
func checkCaps(effective uint64, n Needs) error {
	has := func(c capability) bool { return effective&(1<<c.bit) != 0 }
	var missing []capability
	if !has(capSysAdmin) {
		for _, c := range []capability{capBPF, capPerfmon} {
			if !has(c) {
				missing = append(missing, c)
			}
		}
	}
	if !has(capNetAdmin) {
		missing = append(missing, capNetAdmin)
	}
	if n.SysAdmin != "" && !has(capSysAdmin) {
		missing = append(missing, capability{capSysAdmin.bit, capSysAdmin.name, n.SysAdmin})
	}
	if len(missing) == 0 {
		return nil
	}
	e := &PrivilegeError{}
	var parts []string
	for _, c := range missing {
		e.Missing = append(e.Missing, c.name)
		parts = append(parts, c.name+" ("+c.why+")")
	}
	fix := "run as root, or grant CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (setpriv --inh-caps=" + LeastCaps +
		" --ambient-caps=" + LeastCaps + ", or a container's securityContext.capabilities.add)"
	if n.SysAdmin != "" && !has(capSysAdmin) {
		fix = n.SysAdminFix
	}
	e.msg = "missing " + strings.Join(parts, ", ") + ": " + fix
	return e
}

// hasCap reports whether the process holds c; unreadable capabilities
// count as held, so a failure is never blamed on privilege by mistake.
func hasCap(c capability) bool {
	caps, err := effectiveCaps()
	return err != nil || caps&(1<<c.bit) != 0
}

// SysAdminError refuses a plan that lost hooks only to privilege: tracing
// on without them would hide the decisions they report.
func SysAdminError(lost []string) error {
	return &PrivilegeError{
		Missing: []string{capSysAdmin.name},
		msg: "missing CAP_SYS_ADMIN on this kernel, for " + strings.Join(lost, "; ") +
			": grant it, or run as root (`tracer doctor` shows every hook's ladder; kernels with BPF netfilter hooks, 6.4+, need only CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN)",
	}
}

func effectiveCaps() (uint64, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, err
	}
	return uint64(data[0].Effective) | uint64(data[1].Effective)<<32, nil
}
