package loader

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Preflight failures: the caller cannot fix these by retrying, so the
// command reports them as bad input (exit 2) with what to do.
var (
	ErrNoBTF       = errors.New("kernel has no BTF at /sys/kernel/btf/vmlinux: tracer needs a kernel built with CONFIG_DEBUG_INFO_BTF (5.4+ distro kernels have it)")
	ErrNoPrivilege = errors.New("need CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN: run as root")
)

// Capability numbers (linux/capability.h).
const (
	capNetAdmin = 12
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

// Preflight checks what loading needs before anything is touched.
func Preflight() error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("preflight: %w", ErrNoBTF)
	}
	caps, err := effectiveCaps()
	if err != nil {
		return fmt.Errorf("preflight: read capabilities: %w", err)
	}
	has := func(c uint) bool { return caps&(1<<c) != 0 }
	bpfOK := has(capSysAdmin) || (has(capBPF) && has(capPerfmon))
	if !bpfOK || !has(capNetAdmin) {
		return fmt.Errorf("preflight: %w", ErrNoPrivilege)
	}
	return nil
}

func effectiveCaps() (uint64, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, err
	}
	return uint64(data[0].Effective) | uint64(data[1].Effective)<<32, nil
}
