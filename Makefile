# tracer: build, test, demo. `make test` is what CI runs (see .ci/run).
GO        ?= go
BIN       := bin/tracer
PKGS      := ./...
# Packages whose privileged tests also run in the VM kernel matrix.
# tests/controlplane/kubeproxy (etcd, kube-apiserver, the real kube-proxy
# and the live tracer) runs there only what the host cannot: ipvs mode (one
# test on 5.10, one on 6.1) and nftables mode on 6.12; under TCG its control
# planes cost one to four minutes each.
PRIV_PKGS ?= ./internal/loader/... ./internal/conntrack ./internal/enrich/... ./internal/live ./internal/netns ./internal/netlab ./internal/lab ./cmd/tracer ./tests/controlplane/kubeproxy

.PHONY: all build deps generate test test-unit test-priv test-vm test-cp cp-bin demo bench soak clean check-generated image

# Debian packages the build, the tests and the demo need (idempotent).
DEB_PKGS := clang llvm libbpf-dev bpftool iptables ipset ipvsadm conntrack \
	containernetworking-plugins qemu-system-x86 busybox-static kmod cpio tmux \
	iproute2 nftables xz-utils procps curl

all: build

deps:
	@missing=$$(for p in $(DEB_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	$(GO) mod download

build:
	$(GO) build -o $(BIN) ./cmd/tracer

# The container image, without a container daemon (tools/image): the
# tracer and this machine's Debian iptables, ipset and nft, as a tarball
# for `docker load`, `podman load` or `ctr images import`.
image: build
	$(GO) run -C tools/image . -binary $(CURDIR)/$(BIN) -out $(CURDIR)/bin/tracer-image.tar

# Regenerate the bpf2go output (needs clang); the output is committed.
generate:
	$(GO) generate ./internal/loader/...

# Fails when the committed bpf2go output is stale (only when clang is present).
check-generated:
	@if command -v clang >/dev/null 2>&1; then \
		$(GO) generate ./internal/loader/... && \
		git diff --exit-code --stat -- internal/loader/ || { echo "bpf2go output is stale: run make generate and commit"; exit 1; }; \
	else echo "check-generated: clang not installed, skipped"; fi

test-unit:
	$(GO) vet $(PKGS)
	$(GO) test -short -count=1 $(PKGS)

# Privileged tier on this machine's kernel (every package without -short):
# needs root. -p 1: the tests share the kernel's hooks and namespaces. The
# real kube-apiserver, etcd and portmap are built first (minutes when cold).
test-priv: cp-bin
	$(GO) test -count=1 -p 1 -timeout $(CP_TIMEOUT) $(PKGS)

# kube-apiserver and etcd for the tests against a real control plane, and
# the portmap CNI plugin releases the nftables tests run, built once per
# machine into tests/controlplane/.cache/bin.
CP_TIMEOUT ?= 45m
cp-bin:
	$(GO) test -count=1 -timeout $(CP_TIMEOUT) -run 'TestEnsureBinaries|TestEnsurePortmap' ./tests/controlplane/cphelper

test-cp: cp-bin
	$(GO) test -count=1 -timeout $(CP_TIMEOUT) ./tests/controlplane/...

test: deps check-generated test-unit test-priv test-vm

demo: deps build
	./$(BIN) lab

# Cost on the node, loss, userspace throughput, memory and attach time next
# to conntrack -E and nft tracing; writes BENCHMARKS.md (root, ~6 min).
# With qemu-system-x86_64, also the overhead rounds in a QEMU guest per
# kernel of BENCH_VM (the kprobe and fentry tiers, under emulation; about
# 1.5-2.5 min per kernel with the default 4 rounds: 2m15s each with 6 rounds
# and 1.5-2.5 min with 3, boot included). 6.12:kprobe+... is 6.12 again with
# fentry left out, so one kernel shows both tiers. BENCH_VM= skips them.
BENCH_VM ?= 5.10 6.1 6.12 6.12:kprobe+tracepoint+netfilter
bench: deps
	$(GO) run ./bench/cmd/nodebench -out BENCHMARKS.md \
		$(if $(and $(strip $(BENCH_VM)),$(shell command -v qemu-system-x86_64)),-vm "$(BENCH_VM)")

# The soak (issue 16): TestSoak for SOAK_TIME (an hour) under churn and
# load, its samples and figures written to SOAK.md; make test runs it for
# 30 s. Root.
SOAK_TIME ?= 60m
soak: deps
	TRACER_SOAK=$(SOAK_TIME) TRACER_SOAK_REPORT=$(CURDIR)/SOAK.md $(GO) test -count=1 -run '^TestSoak$$' -timeout 3h -v ./cmd/tracer

clean:
	rm -rf bin

include tests/vm/vm.mk
