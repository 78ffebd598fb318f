package live

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// TestHeaderSaysHowConntrackIsRead: the header's conntrack line says what
// the kernel shows of the tracer. Its lookups are BPF exactly where
// /proc/kallsyms has conntrack's lookup kfunc, and the summary then
// counts BPF lookups for the connections made; its ends are DESTROY
// events exactly where one of the tracer's own sockets in the observed
// namespace is a netfilter netlink socket subscribed to conntrack's
// DESTROY group (/proc/net/netlink there), and nf_ct_delete where none is.
func TestHeaderSaysHowConntrackIsRead(t *testing.T) {
	b := newStopLab(t)
	ino, err := b.r.Inode()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := b.start(ctx, t, 200*time.Millisecond)
	h := p.Header()
	if len(h.Conntrack) != 1 {
		t.Fatalf("header conntrack %+v: want the observed namespace's", h.Conntrack)
	}
	src := h.Conntrack[0]
	t.Logf("header conntrack: %+v", src)
	if src.Netns != b.r.Path() || src.Inode != ino {
		t.Errorf("header conntrack is of %s (inode %d), want %s (%d)", src.Netns, src.Inode, b.r.Path(), ino)
	}

	kfunc := kallsymsHas(t, "bpf_xdp_ct_lookup")
	switch {
	case kfunc && src.Lookups != trace.LookupsBPF:
		t.Errorf("lookups %q (%s), but /proc/kallsyms has bpf_xdp_ct_lookup", src.Lookups, src.LookupsWhy)
	case !kfunc && (src.Lookups != trace.LookupsNetlink || src.LookupsWhy == ""):
		t.Errorf("lookups %q (why %q), but /proc/kallsyms has no bpf_xdp_ct_lookup: want netlink and why", src.Lookups, src.LookupsWhy)
	}

	subscribed := destroySubscribers(t, b.r)
	switch {
	case subscribed > 0 && src.Ends != trace.EndsDestroyEvents:
		t.Errorf("ends %q, but %d of the tracer's sockets in %s subscribe to conntrack's DESTROY events", src.Ends, subscribed, b.r.Path())
	case subscribed == 0 && src.Ends != trace.EndsKernel:
		t.Errorf("ends %q, but none of the tracer's sockets in %s subscribes to conntrack's DESTROY events", src.Ends, b.r.Path())
	}

	done := make(chan trace.Summary, 1)
	go func() {
		sum, err := p.Run(ctx, Sink{Flow: func(*trace.Flow) {}})
		if err != nil {
			t.Errorf("run: %v", err)
		}
		done <- sum
	}()
	made := b.send(t, 20)
	time.Sleep(time.Second) // the flows' linger, and their lookups
	cancel()
	sum := <-done
	t.Logf("%d connections made, summary: %d flows, %d conntrack entries asked by BPF, lookups off %q",
		made, sum.Flows, sum.ConntrackBPFLookups, sum.ConntrackLookupsOff)
	switch {
	case src.Lookups == trace.LookupsBPF && (sum.ConntrackBPFLookups < made || sum.ConntrackLookupsOff != ""):
		t.Errorf("BPF lookups: %d entries asked by BPF for %d connections (off %q); want one each at least", sum.ConntrackBPFLookups, made, sum.ConntrackLookupsOff)
	case src.Lookups == trace.LookupsNetlink && (sum.ConntrackBPFLookups != 0 || sum.ConntrackLookupsOff == ""):
		t.Errorf("netlink lookups: %d entries asked by BPF (off %q); want none, and why", sum.ConntrackBPFLookups, sum.ConntrackLookupsOff)
	}
}

// kallsymsHas reports whether /proc/kallsyms lists the function name. It
// reads the file itself, not through the loader's parser, so the check
// does not rest on the code it checks.
func kallsymsHas(t *testing.T, name string) bool {
	t.Helper()
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) >= 3 && fs[2] == name {
			return true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return false
}

// destroySubscribers counts this process's sockets that /proc/net/netlink,
// read in the namespace, lists as NETLINK_NETFILTER sockets subscribed to
// NFNLGRP_CONNTRACK_DESTROY (group 3: bit 2 of the groups mask).
func destroySubscribers(t *testing.T, ns netlab.Namespace) int {
	t.Helper()
	out, err := ns.Run("cat", "/proc/net/netlink")
	if err != nil {
		t.Fatalf("read /proc/net/netlink in %s: %v", ns.Name, err)
	}
	mine := socketInodes(t)
	n := 0
	for _, line := range strings.Split(out, "\n")[1:] {
		fs := strings.Fields(line)
		if len(fs) < 10 {
			continue
		}
		proto, err1 := strconv.Atoi(fs[1])
		groups, err2 := strconv.ParseUint(fs[3], 16, 64)
		inode, err3 := strconv.ParseUint(fs[9], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("parse /proc/net/netlink line %q", line)
		}
		if proto == 12 && groups&(1<<2) != 0 && mine[inode] {
			n++
		}
	}
	return n
}

// socketInodes are the inodes of this process's sockets.
func socketInodes(t *testing.T) map[uint64]bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]bool{}
	for _, fd := range fds {
		link, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err != nil {
			continue // closed meanwhile (the ReadDir's own fd)
		}
		var ino uint64
		if _, err := fmt.Sscanf(link, "socket:[%d]", &ino); err == nil {
			out[ino] = true
		}
	}
	return out
}
