package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// TestPrivSocketsOutsideNetpoller: the DESTROY socket and the lookup
// socket are in none of the process's epoll sets, so the datagram each
// connection brings (a DESTROY, a lookup's reply) wakes no parked thread.
// They still work: a lookup finds an entry `conntrack -I` made and not one
// it did not; the DESTROY reader's drain reads the DESTROY `conntrack -D`
// queued, and once the reader is closed reads nothing. The truth for "in an
// epoll set" is the kernel's own list of each set's targets
// (/proc/self/fdinfo), checked against a netlink socket that is in Go's
// netpoller, which it must find.
func TestPrivSocketsOutsideNetpoller(t *testing.T) {
	requirePriv(t)
	ns := nodeNamespace(t, "trdr")
	var (
		d *destroyReader
		g *getter
	)
	err := withNetns(ns.Path(), func(nsFD int) (err error) {
		if d, err = newDestroyReader(&netlink.Config{NetNS: nsFD}, 0); err != nil {
			return err
		}
		g, err = newGetter(&netlink.Config{NetNS: nsFD})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	polled, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer polled.Close()
	if !inEpollSet(t, socketInode(t, polledFD(t, polled))) {
		t.Fatal("the netpoller's netlink socket is in no epoll set of the process: the check cannot see one")
	}
	if inEpollSet(t, socketInode(t, d.fd)) {
		t.Error("the DESTROY socket is in an epoll set: every DESTROY wakes a thread")
	}
	if inEpollSet(t, socketInode(t, g.fd)) {
		t.Error("the lookup socket is in an epoll set: every lookup's reply wakes a thread")
	}

	inserter(t, ns)("-p", "tcp", "-s", "10.1.0.1", "-d", "10.1.0.2", "--sport", "40000", "--dport", "80", "--state", "ESTABLISHED")
	tu := event.Tuple{Src: netip.MustParseAddr("10.1.0.1"), Dst: netip.MustParseAddr("10.1.0.2"), SrcPort: 40000, DstPort: 80, Proto: unix.IPPROTO_TCP}
	if e, ok, err := g.get(tu); err != nil || !ok || e.Orig != tu {
		t.Fatalf("lookup of the inserted entry: %+v, %v, %v", e, ok, err)
	}
	tu.SrcPort++
	if e, ok, err := g.get(tu); err != nil || ok {
		t.Fatalf("lookup of an entry nobody made: %+v, %v, %v", e, ok, err)
	}
	mustRun(t, ns, "conntrack", "-D", "-p", "tcp", "-s", "10.1.0.1")
	// The kernel queues the DESTROY before the delete returns.
	var got []Entry
	if err := d.drain(func(e Entry) { got = append(got, e) }); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if len(got) != 1 || got[0].Orig.Src.String() != "10.1.0.1" {
		t.Fatalf("drained %+v, want the one DESTROY of 10.1.0.1's entry", got)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	got = nil
	if err := d.drain(func(e Entry) { got = append(got, e) }); err != nil || len(got) != 0 {
		t.Fatalf("drain after Close: %+v, %v; want nothing", got, err)
	}
}

func polledFD(t *testing.T, c *netlink.Conn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

func socketInode(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// inEpollSet says whether the file of inode ino is a target of any epoll
// set of this process: each target is a "tfd:" line of the epoll fd's
// fdinfo, with the target's inode in hex after "ino:".
func inEpollSet(t *testing.T, ino uint64) bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	want := "ino:" + strconv.FormatUint(ino, 16)
	for _, f := range fds {
		link, err := os.Readlink("/proc/self/fd/" + f.Name())
		if err != nil || link != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + f.Name())
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(fmt.Errorf("read epoll fdinfo: %w", err))
		}
		for _, line := range strings.Split(string(info), "\n") {
			if strings.HasPrefix(line, "tfd:") && strings.Contains(line+" ", " "+want+" ") {
				return true
			}
		}
	}
	return false
}
