package enrich

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/trace"
)

// kubeProxyNFTNode is a node whose rules are kube-proxy's nftables mode:
// the real kube-proxy v1.37.2's ruleset (the 1.34+ layout), or the 1.31 to
// 1.33 layout written from v1.33.0's proxier.go (internal/nft/testdata,
// tests/controlplane/kubeproxy). Node 198.51.100.10; Services ns4/svc4
// 172.30.0.44:80 with endpoints 10.180.0.4 and .5, ns6/svc6 172.30.0.46:80
// without endpoints, ns7/svc7 NodePort 30007 with externalTrafficPolicy
// Local and its endpoint on another node, ns8/svc8 172.30.0.48 udp 53.
func kubeProxyNFTNode(t *testing.T, js, listing string) (*trace.Snapshot, string) {
	t.Helper()
	j, err := os.ReadFile("../nft/testdata/" + js)
	if err != nil {
		t.Fatal(err)
	}
	l, err := os.ReadFile("../nft/testdata/" + listing)
	if err != nil {
		t.Fatal(err)
	}
	port := func(name string, p, np uint16) []trace.ServicePort {
		return []trace.ServicePort{{Name: name, Proto: "TCP", Port: p, NodePort: np}}
	}
	return &trace.Snapshot{
		Addresses: []trace.Address{{Interface: "eth0", Address: "198.51.100.10/24", Up: true}},
		NFTables:  &trace.NFTRuleset{JSON: j, Listing: string(l)},
		Pods: []trace.Pod{
			{Namespace: "ns1", Name: "client", IPs: []string{"10.180.0.9"}, Node: "node-1"},
			{Namespace: "ns4", Name: "ep-4", IPs: []string{"10.180.0.4"}, Node: "node-1"},
			{Namespace: "ns4", Name: "ep-5", IPs: []string{"10.180.0.5"}, Node: "node-1"},
		},
		Services: []trace.Service{
			{Namespace: "ns4", Name: "svc4", Type: "ClusterIP", ClusterIPs: []string{"172.30.0.44"}, Ports: port("p80", 80, 0)},
			{Namespace: "ns6", Name: "svc6", Type: "ClusterIP", ClusterIPs: []string{"172.30.0.46"}, Ports: port("p80", 80, 0)},
			{Namespace: "ns7", Name: "svc7", Type: "NodePort", ClusterIPs: []string{"172.30.0.47"}, ETP: "Local", Ports: port("p80", 80, 30007)},
		},
	}, string(l)
}

// handleOf finds the handle of the rule of table ip kube-proxy's chain
// whose text starts with prefix, in the listing: the expected identity
// comes from nft's own listing, not from the tracer.
func handleOf(t *testing.T, listing, chain, prefix string) (uint64, string) {
	t.Helper()
	var in, inTable bool
	re := regexp.MustCompile(`^(.*) # handle (\d+)$`)
	for _, line := range strings.Split(listing, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(l, "table "):
			inTable = strings.HasPrefix(l, "table ip kube-proxy ")
		case strings.HasPrefix(l, "chain "):
			in = inTable && strings.Fields(l)[1] == chain
		case in && strings.HasPrefix(l, prefix):
			if m := re.FindStringSubmatch(l); m != nil {
				h, _ := strconv.ParseUint(m[2], 10, 64)
				return h, m[1]
			}
		}
	}
	t.Fatalf("no rule %q in chain %s", prefix, chain)
	return 0, ""
}

func TestJoinKubeProxyNFT(t *testing.T) {
	layouts := []struct{ name, js, listing, filterOut string }{
		{"v1.37.2", "kube-proxy-v1.37.2.json", "kube-proxy-v1.37.2.nft", "filter-output"},
		{"v1.33 layout", "kube-proxy-v1.33-layout.json", "kube-proxy-v1.33-layout.nft-a", "filter-output-post-dnat"},
	}
	icmp := func(src, dst string) event.Event {
		e := rejectEvent(event.ViaTracepoint, event.NFHookNone, src, dst)
		e.Packet.Proto = 1
		return e
	}
	for _, lay := range layouts {
		t.Run(lay.name, func(t *testing.T) {
			snap, listing := kubeProxyNFTNode(t, lay.js, lay.listing)
			cases := []struct {
				name    string
				evs     []event.Event
				proto   string
				chain   string
				rule    string // the rule's text starts with this
				entry   string
				verdict string
				says    []string
				element string // the element's comment, if one must be named
			}{
				{"ping to a ClusterIP from a pod", []event.Event{icmp("10.180.0.9:0", "172.30.0.44:0")}, "icmp",
					"cluster-ips-check", "ip daddr @cluster-ips reject", "filter-forward", trace.VerdictClusterIPReject,
					[]string{"ICMP (ping)", "cluster-ips-check", "it accepts only tcp:80"}, ""},
				// What a ClusterIP accepts is read from kube-proxy's maps: a
				// port without endpoints is in no-endpoint-services only.
				{"ping to the ClusterIP of a Service without endpoints", []event.Event{icmp("10.180.0.9:0", "172.30.0.46:0")}, "icmp",
					"cluster-ips-check", "ip daddr @cluster-ips reject", "filter-forward", trace.VerdictClusterIPReject,
					[]string{"ICMP (ping)", "it accepts only tcp:80"}, ""},
				{"wrong port to a ClusterIP from the node", []event.Event{rejectEvent(event.ViaTracepoint, event.NFHookNone, "198.51.100.10:40000", "172.30.0.44:8080")}, "tcp",
					"cluster-ips-check", "ip daddr @cluster-ips reject", lay.filterOut, trace.VerdictClusterIPReject,
					[]string{"tcp port 8080", "Service ns4/svc4", "it accepts only tcp:80"}, ""},
				{"unallocated ClusterIP", []event.Event{dropEvent("10.180.0.9:40000", "172.30.9.9:80")}, "tcp",
					"cluster-ips-check", "ip daddr 172.30.0.0/16 drop", "filter-forward", trace.VerdictClusterIPReject,
					[]string{"no Service has address 172.30.9.9"}, ""},
				{"Service without endpoints", []event.Event{rejectEvent(event.ViaTracepoint, event.NFHookNone, "10.180.0.9:40000", "172.30.0.46:80")}, "tcp",
					"reject-chain", "reject", "filter-forward", trace.VerdictServiceNoEndpoint,
					[]string{"Service ns6/svc6", "no-endpoint-services"}, "ns6/svc6:p80"},
				{"NodePort of a Local Service without a local endpoint", []event.Event{dropEvent("203.0.113.2:40000", "198.51.100.10:30007")}, "tcp",
					"nodeport-endpoints-check", "ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports", "filter-input", trace.VerdictServiceNoEndpoint,
					[]string{"Service ns7/svc7", "externalTrafficPolicy: Local"}, "ns7/svc7:p80"},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					f := joinOn(t, snap, c.evs...)
					handle, text := handleOf(t, listing, c.chain, c.rule)
					r := f.Rule
					if r == nil || !r.NFTables() || r.Family != "ip" || r.Table != "kube-proxy" || r.Chain != c.chain ||
						r.Handle != handle || r.Text != text || r.EntryChain != c.entry || r.Uncertain != "" {
						t.Fatalf("rule %+v, want %s handle %d %q from %s", r, c.chain, handle, text, c.entry)
					}
					if c.element != "" && (r.Element == nil || r.Element.Comment != c.element) {
						t.Errorf("element %+v, want comment %q", r.Element, c.element)
					}
					if f.Verdict != c.verdict {
						t.Fatalf("verdict %s, want %s: %s", f.Verdict, c.verdict, f.Explanation)
					}
					for _, s := range c.says {
						if !strings.Contains(f.Explanation, s) {
							t.Errorf("explanation lacks %q: %s", s, f.Explanation)
						}
					}
				})
			}
		})
	}
}

// TestJoinKubeProxyNFTServiceDNAT: a healthy connection to a ClusterIP is
// attributed to the DNAT of the Service's chain, the endpoint the kernel
// chose among numgen's is the one named, and the verdict is ok.
func TestJoinKubeProxyNFTServiceDNAT(t *testing.T) {
	for _, lay := range []struct{ name, js, listing, chain, rule string }{
		{"v1.37.2", "kube-proxy-v1.37.2.json", "kube-proxy-v1.37.2.nft", "service-LAUZTJTB-ns4/svc4/tcp/p80", "meta l4proto tcp dnat ip to numgen random mod 2 map"},
		{"v1.33 layout", "kube-proxy-v1.33-layout.json", "kube-proxy-v1.33-layout.nft-a", "endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80", "meta l4proto tcp dnat to 10.180.0.5:80"},
	} {
		t.Run(lay.name, func(t *testing.T) {
			snap, listing := kubeProxyNFTNode(t, lay.js, lay.listing)
			f := joinOn(t, snap, dnatTo("10.180.0.9:40000", "172.30.0.44:80", "10.180.0.5:80"))
			handle, text := handleOf(t, listing, lay.chain, lay.rule)
			r := f.Rule
			if r == nil || r.Table != "kube-proxy" || r.Chain != lay.chain || r.Handle != handle || r.Text != text ||
				r.EntryChain != "nat-prerouting" || r.Uncertain != "" || !slices.Contains(r.Path, "services") {
				t.Fatalf("rule %+v, want %s handle %d %q", r, lay.chain, handle, text)
			}
			if r.Element == nil || r.Element.Map != "service-ips" || r.Element.Key != "172.30.0.44 . tcp . 80" {
				t.Errorf("element %+v", r.Element)
			}
			if f.Verdict != trace.VerdictOK || f.DstPod == nil || f.DstPod.Key() != "ns4/ep-5" || !strings.Contains(f.Explanation, "10.180.0.5:80 (pod ns4/ep-5)") {
				t.Errorf("verdict %s dst %+v: %s", f.Verdict, f.DstPod, f.Explanation)
			}
			// The other endpoint is not where this connection went: a DNAT
			// to an address no rule names is not attributed with certainty.
			g := joinOn(t, snap, dnatTo("10.180.0.9:40001", "172.30.0.44:80", "10.180.0.66:80"))
			if g.Rule != nil && g.Rule.Uncertain == "" && g.Rule.Table == "kube-proxy" {
				t.Errorf("DNAT to an address no rule names attributed to %+v", g.Rule)
			}
		})
	}
}

// TestJoinNodePortShadowedByHostPort: portmap's v1.10 nat chain and
// kube-proxy's share priority -100 at prerouting, so which one ran first
// is read from what the kernel did. A hostPort on the NodePort's port (the
// portmap fixture's 8080 renumbered 30007) that took the connection is a
// hijack of the NodePort.
func TestJoinNodePortShadowedByHostPort(t *testing.T) {
	snap, _ := kubeProxyNFTNode(t, "kube-proxy-v1.37.2.json", "kube-proxy-v1.37.2.nft")
	pmJS, err := os.ReadFile("../nft/testdata/portmap-v1.10.0.json")
	if err != nil {
		t.Fatal(err)
	}
	pmList, err := os.ReadFile("../nft/testdata/portmap-v1.10.0.nft")
	if err != nil {
		t.Fatal(err)
	}
	pmJS = []byte(strings.Replace(string(pmJS), `"right": 8080}`, `"right": 30007}`, 1))
	pmList = []byte(strings.Replace(string(pmList), "tcp dport 8080 dnat", "tcp dport 30007 dnat", 1))
	snap.NFTables = &trace.NFTRuleset{JSON: mergeNFT(t, snap.NFTables.JSON, pmJS), Listing: snap.NFTables.Listing + string(pmList)}
	snap.Pods = append(snap.Pods, trace.Pod{Namespace: "web", Name: "hp-0", IPs: []string{"10.88.0.2"}, Node: "node-1", ContainerID: "4f2a9c1e0b7d"})

	f := joinOn(t, snap, dnatTo("203.0.113.2:40000", "198.51.100.10:30007", "10.88.0.2:80"))
	r := f.Rule
	if r == nil || r.Table != "cni_hostport" || r.Text != `tcp dport 30007 dnat to 10.88.0.2:80 comment "4f2a9c1e0b7d"` || r.Uncertain != "" {
		t.Fatalf("rule %+v", r)
	}
	if f.Verdict != trace.VerdictHostportHijack || !strings.Contains(f.Explanation, "Service ns7/svc7") {
		t.Errorf("verdict %s: %s", f.Verdict, f.Explanation)
	}
}

// mergeNFT joins two `nft -j list ruleset` documents, as one namespace
// holding both tables would list them.
func mergeNFT(t *testing.T, a, b []byte) []byte {
	t.Helper()
	var da, db struct {
		Nftables []json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(a, &da); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &db); err != nil {
		t.Fatal(err)
	}
	da.Nftables = append(da.Nftables, db.Nftables[1:]...) // one metainfo
	out, err := json.Marshal(da)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
