package loader

// The object is built for x86-64 only: kprobe programs read registers by
// the x86-64 calling convention.
//go:generate go tool bpf2go -tags linux -target amd64 -type event tracer ../../bpf/tracer.c -- -I../../bpf -O2 -g -Wall -Werror
//go:generate go tool bpf2go -tags linux -target amd64 -type ct_query ctlookup ../../bpf/ctlookup.c -- -I../../bpf -O2 -g -Wall -Werror
