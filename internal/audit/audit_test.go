package audit

import (
	"os"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/predict"
	"github.com/tracer-dev/tracer/internal/trace"
)

func load(t *testing.T, path string) (string, *trace.Snapshot, enrich.Env) {
	t.Helper()
	tr, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	snap := tr.Header.Snapshot
	env, err := enrich.NewSnapshotEnv(tr.Header.Node, snap)
	if err != nil {
		t.Fatal(err)
	}
	return tr.Header.Node, snap, env
}

// auditSnap audits snap, changed by the test, and logs the report.
func auditSnap(t *testing.T, node string, snap *trace.Snapshot) Report {
	t.Helper()
	env, err := enrich.NewSnapshotEnv(node, snap)
	if err != nil {
		t.Fatal(err)
	}
	r := Audit(node, snap, env)
	logReport(t, r)
	return r
}

func logReport(t *testing.T, r Report) {
	t.Helper()
	t.Logf("node %s: %d walked, %d findings, notes %v", r.Node, r.Walked, len(r.Findings), r.Notes)
	for _, f := range r.Findings {
		t.Logf("%s %s %s %s from %v: %s", f.Severity, f.Verdict, f.Proto, f.To, f.From, f.Steps)
	}
}

// Seed 000's node: mysql-b's hostPort 3306 takes Service svc-b's
// ClusterIP port (IPVS would send it to mysql-a), from the node's pods and
// from the node itself; pinging a ClusterIP is refused by design. Nothing
// else is wrong.
func TestAuditSeed000(t *testing.T) {
	node, snap, env := load(t, "../predict/testdata/ipvs-node.ndjson")
	r := Audit(node, snap, env)
	logReport(t, r)
	if r.Problems() != 1 {
		t.Fatalf("%d problems, want 1 (the hijack)", r.Problems())
	}
	f := r.Findings[0]
	if f.Severity != Problem || f.Verdict != trace.VerdictHostportHijack || !strings.HasPrefix(f.To, "10.96.0.20:3306 (Service ns-a/svc-b port 3306 (mysql))") {
		t.Fatalf("first finding %+v", f)
	}
	if len(f.From) != 2 || !strings.HasPrefix(f.From[0], "pod ") || f.From[1] != "the node" {
		t.Errorf("from %v, want a pod of the node and the node", f.From)
	}
	if f.Rule == nil || f.Rule.Owner == nil || f.Rule.Owner.Pod == nil || f.Rule.Owner.Pod.Name != "mysql-b" {
		t.Errorf("rule %+v", f.Rule)
	}
	notes := 0
	for _, f := range r.Findings[1:] {
		if f.Severity != Note || f.Verdict != trace.VerdictIPVSFilterReject || f.Proto != "icmp" {
			t.Errorf("unexpected finding %+v", f)
		}
		notes++
	}
	if notes != 2 {
		t.Errorf("%d ping notes, want one per ClusterIP (2)", notes)
	}
}

// Without the hostPort's rules (mysql-b's pod deleted and portmap's CNI
// DEL done), the same node has no problem: a near miss.
func TestAuditCleanWithoutHostPort(t *testing.T) {
	node, snap, _ := load(t, "../predict/testdata/ipvs-node.ndjson")
	var kept []string
	for _, l := range strings.Split(snap.Rules["all"], "\n") {
		if !strings.Contains(l, "CNI-HOSTPORT-DNAT") && !strings.Contains(l, "CNI-DN-") {
			kept = append(kept, l)
		}
	}
	snap.Rules["all"] = strings.Join(kept, "\n")
	r := auditSnap(t, node, snap)
	if r.Problems() != 0 {
		t.Fatalf("%d problems on a node without the hostPort", r.Problems())
	}
}

// With portmap's jump appended to PREROUTING and OUTPUT, where portmap
// puts it today, kube-proxy's KUBE-SERVICES ACCEPTs svc-b's ClusterIP
// port (it is in KUBE-CLUSTER-IP) before the hostPort chain is reached:
// the same hostPort, no hijack.
func TestAuditPortmapAppended(t *testing.T) {
	node, snap, _ := load(t, "../predict/testdata/ipvs-node.ndjson")
	var rules, jumps []string
	for _, l := range strings.Split(snap.Rules["all"], "\n") {
		if strings.HasSuffix(l, "-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT") {
			jumps = append(jumps, l)
			continue
		}
		if l == "COMMIT" && len(jumps) > 0 {
			rules = append(rules, jumps...)
			jumps = nil
		}
		rules = append(rules, l)
	}
	snap.Rules["all"] = strings.Join(rules, "\n")
	r := auditSnap(t, node, snap)
	if r.Problems() != 0 {
		t.Fatalf("%d problems with portmap's jump appended", r.Problems())
	}
}

// mysql-b deleted without portmap's CNI DEL: its two DNAT rules (hostPort
// 3306 and 30080) point at an address no pod holds.
func TestAuditStaleHostPort(t *testing.T) {
	node, snap, _ := load(t, "../predict/testdata/ipvs-node.ndjson")
	var pods []trace.Pod
	for _, p := range snap.Pods {
		if p.Name != "mysql-b" {
			pods = append(pods, p)
		}
	}
	snap.Pods = pods
	r := auditSnap(t, node, snap)
	var stale []string
	for _, f := range r.Findings {
		if f.Verdict == VerdictStaleHostPort {
			stale = append(stale, f.Rule.Text)
			if f.Rule.Owner == nil || !strings.HasPrefix(f.Rule.Owner.ContainerID, "4b1c0f6de2a9") || !strings.Contains(f.Explanation, "no pod holds 10.244.1.5") {
				t.Errorf("finding %+v", f)
			}
		}
	}
	if len(stale) != 2 {
		t.Fatalf("stale rules %q, want mysql-b's two DNATs", stale)
	}
}

// portmap v1.10.0's nftables table for a sandbox whose pod is gone; a
// pod holding the address with a hostPort is no finding.
func TestAuditStaleHostPortNFT(t *testing.T) {
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	snap := &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "192.168.0.2/24", Up: true}},
		NFTables:  &trace.NFTRuleset{JSON: read("../nft/testdata/portmap-v1.10.0.json"), Listing: string(read("../nft/testdata/portmap-v1.10.0.nft"))},
		Pods:      []trace.Pod{{Namespace: "shop", Name: "client", IPs: []string{"10.88.0.9"}, Node: "node-1"}},
	}
	count := func() int {
		env, err := enrich.NewSnapshotEnv("node-1", snap)
		if err != nil {
			t.Fatal(err)
		}
		r := Audit("node-1", snap, env)
		logReport(t, r)
		n := 0
		for _, f := range r.Findings {
			if f.Verdict == VerdictStaleHostPort {
				n++
				if f.Rule == nil || !f.Rule.NFTables() || f.Rule.Handle == 0 || f.Rule.Owner.ContainerID != "4f2a9c1e0b7d" {
					t.Errorf("rule %+v", f.Rule)
				}
			}
		}
		return n
	}
	if n := count(); n != 3 {
		t.Fatalf("%d stale rules, want the sandbox's 3 DNATs", n)
	}
	snap.Pods = append(snap.Pods, trace.Pod{Namespace: "web", Name: "nginx", IPs: []string{"10.88.0.2"}, Node: "node-1", HostPorts: []string{"tcp/8080"}})
	if n := count(); n != 0 {
		t.Fatalf("%d stale rules with the pod present", n)
	}
}

// The lab's recordings (tracer lab --record, testdata/lab-*.ndjson): each
// flow the live tracer reported is predicted from the recording's header,
// the node as it was before the traffic, with the verdict the live tracer
// gave it; the audit finds the hijacks where there are some and no
// problem on the healthy node. In the seed's node mysql-b's own ClusterIP
// is taken too: the hostPort DNAT bypasses kube-proxy for it, to the one
// pod. On the nftables node portmap's and kube-proxy's DNAT chains share
// priority dstnat, whose order the ruleset does not show: the problems
// are uncertain ("?").
func TestAuditLabRecordings(t *testing.T) {
	for _, c := range []struct {
		file     string
		problems []string
	}{
		{"lab-hostport-hijack-clusterip.ndjson", []string{"hostport-hijack 10.96.0.10:3306", "hostport-hijack 10.96.0.11:3306"}},
		{"lab-nft-hostport-hijack-clusterip-v1.8.ndjson", []string{"hostport-hijack? 10.96.0.10:3306", "hostport-hijack? 10.96.0.11:3306"}},
		{"lab-nft-healthy-service.ndjson", nil},
		// The dual-stack node: the live flows are IPv6; the audit finds
		// the hijack in each family's rules.
		{"lab-dualstack-hostport-hijack-clusterip.ndjson", []string{"hostport-hijack 10.96.0.10:3306", "hostport-hijack 10.96.0.11:3306",
			"hostport-hijack [fd96::10]:3306", "hostport-hijack [fd96::11]:3306"}},
	} {
		t.Run(c.file, func(t *testing.T) {
			tr, err := trace.ReadFile("testdata/" + c.file)
			if err != nil {
				t.Fatal(err)
			}
			snap := tr.Header.Snapshot
			env, err := enrich.NewSnapshotEnv(tr.Header.Node, snap)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range tr.Flows {
				src, dst := trace.ParseEndpoint(f.Orig.Src), trace.ParseEndpoint(f.Orig.Dst)
				p, err := predict.Predict(env, predict.Conn{Proto: f.Proto, Src: src.Addr(), Dst: dst})
				if err != nil {
					t.Fatal(err)
				}
				if p.Verdict() != f.Verdict {
					t.Errorf("%s %s -> %s: predicted %s (uncertain %q), live %s", f.Proto, f.Orig.Src, f.Orig.Dst, p.Verdict(), p.Uncertain, f.Verdict)
				}
			}
			r := Audit(tr.Header.Node, snap, env)
			logReport(t, r)
			var got []string
			for _, f := range r.Findings {
				if f.Severity != Problem {
					continue
				}
				v := f.Verdict
				if len(f.Uncertain) > 0 {
					v += "?"
				}
				got = append(got, v+" "+strings.Fields(f.To)[0])
			}
			if strings.Join(got, ",") != strings.Join(c.problems, ",") {
				t.Errorf("problems %q, want %q", got, c.problems)
			}
		})
	}
}

// An IPv6 hostPort rule portmap left behind is named as ip6tables lists
// it, and the fix says to look with ip6tables-save.
func TestAuditStaleHostPortIPv6(t *testing.T) {
	const dn = "CNI-DN-0123456789abcdef01234"
	snap := &trace.Snapshot{Rules: map[string]string{"ip6/nat": "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n:" + dn + " - [0:0]\n" +
		"-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n-A CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 3306 -j " + dn + "\n" +
		"-A " + dn + " -p tcp -m tcp --dport 3306 -j DNAT --to-destination [fd44::5]:3306\nCOMMIT\n"},
		// Pod metadata, without the pod the rule was written for.
		Pods: []trace.Pod{{Namespace: "db", Name: "mysql-a", IPs: []string{"10.244.1.4", "fd44::4"}, Node: "node"}}}
	r := auditSnap(t, "node", snap)
	var found *Finding
	for i, f := range r.Findings {
		if f.Verdict == VerdictStaleHostPort {
			found = &r.Findings[i]
		}
	}
	if found == nil {
		t.Fatal("no stale hostPort finding for the IPv6 rule")
	}
	if found.Rule.Family != "ip6" || !strings.Contains(found.Explanation, "no pod holds fd44::5") || !strings.Contains(found.Explanation, "`ip6tables-save -t nat | grep "+dn+"`") {
		t.Errorf("finding: rule %+v, explanation %q", found.Rule, found.Explanation)
	}
}
