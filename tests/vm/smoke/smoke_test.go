// Package smoke proves the VM matrix guests can do what the tracer's
// privileged tests need: IPVS, netfilter tools, namespaces, CNI plugins.
// It runs only inside a vmrun guest (TRACER_VM=1) as root; on the build host
// (no IPVS, no dummy driver) it skips.
package smoke

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// requireGuest skips unless running as root inside the VM matrix.
func requireGuest(t *testing.T) {
	t.Helper()
	if os.Getenv("TRACER_VM") == "" {
		t.Skip("not in the VM matrix (TRACER_VM unset): the build host has no IPVS; run make test-vm")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// sh runs a command and fails the test with its output when it fails.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// netns is a named network namespace made with ip netns add.
type netns struct{ name string }

func newNetns(t *testing.T, name string) netns {
	t.Helper()
	name = fmt.Sprintf("%s-%d", name, os.Getpid())
	sh(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	n := netns{name}
	n.ip(t, "link", "set", "lo", "up")
	return n
}

func (n netns) ip(t *testing.T, args ...string) string {
	t.Helper()
	return sh(t, "ip", append([]string{"-n", n.name}, args...)...)
}

func (n netns) exec(t *testing.T, args ...string) string {
	t.Helper()
	return sh(t, "ip", append([]string{"netns", "exec", n.name}, args...)...)
}

// do runs fn on an OS thread switched into the namespace. Sockets created by
// fn stay in that namespace after the thread is gone. The thread is never
// unlocked, so the runtime discards it instead of reusing it elsewhere.
func (n netns) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + n.name)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", n.name, err)
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", n.name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// veth connects a and b with a veth pair and addresses both ends.
func veth(t *testing.T, a netns, aIf, aAddr string, b netns, bIf, bAddr string) {
	t.Helper()
	sh(t, "ip", "link", "add", aIf, "netns", a.name, "type", "veth", "peer", "name", bIf, "netns", b.name)
	a.ip(t, "addr", "add", aAddr, "dev", aIf)
	a.ip(t, "link", "set", aIf, "up")
	b.ip(t, "addr", "add", bAddr, "dev", bIf)
	b.ip(t, "link", "set", bIf, "up")
}

// Addresses from the documentation ranges, only ever inside the test's own
// namespaces of the guest.
const (
	clientIP   = "198.51.100.2"
	directorC  = "198.51.100.1"
	serverIP   = "203.0.113.2"
	directorS  = "203.0.113.1"
	vip        = "192.0.2.10"
	serverPort = "8080"
)

// TestIPVSMasquerade sends a real TCP connection from a client namespace to
// an IPVS virtual server in a director namespace, which masquerades it to a
// Go server in a server namespace.
func TestIPVSMasquerade(t *testing.T) {
	requireGuest(t)
	sh(t, "modprobe", "-a", "ip_vs", "ip_vs_rr", "nf_conntrack", "dummy")

	client := newNetns(t, "client")
	director := newNetns(t, "director")
	server := newNetns(t, "server")
	veth(t, client, "cl0", clientIP+"/24", director, "dc0", directorC+"/24")
	veth(t, server, "sv0", serverIP+"/24", director, "ds0", directorS+"/24")
	client.ip(t, "route", "add", "default", "via", directorC)
	server.ip(t, "route", "add", "default", "via", directorS)
	director.exec(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	// Like kube-proxy's kube-ipvs0: the VIP is local to the director on a dummy device.
	director.ip(t, "link", "add", "vip0", "type", "dummy")
	director.ip(t, "addr", "add", vip+"/32", "dev", "vip0")
	director.ip(t, "link", "set", "vip0", "up")
	director.exec(t, "ipvsadm", "-A", "-t", vip+":80", "-s", "rr")
	director.exec(t, "ipvsadm", "-a", "-t", vip+":80", "-r", serverIP+":"+serverPort, "-m")

	var ln net.Listener
	if err := server.do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(serverIP, serverPort))
		return err
	}); err != nil {
		t.Fatalf("listen in server namespace: %v", err)
	}
	defer ln.Close()

	type seen struct {
		remote, local string
		err           error
	}
	seenc := make(chan seen, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			seenc <- seen{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil {
			_, err = fmt.Fprintf(c, "server %s got %q from %s\n", c.LocalAddr(), strings.TrimSpace(line), c.RemoteAddr())
		}
		seenc <- seen{remote: c.RemoteAddr().String(), local: c.LocalAddr().String(), err: err}
	}()

	var conn net.Conn
	if err := client.do(func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(vip, "80"), 20*time.Second)
		return err
	}); err != nil {
		t.Fatalf("dial the virtual server %s:80 from the client namespace: %v\nipvs table:\n%s", vip, err, director.exec(t, "ipvsadm", "-Ln"))
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprintln(conn, "hello through ipvs"); err != nil {
		t.Fatalf("write to the virtual server: %v", err)
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("read the reply through the virtual server: %v", err)
	}
	s := <-seenc
	if s.err != nil {
		t.Fatalf("server side: %v", s.err)
	}
	t.Logf("client %s -> %s, reply: %s", conn.LocalAddr(), conn.RemoteAddr(), strings.TrimSpace(reply))

	if got := conn.RemoteAddr().String(); got != net.JoinHostPort(vip, "80") {
		t.Errorf("client is connected to %s, want the VIP %s:80", got, vip)
	}
	if want := net.JoinHostPort(serverIP, serverPort); s.local != want {
		t.Errorf("server accepted on %s, want %s (IPVS must DNAT VIP:80 to the real server)", s.local, want)
	}
	if host, _, _ := net.SplitHostPort(s.remote); host != clientIP {
		t.Errorf("server saw the client as %s, want %s (masquerading keeps the client address)", s.remote, clientIP)
	}
	if !strings.Contains(reply, "hello through ipvs") {
		t.Errorf("reply %q does not echo the request", reply)
	}
	conns := director.exec(t, "ipvsadm", "-Lnc")
	if !strings.Contains(conns, clientIP) || !strings.Contains(conns, serverIP+":"+serverPort) {
		t.Errorf("ipvsadm -Lnc has no connection entry %s -> %s:%s:\n%s", clientIP, serverIP, serverPort, conns)
	}
}

// TestNetfilterTools proves the host's netfilter and CNI tools run on the
// guest kernel: dummy devices, iptables, ipset, conntrack, ipvsadm, portmap.
func TestNetfilterTools(t *testing.T) {
	requireGuest(t)
	sh(t, "modprobe", "-a", "dummy", "ip_vs", "nf_conntrack")
	ns := newNetns(t, "tools")
	ns.ip(t, "link", "add", "dummy0", "type", "dummy")
	if out := ns.ip(t, "-d", "link", "show", "dummy0"); !strings.Contains(out, "dummy") {
		t.Errorf("ip -d link show dummy0 does not say dummy:\n%s", out)
	}
	ns.exec(t, "iptables", "-t", "nat", "-N", "TRACER-SMOKE")
	ns.exec(t, "iptables", "-t", "nat", "-A", "TRACER-SMOKE", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", serverIP+":"+serverPort)
	if out := ns.exec(t, "iptables", "-t", "nat", "-S"); !strings.Contains(out, "-A TRACER-SMOKE") {
		t.Errorf("iptables -t nat -S lacks the rule just added:\n%s", out)
	}
	ns.exec(t, "ipset", "create", "tracer-smoke", "hash:ip")
	ns.exec(t, "ipset", "add", "tracer-smoke", clientIP)
	if out := ns.exec(t, "ipset", "list", "tracer-smoke"); !strings.Contains(out, clientIP) {
		t.Errorf("ipset list lacks %s:\n%s", clientIP, out)
	}
	ns.exec(t, "conntrack", "-L")
	ns.exec(t, "ipvsadm", "-A", "-t", vip+":80", "-s", "rr")
	if out := ns.exec(t, "ipvsadm", "-Ln"); !strings.Contains(out, vip+":80") {
		t.Errorf("ipvsadm -Ln lacks %s:80:\n%s", vip, out)
	}
	cmd := exec.Command("/usr/lib/cni/portmap")
	cmd.Env = append(os.Environ(), "CNI_COMMAND=VERSION")
	cmd.Stdin = bytes.NewReader(nil)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "supportedVersions") {
		t.Errorf("/usr/lib/cni/portmap VERSION: %v\n%s", err, out)
	}
}

// TestGuestKernel checks the guest runs the kernel series the harness says.
func TestGuestKernel(t *testing.T) {
	requireGuest(t)
	want := os.Getenv("TRACER_VM_KERNEL")
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatalf("uname: %v", err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	if want == "" || !strings.HasPrefix(release, want+".") {
		t.Fatalf("guest kernel is %s, TRACER_VM_KERNEL says %q", release, want)
	}
	for _, p := range []string{"/sys/kernel/tracing/events", "/sys/fs/bpf", "/sys/kernel/btf/vmlinux"} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("guest lacks %s: %v", p, err)
		}
	}
}

// TestSelftestFailure fails on purpose when TRACER_VM_SELFTEST_FAIL=1, to
// prove that a failing test fails the whole matrix run.
func TestSelftestFailure(t *testing.T) {
	requireGuest(t)
	if os.Getenv("TRACER_VM_SELFTEST_FAIL") != "1" {
		t.Skip("TRACER_VM_SELFTEST_FAIL unset: the deliberate failure is off")
	}
	t.Fatal("deliberate failure requested by TRACER_VM_SELFTEST_FAIL=1")
}
