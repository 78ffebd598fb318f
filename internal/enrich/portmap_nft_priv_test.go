package enrich_test

import (
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/live/livetest"
	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
	"github.com/tracer-dev/tracer/tests/cni"
	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// The node of TestPrivPortmapNFTHijack: the real portmap plugin's
// nftables rules for a pod p with hostPort tcp 8080 -> 80, in the node's
// namespace n. The uplink u owns a ClusterIP that n routes to it (as a
// node without kube-proxy's rules for it would) and an address outside
// the cluster, both answering on 8080.
//
//	c 10.0.0.2 --- cni0 10.0.0.1  n  eth0 192.168.0.2 --- 192.168.0.1 u (+172.30.0.44, 198.51.100.7)
//	                        veth0 10.88.0.1
//	                          |
//	                     p 10.88.0.2 (eth0)
const (
	hpContainer = "4f2a9c1e0b7d"
	hpPodAddr   = "10.88.0.2"
	hpPort      = 8080
	hpPodPort   = 80
	hpClusterIP = "172.30.0.44"
	hpOutside   = "198.51.100.7"
	hpTable     = "cni_hostport"
	fromPod     = "pod"     // what the pod's server writes
	fromOutside = "outside" // what u's servers write
)

// portmapShapes are the chain paths to the hostPort rule in each release's
// prerouting, and whether a `fib daddr type local` check guards them
// (tests/cni checks the releases still write these shapes).
var portmapShapes = map[string]struct {
	path      []string
	localOnly bool
}{
	"v1.10.0": {[]string{"prerouting", "hostports_all", "hostports"}, true},
	"v1.8.0":  {[]string{"prerouting", "hostports"}, false},
}

// hpAttempt is a connection from c to port 8080 of dst.
type hpAttempt struct {
	name string
	dst  string
	// local: dst is the node's own address, which every release's hostPort
	// takes, as intended. Others are taken only without a locality check.
	local   bool
	service string   // the Service that owns dst, if any
	facts   []string // what a hijack verdict must say
}

var hpAttempts = []hpAttempt{
	{"node address", nodeAddr, true, "", nil},
	{"ClusterIP routed through the node", hpClusterIP, false, "db/orders", []string{"Service db/orders"}},
	{"outside database", hpOutside, false, "", []string{hpOutside + ":8080 itself"}},
}

// TestPrivPortmapNFTHijack runs the real portmap plugin (v1.10.0 and
// v1.8.0, nftables backend) in a node namespace, makes real TCP
// connections through the node to port 8080 of the node's address, of a
// ClusterIP routed through it and of an outside address, checks with the
// node's own tools which server answered (the bytes the client read) and
// how conntrack translated it, and then that the live tracer's flow names
// the rule portmap wrote (handle and text as `nft -a` lists them), its
// chain path and owner, and the verdict: ok for the node address in both
// releases, hostport-hijack for the others in v1.8.0 (no locality check),
// and no hijack in v1.10.0, whose hostPort does not take them.
// vmPortmapGuests share the portmap releases over the VM matrix: the
// oldest release on the oldest nf_tables, the newest on the newest kernel.
var vmPortmapGuests = map[string]string{"v1.8.0": "5.10", "v1.10.0": "6.12"}

func TestPrivPortmapNFTHijack(t *testing.T) {
	requirePrivileged(t, "nft", "conntrack")
	before, err := cni.HostState()
	if err != nil {
		t.Fatal(err)
	}
	for _, version := range cphelper.PortmapVersions {
		t.Run(version, func(t *testing.T) {
			shape, ok := portmapShapes[version]
			if !ok {
				t.Fatalf("no expected shape for portmap %s: add one to portmapShapes", version)
			}
			k, g := os.Getenv("TRACER_VM_KERNEL"), vmPortmapGuests[version]
			if k != "" && g == "" {
				t.Fatalf("no VM guest runs portmap %s: add one to vmPortmapGuests", version)
			}
			if k != "" && k != g {
				t.Skipf("the VM matrix runs portmap %s in the %s guest (one release per guest, for CI's hour; the host runs both)", version, g)
			}
			bin, err := cphelper.EnsurePortmap(version, t.Logf)
			if err != nil {
				t.Fatal(err)
			}
			for _, tier := range livetest.Tiers {
				t.Run(tier.Name, func(t *testing.T) {
					tier.SkipWithoutLinks(t)
					testPortmapNFT(t, bin, shape.path, shape.localOnly, tier)
				})
			}
		})
	}
	after, err := cni.HostState()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("the host's netfilter state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func testPortmapNFT(t *testing.T, bin string, path []string, localOnly bool, tier livetest.Tier) {
	c, n := newPortmapNode(t, bin)
	rule := hostPortRule(t, n)
	t.Logf("portmap's rule: chain %s handle %d: %s", rule.chain, rule.handle, rule.text)

	tr := livetest.Start(t, n, livetest.Config{Only: tier.Only, Metadata: portmapMetadata()})
	if v := tr.Via(event.HookNFNat); tier.Only != nil && v != event.ViaNetfilter {
		t.Skipf("NAT cannot be seen via the netfilter tier on this kernel (via %s): it needs 6.4+", v)
	}
	srcs := map[string]string{} // attempt name -> the client's endpoint
	for _, a := range hpAttempts {
		dnat := a.local || !localOnly
		src, answer, err := fetch(c, net.JoinHostPort(a.dst, strconv.Itoa(hpPort)))
		if err != nil {
			t.Errorf("%s: %v", a.name, err)
			continue
		}
		srcs[a.name] = src
		// The node's truth, before the tracer's: who answered, and how
		// conntrack translated the connection.
		want, wantReply := fromOutside, net.JoinHostPort(a.dst, strconv.Itoa(hpPort))
		if dnat {
			want, wantReply = fromPod, net.JoinHostPort(hpPodAddr, strconv.Itoa(hpPodPort))
		}
		if answer != want {
			t.Errorf("%s: %s read %q from %s:%d, want %q", a.name, src, answer, a.dst, hpPort, want)
		}
		reply, err := conntrackReplySource(n, src, a.dst, hpPort)
		if err != nil {
			t.Errorf("%s: %v", a.name, err)
		} else if reply != wantReply {
			t.Errorf("%s: conntrack in the node: reply from %s, want %s", a.name, reply, wantReply)
		}
		t.Logf("%s: %s → %s:%d read %q; the node's conntrack has the reply from %s", a.name, src, a.dst, hpPort, answer, reply)
	}
	tr.Stop(t)

	for _, a := range hpAttempts {
		src, ok := srcs[a.name]
		if !ok {
			continue
		}
		dst := net.JoinHostPort(a.dst, strconv.Itoa(hpPort))
		if a.local || !localOnly {
			checkPortmapFlow(t, tr, a, src, dst, rule, path)
			continue
		}
		// The locality check kept the hostPort out of it: the tracer may
		// report the forwarded connection, but not as the hostPort's.
		fs := tr.FlowsOf("", src, dst)
		t.Logf("%s: not the hostPort's; the tracer reported %d flows: %s", a.name, len(fs), livetest.FlowList(fs))
		if len(fs) > 1 {
			t.Errorf("%s: %d flows for %s → %s, want at most one: %s", a.name, len(fs), src, dst, livetest.FlowList(fs))
		}
		for _, f := range fs {
			if f.Verdict != trace.VerdictOK || (f.Rule != nil && f.Rule.Table == hpTable) {
				t.Errorf("%s: the hostPort did not take it, but the tracer says %s with rule %+v: %s", a.name, f.Verdict, f.Rule, f.Explanation)
			}
		}
	}
	// No false alarm: nothing else happened in the node.
	for _, f := range tr.All() {
		if f.Verdict != trace.VerdictOK && f.Verdict != trace.VerdictHostportHijack {
			t.Errorf("flow %s %s → %s: verdict %s: %s", f.Proto, f.Orig.Src, f.Orig.Dst, f.Verdict, f.Explanation)
		}
	}
}

// checkPortmapFlow checks the one flow of a connection the hostPort took.
func checkPortmapFlow(t *testing.T, tr *livetest.Tracing, a hpAttempt, src, dst string, want nftRule, path []string) {
	t.Helper()
	f := tr.FlowOf(t, "", src, dst)
	if f == nil {
		return
	}
	t.Logf("%s: events %s; %s", a.name, livetest.EventList(f.Events), f.Explanation)
	r := f.Rule
	if r == nil || r.Backend != trace.BackendNFTables || r.Family != "ip" || r.Table != hpTable ||
		r.Chain != want.chain || r.Handle != want.handle || r.Text != want.text || r.EntryChain != "prerouting" ||
		!slices.Equal(r.Path, path) || r.Uncertain != "" {
		t.Errorf("%s: rule %+v, want ip %s chain %s handle %d %q via %v", a.name, r, hpTable, want.chain, want.handle, want.text, path)
	}
	if r != nil && (r.Owner == nil || r.Owner.ContainerID != hpContainer || r.Owner.Pod == nil || r.Owner.Pod.Key() != "web/hp-0") {
		t.Errorf("%s: owner %+v, want container %s of pod web/hp-0", a.name, r.Owner, hpContainer)
	}
	if got := serviceKey(f.Service); got != a.service {
		t.Errorf("%s: service %q, want %q", a.name, got, a.service)
	}
	verdict, facts := trace.VerdictOK, []string{"a hostPort used as intended"}
	if !a.local {
		verdict = trace.VerdictHostportHijack
		facts = append([]string{"pod web/hp-0", "no locality check"}, a.facts...)
	}
	if f.Verdict != verdict {
		t.Errorf("%s: verdict %s, want %s: %s", a.name, f.Verdict, verdict, f.Explanation)
	}
	for _, fact := range facts {
		if !strings.Contains(f.Explanation, fact) {
			t.Errorf("%s: explanation lacks %q: %s", a.name, fact, f.Explanation)
		}
	}
	if !slices.ContainsFunc(f.Events, func(e trace.Event) bool { return e.Kind == trace.KindDNAT }) {
		t.Errorf("%s: no dnat event in %s", a.name, livetest.EventList(f.Events))
	}
}

func serviceKey(s *trace.ServiceRef) string {
	if s == nil {
		return ""
	}
	return s.Namespace + "/" + s.Name
}

// newPortmapNode builds the namespaces, starts the servers and runs
// portmap's ADD in the node.
func newPortmapNode(t *testing.T, bin string) (c, n netlab.Namespace) {
	t.Helper()
	_, nss := newLab(t, fmt.Sprintf("trpmnft%d", os.Getpid()%10000), "c", "n", "p", "u")
	c, n, p, u := nss["c"], nss["n"], nss["p"], nss["u"]
	veth(t, c, "eth0", clientAddr+"/24", n, "cni0", "10.0.0.1/24")
	veth(t, n, "eth0", nodeAddr+"/24", u, "eth0", "192.168.0.1/24")
	veth(t, n, "veth0", "10.88.0.1/16", p, "eth0", hpPodAddr+"/16")
	run(t, c, "ip", "route", "add", "default", "via", "10.0.0.1")
	run(t, p, "ip", "route", "add", "default", "via", "10.88.0.1")
	for _, a := range []string{hpClusterIP, hpOutside} {
		run(t, u, "ip", "addr", "add", a+"/32", "dev", "lo")
		run(t, n, "ip", "route", "add", a+"/32", "via", "192.168.0.1")
	}
	// u answers the client, whose address the node forwards untranslated.
	run(t, u, "ip", "route", "add", "10.0.0.0/24", "via", nodeAddr)
	must(t, n.Sysctl("net.ipv4.ip_forward", "1"))

	serve(t, p, fmt.Sprintf("0.0.0.0:%d", hpPodPort), fromPod)
	serve(t, u, fmt.Sprintf("0.0.0.0:%d", hpPort), fromOutside)

	pm := cni.Portmap{Plugin: bin, Node: n}
	s := cni.Sandbox{ContainerID: hpContainer, NetNS: p.Path(), IP: hpPodAddr + "/16",
		Mappings: []cni.PortMapping{{HostPort: hpPort, ContainerPort: hpPodPort, Protocol: "tcp"}}}
	if _, err := pm.Add(s); err != nil {
		t.Fatal(err)
	}
	return c, n
}

// veth joins a and b with a veth pair created inside a, its peer moved
// straight into b: unlike netlab.Link, no link ever appears in the host's
// namespace, as in tests/cni.
func veth(t *testing.T, a netlab.Namespace, aIf, aAddr string, b netlab.Namespace, bIf, bAddr string) {
	t.Helper()
	run(t, a, "ip", "link", "add", aIf, "type", "veth", "peer", "name", bIf, "netns", b.Name)
	run(t, a, "ip", "addr", "add", aAddr, "dev", aIf)
	run(t, a, "ip", "link", "set", aIf, "up")
	run(t, b, "ip", "addr", "add", bAddr, "dev", bIf)
	run(t, b, "ip", "link", "set", bIf, "up")
}

// serve answers every connection to addr in ns with what, then closes it:
// the client's read names the server that answered.
func serve(t *testing.T, ns netlab.Namespace, addr, what string) {
	t.Helper()
	var l net.Listener
	must(t, ns.Do(func() (err error) {
		l, err = net.Listen("tcp4", addr)
		return err
	}))
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return // closed
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, what)
			c.Close()
		}
	}()
}

// fetch connects from c's address and reads until the server closes.
func fetch(c netlab.Namespace, addr string) (src, answer string, err error) {
	var b []byte
	src, err = dialThen(c, clientAddr, addr, 3*time.Second, func(conn net.Conn) error {
		conn.SetDeadline(time.Now().Add(3 * time.Second))
		var err error
		b, err = io.ReadAll(conn)
		return err
	})
	if err != nil {
		return src, "", fmt.Errorf("connect %s from %s: %w", addr, src, err)
	}
	return src, string(b), nil
}

// nftRule is a rule as `nft -a list` shows it.
type nftRule struct {
	chain  string
	handle uint64
	text   string
}

var nftHandle = regexp.MustCompile(`^(.*) # handle (\d+)$`)

// hostPortRule is the one rule of portmap's table in ns that DNATs to the
// pod's port, as `nft -a list table` lists it: the chain it is in, its
// handle, and its text without the handle comment.
func hostPortRule(t *testing.T, ns netlab.Namespace) nftRule {
	t.Helper()
	listing := run(t, ns, "nft", "-a", "list", "table", "ip", hpTable)
	dnat := fmt.Sprintf("dnat to %s:%d", hpPodAddr, hpPodPort)
	var found []nftRule
	chain := ""
	for _, line := range strings.Split(listing, "\n") {
		line = strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(line, "chain "); ok {
			chain, _, _ = strings.Cut(name, " ")
			continue
		}
		m := nftHandle.FindStringSubmatch(line)
		if m == nil || !strings.Contains(m[1], dnat) {
			continue
		}
		h, err := strconv.ParseUint(m[2], 10, 64)
		if err != nil {
			t.Fatalf("handle of %q: %v", line, err)
		}
		found = append(found, nftRule{chain: chain, handle: h, text: m[1]})
	}
	if len(found) != 1 {
		t.Fatalf("%d rules with %q in ip %s, want one:\n%s", len(found), dnat, hpTable, listing)
	}
	return found[0]
}

// conntrackReplySource is where the node's conntrack entry of the
// connection src → dst:port says the reply comes from: the pod for a
// DNAT'd connection, dst itself for one passed untranslated.
func conntrackReplySource(ns netlab.Namespace, src, dst string, port int) (string, error) {
	host, sport, err := net.SplitHostPort(src)
	if err != nil {
		return "", fmt.Errorf("client endpoint %q: %w", src, err)
	}
	out, err := ns.Run("conntrack", "-L", "-p", "tcp", "--orig-src", host, "--orig-port-src", sport,
		"--orig-dst", dst, "--orig-port-dst", strconv.Itoa(port))
	if err != nil {
		return "", fmt.Errorf("read the node's conntrack: %w", err)
	}
	var replies []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "tcp ") {
			continue // conntrack's "N flow entries have been shown" on stderr
		}
		// The second src= and sport= are the reply tuple's.
		var srcs, sports []string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "src="); ok {
				srcs = append(srcs, v)
			} else if v, ok := strings.CutPrefix(f, "sport="); ok {
				sports = append(sports, v)
			}
		}
		if len(srcs) != 2 || len(sports) != 2 {
			return "", fmt.Errorf("conntrack entry %q: want an original and a reply tuple", line)
		}
		replies = append(replies, net.JoinHostPort(srcs[1], sports[1]))
	}
	if len(replies) != 1 {
		return "", fmt.Errorf("%d conntrack entries for %s → %s:%d in the node, want one:\n%s", len(replies), src, dst, port, out)
	}
	return replies[0], nil
}

// portmapMetadata are the hostPort's pod (with the container id portmap
// puts in its rules' comments), the client pod, and the Service whose
// ClusterIP the node routes to the uplink.
func portmapMetadata() enrich.Metadata {
	pods := []trace.Pod{
		{Namespace: "web", Name: "hp-0", IPs: []string{hpPodAddr}, Node: "node-1", ContainerID: hpContainer},
		{Namespace: "shop", Name: "client", IPs: []string{clientAddr}, Node: "node-1"},
	}
	svcs := []trace.Service{{Namespace: "db", Name: "orders", Type: "ClusterIP", ClusterIPs: []string{hpClusterIP},
		Ports: []trace.ServicePort{{Name: "http", Proto: "TCP", Port: hpPort}}}}
	return enrich.NewSnapshotMetadata(pods, svcs)
}
