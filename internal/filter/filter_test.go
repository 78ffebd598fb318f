package filter

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

func incidentFlows(t testing.TB) []*trace.Flow {
	tr, err := trace.ReadFile("../../testdata/traces/node2-incident.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	return tr.Flows
}

// matching returns the indexes of the incident trace's flows that expr
// matches. The trace's flows, in order: 0 dns ok, 1 mysql hijack, 2 api
// server ok, 3 ping filter-reject, 4 cart no-endpoint, 5 LB
// return-path-mismatch, 6 reset, 7 dropped, 8 shop/api ok, 9 mysql hijack,
// 10 snat ok.
func matching(t *testing.T, flows []*trace.Flow, expr string) []int {
	t.Helper()
	f, err := Parse(expr)
	if err != nil {
		t.Fatalf("parse %q: %v", expr, err)
	}
	var got []int
	for i, fl := range flows {
		if f.Match(fl) {
			got = append(got, i)
		}
	}
	return got
}

func TestMatch(t *testing.T) {
	flows := incidentFlows(t)
	cases := []struct {
		expr string
		want []int
	}{
		{"", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{"port:3306", []int{1, 9}},
		{"port:8080", []int{4, 5, 8}},     // reply.src port 8080 for 5 and 8
		{"ip:10.96.0.20", []int{1, 3, 9}}, // orig dst, ping dst
		{"ip:10.244.1.5", []int{1, 9}},    // reply.src and the DNAT target
		{"ip:192.168.1.20", []int{6, 10}}, // reset dst, SNAT target via reply.dst
		{"ip:10.96.0.0/16", []int{0, 1, 2, 3, 4, 8, 9}},
		{"ip:198.51.100.0/24 proto:tcp", []int{5}},
		{"verdict:hostport-hijack", []int{1, 9}},
		{"!verdict:ok", []int{1, 3, 4, 5, 6, 7, 9}},
		{"proto:udp", []int{0}},
		{"proto:icmp", []int{3}},
		{"pod:db/mysql-b-0", []int{1, 9}}, // dst pod and rule owner
		{"pod:mysql-b", []int{1, 9}},      // a StatefulSet's pods by prefix
		{"pod:mysq", nil},                 // a prefix must end at a dash
		{"pod:checkout", []int{0, 1, 2, 4, 6, 8, 9, 10}},
		{"ns:db", []int{1, 3, 9}}, // dst pod, service namespace
		{"ns:web", []int{5}},
		{"kube-ipvs0", []int{1, 3, 9}}, // explanation
		{"KUBE-IPVS-FILTER", []int{3}}, // rule chain, any case
		{"cni-dn-733b5c318e3a34b1f1ddf", []int{1, 9}},
		{"invalid", []int{7}},
		{"10.96.0.20:3306", []int{1, 9}}, // a free word with a colon
		{"mysql-a !verdict:hostport-hijack", []int{3}},
		{`"no real server"`, []int{4}},
		{"port:3306 !pod:checkout", nil},
		{"coredns ns:kube-system", []int{0}},
	}
	for _, c := range cases {
		if got := matching(t, flows, c.expr); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q matches %v, want %v", c.expr, got, c.want)
		}
	}
}

func TestParseErrorsNameTermAndColumn(t *testing.T) {
	cases := []struct{ expr, want string }{
		{"port:abc", "port:abc: not a port number (0-65535) (column 1)"},
		{"proto:tcp port:99999", "port:99999: not a port number (0-65535) (column 11)"},
		{"ip:10.0.0.300", "ip:10.0.0.300: not an IP address or CIDR (column 1)"},
		{"ip:10.0.0.0/33", "not an IP address or CIDR"},
		{"verdict:hijack", "verdict:hijack: unknown verdict: use one of hostport-hijack,"},
		{"proto:gre", "proto:gre: unknown protocol"},
		{"  prot:tcp", `prot:tcp: unknown field "prot"`},
		{"pod:/x", "pod:/x: not a pod"},
		{"ns:", "ns:: empty value after ns:"},
		{"a ! b", "!: nothing after !: write !term"},
		{`x "open`, `"open: unclosed quote (column 3)`},
	}
	for _, c := range cases {
		_, err := Parse(c.expr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) error %v, want %q", c.expr, err, c.want)
		}
	}
}

func TestKernelTerms(t *testing.T) {
	ports, pfx, protos, ok := MustParse("proto:tcp port:3306 ip:10.96.0.0/12").KernelTerms()
	if !ok || !reflect.DeepEqual(ports, []uint16{3306}) || !reflect.DeepEqual(protos, []uint8{6}) ||
		!reflect.DeepEqual(pfx, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}) {
		t.Errorf("got %v %v %v %v", ports, pfx, protos, ok)
	}
	if _, _, _, ok := MustParse("").KernelTerms(); !ok {
		t.Error("the empty filter is an open kernel filter")
	}
	for _, expr := range []string{"!port:53", "port:53 port:80", "pod:x port:53", "verdict:ok", "mysql"} {
		if _, _, _, ok := MustParse(expr).KernelTerms(); ok {
			t.Errorf("%q cannot be a kernel filter", expr)
		}
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	flows := incidentFlows(t)
	for _, expr := range []string{"port:3306", "ip:10.96.0.20", "ip:10.96.0.0/16", "pod:db/mysql-b-0", "ns:db", "verdict:ok", "kube-ipvs0 !proto:udp"} {
		f := MustParse(expr)
		allocs := testing.AllocsPerRun(10, func() {
			for _, fl := range flows {
				f.Match(fl)
			}
		})
		if allocs != 0 {
			t.Errorf("%q: %v allocations per pass", expr, allocs)
		}
	}
}

func TestContainsFold(t *testing.T) {
	cases := []struct {
		h, n string
		want bool
	}{
		{"KUBE-IPVS-FILTER", "ipvs-f", true},
		{"abc", "abcd", false},
		{"aXbAxB", "axb", true},
		{"xxxxA", "a", true},
		{"10.96.0.20:3306", "0.20:33", true},
		{"", "", true},
		{"Bba", "ba", true},
	}
	for _, c := range cases {
		if got := containsFold(c.h, c.n); got != c.want {
			t.Errorf("containsFold(%q, %q) = %v", c.h, c.n, got)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"port:3306", "!verdict:ok pod:db/x", `"a b" ip:10.0.0.0/8`, "!", `"`, "ns:", "ip:::1",
		"beef::1", "!cafe:1::/32", "ip:[fd00::1]", "[fd00::1]:80", "ip:[fd00::]/64"} {
		f.Add(s)
	}
	flows := append(incidentFlows(f), ipv6Flows()...)
	f.Fuzz(func(t *testing.T, expr string) {
		flt, err := Parse(expr)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %T is not *Error", err)
			}
			return
		}
		for i, fl := range flows {
			k := trace.KeysOf(fl)
			if a, b := flt.Match(fl), flt.MatchKeyed(fl, &k); a != b {
				t.Errorf("%q flow %d: Match %v, MatchKeyed %v", expr, i, a, b)
			}
		}
		flt.KernelTerms()
	})
}

// TestMatchKeyedAgreesWithMatch checks the integer fast path against the
// string matching for every flow and a range of terms.
func TestMatchKeyedAgreesWithMatch(t *testing.T) {
	flows := incidentFlows(t)
	flows = append(flows, &trace.Flow{Proto: "tcp", Orig: trace.Tuple{Src: "[fd00::1]:5000", Dst: "[fd00::2]:3306"},
		Events: []trace.Event{{Kind: trace.KindDNAT, To: "10.0.0.1-10.0.0.9:3300-3310"}}})
	flows = append(flows, ipv6Flows()...)
	for _, expr := range []string{"port:3306", "port:7", "port:3305", "!port:53", "ip:10.96.0.20", "ip:10.0.0.5",
		"ip:10.244.0.0/16", "ip:192.168.1.20", "ip:fd00::/64", "ip:0.0.0.0/0", "port:8080 ip:10.244.3.8", "proto:tcp port:443",
		"ip:beef::1", "ip:fd00::10", "ip:fd00::/125", "ip:::/0", "ip:cafe:1::/33", "port:40000 ip:cafe::/16", "!ip:beef::/16"} {
		f := MustParse(expr)
		for i, fl := range flows {
			k := trace.KeysOf(fl)
			if a, b := f.Match(fl), f.MatchKeyed(fl, &k); a != b {
				t.Errorf("%q flow %d: Match %v, MatchKeyed %v (keys %+v)", expr, i, a, b, k)
			}
		}
	}
}

// TestMatcherAgreesWithMatch runs the memoising matcher over a store, where
// flows share their pods, rules and explanations, twice over so that the
// second pass answers from memory.
func TestMatcherAgreesWithMatch(t *testing.T) {
	store := trace.NewStore()
	for range 2 {
		for _, fl := range incidentFlows(t) {
			store.Append(fl)
		}
	}
	view := store.Snapshot()
	for _, expr := range []string{"mysql", "kube-ipvs0", "checkout", "OK", "10.244.1", "!hijack", "db port:3306", "invalid !ns:db", "cni-dn"} {
		f := MustParse(expr)
		m := f.Matcher()
		var sf trace.StoredFlow
		for i := range view.Len() {
			view.Load(i, &sf)
			if a, b := f.Match(view.At(i)), m.Match(&sf); a != b {
				t.Errorf("%q flow %d: Match %v, Matcher %v", expr, i, a, b)
			}
		}
		allocs := testing.AllocsPerRun(5, func() {
			for i := range view.Len() {
				view.Load(i, &sf)
				m.Match(&sf)
			}
		})
		if allocs != 0 {
			t.Errorf("%q: %v allocations per pass", expr, allocs)
		}
	}
}

// A word finds a native nftables rule by its table and by the Service its
// map element's comment names, in both matchers.
func TestMatchNFTablesRule(t *testing.T) {
	f := &trace.Flow{Proto: "tcp", Orig: trace.Tuple{Src: "10.0.0.2:40000", Dst: "172.30.0.46:80"}, Verdict: trace.VerdictServiceNoEndpoint,
		Rule: &trace.Rule{Backend: trace.BackendNFTables, Family: "ip", Table: "kube-proxy", Chain: "reject-chain", Text: "reject",
			Element: &trace.RuleElement{Map: "no-endpoint-services", Key: "172.30.0.46 . tcp . 80", Comment: "ns6/svc6:p80"}}}
	for _, expr := range []string{"kube-proxy", "svc6", "!nosuch"} {
		flt, err := Parse(expr)
		if err != nil {
			t.Fatal(err)
		}
		store := trace.NewStore()
		store.Append(f)
		var sf trace.StoredFlow
		store.Snapshot().Load(0, &sf)
		if !flt.Match(f) || !flt.Matcher().Match(&sf) {
			t.Errorf("%q does not match the flow", expr)
		}
	}
}

// node: matches the node that saw a flow, or any of the nodes a merged
// flow was joined from.
func TestNodeTerm(t *testing.T) {
	one := &trace.Flow{Node: "node-1"}
	joined := &trace.Flow{Nodes: []string{"outside", "node-2"}}
	for _, tc := range []struct {
		expr string
		f    *trace.Flow
		want bool
	}{{"node:node-1", one, true}, {"node:node-2", one, false}, {"node:node-2", joined, true}, {"!node:outside", joined, false}, {"node:node-1", &trace.Flow{}, false}} {
		flt, err := Parse(tc.expr)
		if err != nil {
			t.Fatal(err)
		}
		if got := flt.Match(tc.f); got != tc.want {
			t.Errorf("%s on node %q nodes %v: %v, want %v", tc.expr, tc.f.Node, tc.f.Nodes, got, tc.want)
		}
	}
	if _, err := Parse("node:"); err == nil {
		t.Error("node: with no name parsed")
	}
	// A single node's trace names its node in the header alone.
	flt, _ := Parse("node:node-1")
	if !flt.OnNode("node-1").Match(&trace.Flow{}) || flt.OnNode("node-2").Match(&trace.Flow{}) || !flt.OnNode("node-2").Match(one) {
		t.Error("a flow naming no node is the trace's node's; one naming its node is that node's")
	}
}
