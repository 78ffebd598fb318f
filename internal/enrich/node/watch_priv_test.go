package node

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/rules"
)

func requirePriv(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged test: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("privileged test: needs root to create network namespaces")
	}
}

func mustRun(t *testing.T, ns netlab.Namespace, args ...string) {
	t.Helper()
	if out, err := ns.Run(args[0], args[1:]...); err != nil {
		t.Fatalf("%v: %v %s", args, err, out)
	}
}

func newNS(t *testing.T, prefix string) netlab.Namespace {
	t.Helper()
	lab, err := netlab.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	ns, err := lab.Namespace("node")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// kubeNode gives a namespace kube-proxy's IPVS-mode shape: kube-ipvs0 (a
// bridge left down: this kernel has no dummy driver) holding a ClusterIP,
// a service ipset, an INPUT filter rule using it, and a listener.
func kubeNode(t *testing.T, ns netlab.Namespace) net.Listener {
	t.Helper()
	// Without DAD the IPv6 link-local address and its local route exist
	// as soon as eth0 is up, rather than appearing a second later (a real
	// change the idle check below would otherwise rightly see).
	for _, k := range []string{"net.ipv6.conf.all.accept_dad", "net.ipv6.conf.default.accept_dad"} {
		if err := ns.Sysctl(k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	mustRun(t, ns, "ip", "link", "add", "kube-ipvs0", "type", "bridge")
	mustRun(t, ns, "ip", "addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0")
	mustRun(t, ns, "ip", "link", "add", "eth0", "type", "bridge")
	mustRun(t, ns, "ip", "addr", "add", "172.18.0.2/16", "dev", "eth0")
	mustRun(t, ns, "ip", "link", "set", "eth0", "up")
	mustRun(t, ns, "ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port", "family", "inet", "hashsize", "1024", "maxelem", "65536")
	mustRun(t, ns, "ipset", "add", "KUBE-CLUSTER-IP", "10.96.0.10,tcp:80")
	mustRun(t, ns, "ipset", "add", "KUBE-CLUSTER-IP", "10.96.0.10,udp:53")
	mustRun(t, ns, "iptables", "-t", "filter", "-N", "KUBE-IPVS-FILTER")
	mustRun(t, ns, "iptables", "-t", "filter", "-A", "INPUT", "-m", "comment", "--comment", "kubernetes ipvs access filter", "-j", "KUBE-IPVS-FILTER")
	mustRun(t, ns, "iptables", "-t", "filter", "-A", "KUBE-IPVS-FILTER", "-m", "set", "--match-set", "KUBE-CLUSTER-IP", "dst,dst", "-j", "RETURN")
	mustRun(t, ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-p", "tcp", "--dport", "3306", "-j", "DNAT", "--to-destination", "10.244.1.5:3306")
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp4", "0.0.0.0:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestPrivNodeState(t *testing.T) {
	requirePriv(t)
	ns := newNS(t, "ennode1")
	kubeNode(t, ns)
	start := time.Now()
	w, err := Watch(context.Background(), ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	t.Logf("first state built in %v", time.Since(start))
	st := w.Current()

	if !st.IsLocal(netip.MustParseAddr("10.96.0.10")) {
		t.Error("kube-ipvs0's address (link down) is not local")
	}
	if !st.IsLocal(netip.MustParseAddr("172.18.0.2")) || st.IsLocal(netip.MustParseAddr("172.18.0.3")) || st.IsLocal(netip.MustParseAddr("10.96.0.11")) {
		t.Errorf("local routes %v", st.LocalRoutes())
	}
	var sawIPVS0 bool
	for _, a := range st.Addresses() {
		if a.Interface == "kube-ipvs0" {
			sawIPVS0 = true
			if a.Up || a.Prefix != netip.MustParsePrefix("10.96.0.10/32") {
				t.Errorf("kube-ipvs0 address %+v", a)
			}
		}
	}
	if !sawIPVS0 {
		t.Errorf("no kube-ipvs0 address in %+v", st.Addresses())
	}

	in, err := st.SetMember("KUBE-CLUSTER-IP", []rules.SetLookup{
		{Dir: rules.DirDst, Addr: netip.MustParseAddr("10.96.0.10"), Proto: rules.ProtoUDP, Port: 53, PortKnown: true},
		{Dir: rules.DirDst, Addr: netip.MustParseAddr("10.96.0.10"), Proto: rules.ProtoUDP, Port: 53, PortKnown: true},
	})
	if !in || err != nil {
		t.Errorf("ipset member 10.96.0.10,udp:53: %v %v; sets %v", in, err, st.IPSets())
	}
	if s := st.IPSets()["KUBE-CLUSTER-IP"]; s == nil || s.Type != "hash:ip,port" {
		t.Errorf("set %+v", s)
	}

	rs := st.Ruleset(rules.IPv4)
	if rs == nil || rs.Chain("filter", "KUBE-IPVS-FILTER") == nil || len(rs.Chain("filter", "KUBE-IPVS-FILTER").Rules) != 1 {
		t.Fatalf("rules not read; notes %v", st.Notes())
	}
	// Attribution works against the live state: a NEW connection to the
	// VIP on 3306 hits the LOCAL DNAT.
	res, err := rs.Evaluate("nat", "PREROUTING", rules.Packet{Proto: rules.ProtoTCP,
		Src: netip.MustParseAddrPort("172.18.0.9:40000"), Dst: netip.MustParseAddrPort("10.96.0.10:3306"), State: rules.CTNew}, st.NodeState())
	if err != nil || res.Verdict != rules.VerdictDNAT {
		t.Errorf("evaluate %+v %v", res, err)
	}

	if l, ok := st.Listening("tcp", netip.MustParseAddrPort("10.96.0.10:8080")); !ok || l.Addr != netip.MustParseAddrPort("0.0.0.0:8080") {
		t.Errorf("listener: %+v %v in %+v", l, ok, st.Listeners())
	} else if !strings.Contains(l.Process, "[") {
		// The listener's socket is held by this test binary.
		t.Errorf("listener process %q", l.Process)
	}

	snap := st.Snapshot()
	if !strings.Contains(snap.Rules["filter"], "-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN") ||
		!strings.Contains(snap.Ipsets, "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80") {
		t.Errorf("snapshot %+v", snap)
	}
	if _, err := FromSnapshot(snap); err != nil {
		t.Errorf("live snapshot does not replay: %v", err)
	}
	if _, err := os.Stat("/sys/module/ip_vs"); err != nil {
		note := strings.Join(st.Notes(), "\n")
		if !strings.Contains(note, "IPVS") || len(st.IPVS()) != 0 {
			t.Errorf("no IPVS in this kernel must be a note: %q", note)
		}
	}
	t.Logf("notes: %q", st.Notes())
}

func TestPrivWatcherRefresh(t *testing.T) {
	requirePriv(t)
	ns := newNS(t, "ennode2")
	kubeNode(t, ns)
	// The default poll interval (2s), so the bounds below are the ones
	// users get.
	w, err := Watch(context.Background(), ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	// Nothing changes: polls must not publish new states.
	// Two polls take 4 s; under emulation (the VM matrix), or on a loaded
	// machine, a poll's own commands take longer: wait for the two polls,
	// not for a time.
	first := w.Current()
	waited := time.Now()
	for w.Stats().Polls < 2 && time.Since(waited) < 30*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	if w.Stats().Polls < 2 {
		t.Fatalf("only %d polls in %s", w.Stats().Polls, time.Since(waited).Round(time.Millisecond))
	}
	if w.Current() != first {
		t.Errorf("state rebuilt without a change (stats %+v)", w.Stats())
	}

	// An address appears: the netlink notification refreshes at once.
	vip := netip.MustParseAddr("10.96.0.20")
	start := time.Now()
	mustRun(t, ns, "ip", "addr", "add", "10.96.0.20/32", "dev", "kube-ipvs0")
	waitState(t, w, time.Second, "address 10.96.0.20 local", func(s *State) bool { return s.IsLocal(vip) })
	t.Logf("address refresh: %v", time.Since(start))

	// A rule changes: seen by the next poll.
	start = time.Now()
	mustRun(t, ns, "iptables", "-t", "filter", "-A", "KUBE-IPVS-FILTER", "-m", "conntrack", "--ctstate", "NEW", "-j", "REJECT")
	waitState(t, w, 3*time.Second, "new REJECT rule", func(s *State) bool {
		c := s.Ruleset(rules.IPv4).Chain("filter", "KUBE-IPVS-FILTER")
		return c != nil && len(c.Rules) == 2
	})
	t.Logf("rule refresh (poll 2s): %v", time.Since(start))

	// An ipset member and a native nftables table.
	mustRun(t, ns, "ipset", "add", "KUBE-CLUSTER-IP", "10.96.0.20,tcp:443")
	waitState(t, w, 3*time.Second, "new ipset member", func(s *State) bool {
		return strings.Contains(s.Snapshot().Ipsets, "10.96.0.20,tcp:443")
	})
	if _, err := exec.LookPath("nft"); err == nil {
		mustRun(t, ns, "nft", "add", "table", "ip", "cni_hostport")
		mustRun(t, ns, "nft", "add", "chain", "ip", "cni_hostport", "hostports")
		waitState(t, w, 3*time.Second, "native nftables table", func(s *State) bool {
			for _, tb := range s.NFTables() {
				if tb.Name == "cni_hostport" && strings.Contains(tb.Text, "chain hostports") {
					return true
				}
			}
			return false
		})
		for _, tb := range w.Current().NFTables() {
			if tb.Name == "filter" || tb.Name == "nat" {
				t.Errorf("iptables-nft table %s %s listed as native", tb.Family, tb.Name)
			}
		}
	}
	// A listener goes away.
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("udp4", "0.0.0.0:5353"); return wrapUDP(&ln, err) }); err != nil {
		t.Fatal(err)
	}
	waitState(t, w, 3*time.Second, "udp listener", func(s *State) bool {
		_, ok := s.Listening("udp", netip.MustParseAddrPort("10.96.0.10:5353"))
		return ok
	})
	ln.Close()
	waitState(t, w, 3*time.Second, "udp listener gone", func(s *State) bool {
		_, ok := s.Listening("udp", netip.MustParseAddrPort("10.96.0.10:5353"))
		return !ok
	})
	t.Logf("stats %+v", w.Stats())
}

// wrapUDP lets the listener helper hold a UDP socket: net.Listen does not
// take "udp", so the PacketConn is adapted to the Close the test needs.
func wrapUDP(ln *net.Listener, _ error) error {
	pc, err := net.ListenPacket("udp4", "0.0.0.0:5353")
	if err != nil {
		return err
	}
	*ln = packetListener{pc}
	return nil
}

type packetListener struct{ net.PacketConn }

func (packetListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (p packetListener) Addr() net.Addr          { return p.LocalAddr() }

func waitState(t *testing.T, w *Watcher, within time.Duration, what string, ok func(*State) bool) {
	t.Helper()
	// Under QEMU's emulation (the VM matrix) everything runs ~10x slower:
	// the bound checks that the refresh comes, the host tier its latency.
	if os.Getenv("TRACER_VM") != "" {
		within *= 10
	}
	deadline := time.Now().Add(within)
	for !ok(w.Current()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not seen within %v (stats %+v, notes %v)", what, within, w.Stats(), w.Current().Notes())
		}
		select {
		case <-w.Changed():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestPrivIPVS needs a kernel that can load ip_vs: the VM matrix (TRACER_VM
// set). It loads the module itself, in the VM, never on the build machine.
func TestPrivIPVS(t *testing.T) {
	requirePriv(t)
	if os.Getenv("TRACER_VM") == "" {
		t.Skip("needs a kernel where `modprobe ip_vs` works: runs in the VM matrix (TRACER_VM set)")
	}
	if out, err := exec.Command("modprobe", "ip_vs").CombinedOutput(); err != nil {
		t.Skipf("modprobe ip_vs: %v %s", err, out)
	}
	if _, err := exec.LookPath("ipvsadm"); err != nil {
		t.Skip("ipvsadm not installed")
	}
	ns := newNS(t, "ennode3")
	mustRun(t, ns, "ipvsadm", "-A", "-t", "10.96.0.10:80", "-s", "rr")
	mustRun(t, ns, "ipvsadm", "-a", "-t", "10.96.0.10:80", "-r", "10.244.1.5:8080", "-m", "-w", "1")
	w, err := Watch(context.Background(), ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	v, ok := w.Current().IPVSService("tcp", netip.MustParseAddrPort("10.96.0.10:80"))
	if !ok || v.Scheduler != "rr" || len(v.Reals) != 1 || v.Reals[0].Addr != netip.MustParseAddrPort("10.244.1.5:8080") || v.Reals[0].Forward != "masq" {
		t.Fatalf("ipvs %+v %v; notes %v", v, ok, w.Current().Notes())
	}
}

// TestPrivWatcherReadsNFTRulesWhenTheyChange: on iptables-nft, with the
// kernel's own nftables generation and x_tables' table lists, the
// Watcher runs iptables-save again only when a rule was committed or
// iptables-legacy tables exist. The test counts the commands itself; the
// rules the state holds are compared with what iptables was told.
func TestPrivWatcherReadsNFTRulesWhenTheyChange(t *testing.T) {
	requirePriv(t)
	if out, err := exec.Command("iptables", "--version").CombinedOutput(); err != nil || !strings.Contains(string(out), "nf_tables") {
		t.Skipf("iptables here is not iptables-nft (%q, %v): no nftables generation counts its rules", out, err)
	}
	ns := newNS(t, "ennode4")
	mustRun(t, ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "3306", "-j", "DNAT", "--to-destination", "10.244.1.5:3306")
	h, err := netns.GetFromPath(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var mu sync.Mutex
	saves := 0
	real := nsRunner(ns.Path())
	count := func(ctx context.Context, name string, args ...string) ([]byte, error) {
		if name == "iptables-save" && len(args) == 0 {
			mu.Lock()
			saves++
			mu.Unlock()
		}
		return real(ctx, name, args...)
	}
	ran := func() int { mu.Lock(); defer mu.Unlock(); return saves }
	w, err := WatchWith(context.Background(), ns.Path(), WatchOptions{Poll: 50 * time.Millisecond, Runner: count,
		nftGen:       func() (uint32, error) { return nftGeneration(int(h)) },
		legacyTables: func() (legacyTables, error) { return legacyTablesIn(ns.Path()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dnatRules := func(s *State) int {
		c := s.Ruleset(rules.IPv4).Chain("nat", "PREROUTING")
		if c == nil {
			return 0
		}
		return len(c.Rules)
	}
	if n := dnatRules(w.Current()); n != 1 {
		t.Fatalf("first state: %d PREROUTING rules, iptables was given 1", n)
	}
	waitPolls(t, w, 5)
	if n := ran(); n != 1 {
		t.Errorf("iptables-save ran %d times in 6 rounds without a commit; want the first read only", n)
	}

	mustRun(t, ns, "iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "3307", "-j", "DNAT", "--to-destination", "10.244.1.6:3306")
	waitState(t, w, 3*time.Second, "the second DNAT rule", func(s *State) bool { return dnatRules(s) == 2 })
	waitPolls(t, w, 3)
	if n := ran(); n != 2 {
		t.Errorf("iptables-save ran %d times; want 2: the first read and one after the commit", n)
	}

	// iptables-legacy tables: only where the kernel already has
	// ip_tables and its filter table, since iptables-legacy would load
	// the modules.
	for _, mod := range []string{"ip_tables", "iptable_filter"} {
		if !moduleReady(mod) {
			t.Logf("legacy tables not tried: %s is not loaded and the test does not load it", mod)
			return
		}
	}
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		t.Logf("legacy tables not tried: %v", err)
		return
	}
	mustRun(t, ns, "iptables-legacy", "-t", "filter", "-L", "-n") // instantiates the table
	if out, _ := ns.Run("iptables-save"); !strings.Contains(out, "legacy tables present") {
		t.Fatalf("iptables-save does not warn of the legacy table:\n%s", out)
	}
	// The truth is iptables-save's own warning (on its standard error).
	waitState(t, w, 3*time.Second, "the legacy tables note", func(s *State) bool {
		return strings.Contains(strings.Join(s.Notes(), "\n"), "(iptables-save warns of them)")
	})
	before := ran()
	waitPolls(t, w, 4)
	if n := ran() - before; n < 3 {
		t.Errorf("iptables-save ran %d times in 4 rounds with a legacy table present; want every round", n)
	}
}
