package cni

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// TestRuntimeChain runs the node conflist (loopback, bridge with
// host-local, portmap) for two pods, once with Debian's plugins (portmap's
// iptables backend) and once with portmap v1.10.0's nftables backend
// ahead of them in CNI_PATH. The truth: each pod's eth0 holds the address
// the result gives, from the node's subnet, with the bridge as gateway;
// pod b connecting to the bridge's address on the hostPort is answered by
// pod a's server, and the DNAT rule portmap wrote for pod a counts the
// packet (iptables-save -c) or the node's conntrack shows the reply from
// pod a. DEL (reverse order) removes the veths, frees host-local's
// addresses and pod a's rules; the host's ruleset and route_localnet are
// unchanged.
func TestRuntimeChain(t *testing.T) {
	if testing.Short() {
		t.Skip("creates network namespaces and runs the real CNI plugins: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and runs CNI plugins in them")
	}
	for _, tool := range []string{"iptables-save", "nft", "conntrack"} {
		if _, err := lookPath(tool); err != nil {
			t.Fatalf("the test reads the node's truth with %s: %v", tool, err)
		}
	}
	if _, err := os.Stat(filepath.Join(DebianPluginDir, "bridge")); err != nil {
		t.Fatalf("Debian's containernetworking-plugins: %v", err)
	}
	before, err := HostState()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("debian-iptables", func(t *testing.T) { testRuntimeChain(t, "", nil) })
	t.Run("v1.10.0-nftables", func(t *testing.T) {
		bin, err := cphelper.EnsurePortmap("v1.10.0", t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		testRuntimeChain(t, "nftables", []string{filepath.Dir(bin)})
	})
	after, err := HostState()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("the host's netfilter state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func testRuntimeChain(t *testing.T, backend string, first []string) {
	lab, err := netlab.New("trki-cni")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Error(err)
		}
	})
	node, err := lab.Namespace("node")
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]netlab.Namespace{}
	for _, p := range []string{"a", "b"} {
		if pods[p], err = lab.Namespace("pod-" + p); err != nil {
			t.Fatal(err)
		}
	}
	dataDir := t.TempDir()
	rt := &Runtime{Node: node, Path: append(first, DebianPluginDir),
		List: NodeNetwork{Name: "trki", Bridge: "cni0", Subnet: "10.99.0.0/24", DataDir: dataDir, PortmapBackend: backend}.ConfList()}
	sandboxes := map[string]PodSandbox{
		"a": {ContainerID: "trki0a", NetNS: pods["a"].Path(), Mappings: []PortMapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}}},
		"b": {ContainerID: "trki0b", NetNS: pods["b"].Path()},
	}
	ips := map[string]string{}
	for _, p := range []string{"a", "b"} {
		res, err := rt.Add(sandboxes[p])
		if err != nil {
			t.Fatal(err)
		}
		ips[p] = res.IP.Addr().String()
		t.Logf("pod %s: %s via %s", p, res.IP, res.Gateway)
		if !strings.HasPrefix(res.IP.String(), "10.99.0.") || !strings.HasSuffix(res.IP.String(), "/24") || res.Gateway.String() != "10.99.0.1" {
			t.Errorf("pod %s: result %s via %s, want an address of 10.99.0.0/24 via the bridge's 10.99.0.1", p, res.IP, res.Gateway)
		}
		if out, _ := pods[p].Run("ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(out, " "+res.IP.String()+" ") {
			t.Errorf("pod %s: eth0 does not hold %s: %s", p, res.IP, out)
		}
		if out, _ := pods[p].Run("ip", "-o", "link", "show", "dev", "lo"); !strings.Contains(out, "UP") {
			t.Errorf("pod %s: lo is not up (loopback plugin): %s", p, out)
		}
	}
	if ips["a"] == ips["b"] {
		t.Fatalf("host-local gave both pods %s", ips["a"])
	}
	if out, _ := node.Run("ip", "-4", "-o", "addr", "show", "dev", "cni0"); !strings.Contains(out, " 10.99.0.1/24 ") {
		t.Errorf("the node's cni0 does not hold 10.99.0.1/24: %s", out)
	}
	ln := listenIn(t, pods["a"], net.JoinHostPort(ips["a"], "80"), "pod-a")
	defer ln.Close()

	counted := func() int { return dnatPackets(t, node, backend, ips["a"]) }
	n0 := counted()
	local := &net.TCPAddr{IP: net.ParseIP(ips["b"]), Port: 24321}
	answer, err := fetchIn(pods["b"], local, "10.99.0.1:8080")
	if err != nil || answer != "pod-a" {
		t.Errorf("pod b → 10.99.0.1:8080 (hostPort of pod a): %q, %v; want pod-a's answer", answer, err)
	}
	if backend == "" {
		if n := counted(); n != n0+1 {
			t.Errorf("portmap's DNAT to %s:80 counted %d packets, want %d", ips["a"], n, n0+1)
		}
	} else if out, _ := node.Run("conntrack", "-L", "-p", "tcp", "--orig-src", ips["b"], "--orig-port-src", "24321"); !strings.Contains(out, "src="+ips["a"]+" dst="+ips["b"]+" sport=80 ") {
		t.Errorf("the node's conntrack has no reply from %s:80 for the hostPort connection:\n%s", ips["a"], out)
	}

	for _, p := range []string{"b", "a"} {
		if err := rt.Del(sandboxes[p]); err != nil {
			t.Fatal(err)
		}
		if out, _ := pods[p].Run("ip", "-o", "link", "show"); strings.Contains(out, "eth0") {
			t.Errorf("pod %s: eth0 still there after DEL: %s", p, out)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dataDir, "trki", "10.*")); len(left) != 0 {
		t.Errorf("host-local still holds %v after DEL", left)
	}
	if n := rulesFor(t, node, backend, ips["a"]); n != 0 {
		t.Errorf("%d rules DNAT to %s after DEL", n, ips["a"])
	}
}

// listenIn serves what on addr inside ns until the listener is closed.
func listenIn(t *testing.T, ns netlab.Namespace, addr, what string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, what)
			c.Close()
		}
	}()
	return l
}

func fetchIn(ns netlab.Namespace, local *net.TCPAddr, addr string) (string, error) {
	var b []byte
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: local}
		c, err := d.Dial("tcp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err = io.ReadAll(c)
		return err
	})
	return string(b), err
}

var saveCounters = regexp.MustCompile(`^\[(\d+):\d+\] (.*)$`)

// dnatPackets is the packet counter of the iptables DNAT rule to ip:80
// in the node's nat table (iptables backend only).
func dnatPackets(t *testing.T, node netlab.Namespace, backend, ip string) int {
	t.Helper()
	if backend != "" {
		return 0
	}
	out, err := node.Run("iptables-save", "-c", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	total, found := 0, 0
	for _, line := range strings.Split(out, "\n") {
		m := saveCounters.FindStringSubmatch(line)
		if m == nil || !strings.HasSuffix(m[2], "-j DNAT --to-destination "+ip+":80") {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		total += n
		found++
	}
	if found != 1 {
		t.Fatalf("%d DNAT rules to %s:80 in the node's nat table, want one:\n%s", found, ip, out)
	}
	return total
}

// rulesFor counts the rules that DNAT to ip in the node's ruleset.
func rulesFor(t *testing.T, node netlab.Namespace, backend, ip string) int {
	t.Helper()
	args := []string{"iptables-save", "-t", "nat"}
	needle := "--to-destination " + ip + ":"
	if backend != "" {
		args, needle = []string{"nft", "list", "ruleset"}, "dnat to "+ip+":"
	}
	out, err := node.Run(args[0], args[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(out, needle)
}

func lookPath(tool string) (string, error) {
	for _, dir := range filepath.SplitList(os.Getenv("PATH") + ":/usr/sbin:/sbin") {
		p := filepath.Join(dir, tool)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not in PATH", tool)
}
