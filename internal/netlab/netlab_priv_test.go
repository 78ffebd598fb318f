package netlab

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Run and Sysctl act inside the namespace without `ip netns exec`: a
// value set there is what a command run there reads, and the caller's
// namespace keeps its own.
func TestRunAndSysctlStayInNamespace(t *testing.T) {
	ns := testNamespace(t, "a")
	const key, path = "net.ipv4.ip_default_ttl", "/proc/sys/net/ipv4/ip_default_ttl"
	host, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "37"
	if strings.TrimSpace(string(host)) == want {
		want = "38"
	}
	if err := ns.Sysctl(key, want); err != nil {
		t.Fatal(err)
	}
	got, err := ns.Run("cat", path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(got) != want {
		t.Errorf("%s inside the namespace = %q, want %s", key, got, want)
	}
	// A command started by Run sees the namespace's links, not the host's.
	links, err := ns.Run("ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(strings.TrimSpace(links), "\n") + 1; n != 1 || !strings.Contains(links, " lo:") {
		t.Errorf("links inside a fresh namespace: want only lo, got:\n%s", links)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(host) {
		t.Errorf("the host's %s changed from %q to %q", key, host, after)
	}
}

// Do hands its thread back instead of retiring it: a retired thread takes
// with it, by their parent-death signal, the long-lived children it once
// started (a kube-apiserver under test was killed that way).
func TestDoKeepsThread(t *testing.T) {
	ns := testNamespace(t, "b")
	var tid int
	if err := ns.Do(func() error { tid = unix.Gettid(); return nil }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err != nil {
		t.Errorf("Do's thread %d is gone (%v): it was retired, not handed back", tid, err)
	}
}

// testNamespace is a fresh namespace for one privileged test, deleted when
// it ends.
func testNamespace(t *testing.T, name string) Namespace {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged tier: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged tier: needs root")
	}
	l, err := New("trnetlab-" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	ns, err := l.Namespace(name)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// SNMP counts what the namespace itself sent: a fresh namespace has sent
// no ICMPv6 error until a datagram to a closed port of its own draws one.
func TestSNMPCountsTheNamespace(t *testing.T) {
	ns := testNamespace(t, "snmp")
	before, err := ns.SNMP()
	if err != nil {
		t.Fatal(err)
	}
	if n := before["Icmp6:OutDestUnreachs"]; n != 0 {
		t.Fatalf("a fresh namespace has sent %d ICMPv6 errors", n)
	}
	err = ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, []byte("x"), 0, &unix.SockaddrInet6{Port: 9, Addr: [16]byte{15: 1}})
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := ns.SNMP()
	if err != nil {
		t.Fatal(err)
	}
	if n := after["Icmp6:OutDestUnreachs"]; n != 1 {
		t.Errorf("Icmp6:OutDestUnreachs = %d after one datagram to a closed port, want 1", n)
	}
}
