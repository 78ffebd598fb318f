// Package guest tells a test that it runs in a tests/vm guest, where the
// kernel matrix runs the privileged packages under QEMU's emulation.
package guest

import (
	"os"
	"testing"
)

// In reports whether the process runs in a tests/vm guest (vmrun sets
// TRACER_VM and TRACER_VM_KERNEL there).
func In() bool { return os.Getenv("TRACER_VM") != "" || os.Getenv("TRACER_VM_KERNEL") != "" }

// SkipKernelIndependent skips t in a guest. For a test that asks nothing
// of the kernel: the host's unit and privileged tiers run it already,
// and under emulation it takes ten to twenty times as long, in each of
// the three guests, to prove nothing more.
func SkipKernelIndependent(t testing.TB) {
	t.Helper()
	if In() {
		t.Skip("kernel-independent: the host runs it; a tests/vm guest would only run it slower under emulation")
	}
}
