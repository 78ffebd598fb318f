# Kernel matrix: the privileged tests on Debian's 5.10, 6.1 and 6.12 kernels
# under QEMU (TCG). Included by the top Makefile; see tests/vm/README.md.
#
#   make test-vm                  all kernels
#   make test-vm KERNEL=6.1       one kernel (KERNEL="5.10 6.12" for several)
#   TRACER_VM_SELFTEST_FAIL=1 make test-vm KERNEL=6.1   must fail (self-test)
#
# Kernels and apt lists are cached in $(TRACER_VM_CACHE) (default tests/vm/cache).
# When tests/controlplane/kubeproxy is among the packages, cp-bin runs first:
# every guest runs one of the two ipvs-mode tests (6.12 also its nftables- and
# iptables-mode tests) with the control-plane binaries the host built (the
# guest has no network, and linking kube-apiserver under TCG would take
# longer than the tests).
VM_KERNELS ?= 5.10 6.1 6.12
VM_TIMEOUT ?= 30m
# The harness's own smoke tests always run, next to the privileged packages.
# internal/lab's TestScenarios is left to the host: under TCG it takes 8 to
# 9 minutes per kernel. cmd/tracer's TestLabScenarios builds and proves the
# same scenarios with the tracer checked on top, each in one guest of the
# three (shared round-robin, labGuest; the host runs them all), and
# TestCapture checks every kernel's decisions of both families.
VM_PKGS    := $(filter-out ./internal/lab,$(PRIV_PKGS)) ./tests/vm/smoke
VMRUN      := $(GO) run ./tests/vm/cmd/vmrun

.PHONY: test-vm vm-fetch

test-vm:
	@if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then \
		echo "test-vm: SKIPPED the VM kernel matrix: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"; \
		exit 0; \
	fi; \
	$(if $(filter ./tests/controlplane/kubeproxy,$(VM_PKGS)),$(MAKE) --no-print-directory cp-bin || exit 1;) \
	$(VMRUN) -test -kernels "$(or $(KERNEL),$(VM_KERNELS))" -timeout $(VM_TIMEOUT) $(VM_PKGS)

# Download and cache the kernels only (for example before going offline).
vm-fetch:
	$(VMRUN) -fetch -kernels "$(or $(KERNEL),$(VM_KERNELS))"
