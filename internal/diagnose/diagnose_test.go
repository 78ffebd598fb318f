package diagnose

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// fakeEnv is the state of the node in INCIDENTS.md: node-2 in IPVS mode,
// with kube-ipvs0 holding the Service VIPs.
type fakeEnv struct {
	ipvs      map[string]trace.IPVSService // "proto vip"
	listeners map[string]trace.Listener    // "proto ip:port"
	onIPVS    map[netip.Addr][]string      // address -> service ports
	podNodes  map[string]string
	services  map[string]trace.Service
}

func newEnv() *fakeEnv {
	return &fakeEnv{
		ipvs: map[string]trace.IPVSService{
			"tcp 10.96.0.10:80":    {Proto: "tcp", Address: "10.96.0.10:80", Reals: []string{"10.244.1.5:8080", "10.244.2.7:8080"}},
			"tcp 192.168.1.200:80": {Proto: "tcp", Address: "192.168.1.200:80"},
			"tcp 10.96.0.20:3306":  {Proto: "tcp", Address: "10.96.0.20:3306", Reals: []string{"10.244.2.7:3306"}},
		},
		listeners: map[string]trace.Listener{"tcp 0.0.0.0:80": {Proto: "tcp", Address: "0.0.0.0:80", Process: "nginx-ingress"}},
		onIPVS: map[netip.Addr][]string{
			netip.MustParseAddr("10.96.0.10"):    {"tcp:80"},
			netip.MustParseAddr("10.96.0.20"):    {"tcp:3306"},
			netip.MustParseAddr("192.168.1.200"): {"tcp:80"},
			netip.MustParseAddr("fd00:10:96::a"): {"tcp:80"},
		},
		podNodes: map[string]string{"ns-b/mysql-b": "node-2", "ns-a/mysql-a": "node-1", "web/web-1": "node-1"},
		services: map[string]trace.Service{
			"ns-a/mysql-a": {Namespace: "ns-a", Name: "mysql-a", Type: "ClusterIP", ClusterIPs: []string{"10.96.0.20"}},
			"web/web":      {Namespace: "web", Name: "web", Type: "LoadBalancer", LBIPs: []string{"192.168.1.200"}, ETP: "Local"},
		},
	}
}

func (e *fakeEnv) NodeName() string                     { return "node-2" }
func (e *fakeEnv) OnKubeIPVS(a netip.Addr) bool         { _, ok := e.onIPVS[a]; return ok }
func (e *fakeEnv) ServicePortsOn(a netip.Addr) []string { return e.onIPVS[a] }
func (e *fakeEnv) IPVSService(proto string, vip netip.AddrPort) (trace.IPVSService, bool) {
	s, ok := e.ipvs[proto+" "+vip.String()]
	return s, ok
}
func (e *fakeEnv) Listener(proto string, dst netip.AddrPort) (trace.Listener, bool) {
	l, ok := e.listeners[proto+" 0.0.0.0:"+itoa(dst.Port())]
	return l, ok
}

// IsLocal: the node's address is 192.168.1.10; in IPVS mode the kube-ipvs0
// addresses are local too.
func (e *fakeEnv) IsLocal(a netip.Addr) (bool, error) {
	_, ipvs := e.onIPVS[a]
	return ipvs || a == netip.MustParseAddr("192.168.1.10"), nil
}
func (e *fakeEnv) PodNode(p trace.PodRef) string { return e.podNodes[p.Namespace+"/"+p.Name] }
func (e *fakeEnv) HostNetworkPod(proto string, port uint16) (trace.PodRef, bool) {
	if proto == "tcp" && port == 80 {
		return trace.PodRef{Namespace: "ingress", Name: "ingress-agent"}, true
	}
	return trace.PodRef{}, false
}
func (e *fakeEnv) Service(r trace.ServiceRef) (trace.Service, bool) {
	s, ok := e.services[r.Namespace+"/"+r.Name]
	return s, ok
}

func itoa(p uint16) string {
	return netip.AddrPortFrom(netip.IPv4Unspecified(), p).String()[len("0.0.0.0:"):]
}

var portmapRule = &trace.Rule{
	Table: "nat", Chain: "CNI-DN-733b5c318e3a34b1f1ddf", EntryChain: "CNI-HOSTPORT-DNAT",
	Path:  []string{"PREROUTING", "CNI-HOSTPORT-DNAT", "CNI-DN-733b5c318e3a34b1f1ddf"},
	Text:  "-A CNI-DN-733b5c318e3a34b1f1ddf -p tcp -m tcp --dport 3306 -j DNAT --to-destination 10.244.1.5:3306",
	Owner: &trace.Owner{ContainerID: "d8a1e2", Pod: &trace.PodRef{Namespace: "ns-b", Name: "mysql-b"}},
}

var filterRule = &trace.Rule{
	Table: "filter", Chain: "KUBE-IPVS-FILTER", Path: []string{"INPUT", "KUBE-IPVS-FILTER"},
	Text: "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable",
}

var filterRule6 = &trace.Rule{
	Family: "ip6", Table: "filter", Chain: "KUBE-IPVS-FILTER", Path: []string{"INPUT", "KUBE-IPVS-FILTER"},
	Text: "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-6-IPVS-IPS dst -j REJECT --reject-with icmp6-port-unreachable",
}

func flow(proto, src, dst, replySrc string, kinds ...string) *trace.Flow {
	f := &trace.Flow{Type: "flow", Proto: proto, Orig: trace.Tuple{Src: src, Dst: dst}}
	if replySrc != "" {
		f.Reply = &trace.Tuple{Src: replySrc, Dst: src}
	}
	for _, k := range kinds {
		e := trace.Event{Kind: k, Hook: "h", Via: "fentry"}
		switch k {
		case trace.KindReject:
			e.Reason = "icmp-port-unreachable"
			e.Packet = &trace.Tuple{Src: src, Dst: dst}
		case trace.KindReset:
			e.By = "stack"
			e.Reason = "NO_SOCKET"
		case trace.KindDrop:
			e.Reason = "NETFILTER_DROP"
		}
		f.Events = append(f.Events, e)
	}
	return f
}

func check(t *testing.T, f *trace.Flow, verdict string, facts ...string) {
	t.Helper()
	r := Diagnose(f, newEnv())
	if r.Verdict != verdict {
		t.Errorf("verdict %q, want %q; explanation: %s", r.Verdict, verdict, r.Explanation)
	}
	for _, fact := range facts {
		if !strings.Contains(r.Explanation, fact) {
			t.Errorf("explanation lacks %q: %s", fact, r.Explanation)
		}
	}
}

func TestHostportHijackOfClusterIP(t *testing.T) {
	f := flow("tcp", "10.244.2.9:40000", "10.96.0.20:3306", "10.244.1.5:3306", trace.KindDNAT)
	f.Rule = portmapRule
	f.Service = &trace.ServiceRef{Namespace: "ns-a", Name: "mysql-a", Port: "3306"}
	f.DstPod = &trace.PodRef{Namespace: "ns-b", Name: "mysql-b"}
	check(t, f, trace.VerdictHostportHijack, "10.96.0.20:3306 (Service ns-a/mysql-a)", "pod ns-b/mysql-b",
		"CNI-DN-733b5c318e3a34b1f1ddf", "kube-ipvs0", "CNI-HOSTPORT-DNAT", "Fix:")
}

func TestHostportHijackOfHostListener(t *testing.T) {
	f := flow("tcp", "172.18.0.9:40000", "172.18.0.2:80", "10.244.1.5:80", trace.KindDNAT)
	f.Rule = portmapRule
	check(t, f, trace.VerdictHostportHijack, "host listener on 0.0.0.0:80 (hostNetwork pod ingress/ingress-agent)", "pick one")
	if r := Diagnose(flowHijackVIP(), newEnv()); strings.Contains(r.Explanation, "pick one") {
		t.Errorf("listener advice given without a listener: %s", r.Explanation)
	}
}

// On an nftables node a hostPort equal to a NodePort wins by hook order,
// not by locality: portmap's chain and kube-proxy's share priority dstnat.
func TestHostportHijackOfNodePortNFT(t *testing.T) {
	f := flow("tcp", "10.180.0.2:40000", "192.168.1.10:30123", "10.180.0.6:8080", trace.KindDNAT)
	f.Rule = &trace.Rule{Backend: trace.BackendNFTables, Family: "ip", Table: "cni_hostport", Chain: "hostports", Handle: 18,
		EntryChain: "prerouting", Path: []string{"prerouting", "hostports_all", "hostports"},
		Text:  `tcp dport 30123 dnat to 10.180.0.6:8080 comment "45cd2b"`,
		Owner: &trace.Owner{ContainerID: "45cd2b", Pod: &trace.PodRef{Namespace: "web", Name: "hp-np"}}}
	f.Service = &trace.ServiceRef{Namespace: "web", Name: "np", Port: "http"}
	check(t, f, trace.VerdictHostportHijack, "bypassing Service web/np", "fib daddr type local",
		"priority dstnat", "registered last runs first", "before kube-proxy's Service rules")
	// A hostPort no Service shares: no word about kube-proxy's chains.
	f.Service = nil
	f.Orig.Dst = "192.168.1.10:80"
	if r := Diagnose(f, newEnv()); strings.Contains(r.Explanation, "priority dstnat") {
		t.Errorf("hook order explained where no Service was bypassed: %s", r.Explanation)
	}
}

// Near miss: a hostPort on a port nobody else owns is the hostPort working.
func TestHostportAsIntendedIsOK(t *testing.T) {
	f := flow("tcp", "172.18.0.9:40000", "172.18.0.2:3306", "10.244.1.5:3306", trace.KindDNAT)
	f.Rule = portmapRule
	check(t, f, trace.VerdictOK, "hostPort used as intended")
}

// Near miss: a DNAT to the same pod by kube-proxy's own rule is no hijack.
func TestServiceDNATIsOK(t *testing.T) {
	f := flow("tcp", "10.244.2.9:40000", "10.96.0.20:3306", "10.244.1.5:3306", trace.KindDNAT)
	f.Rule = &trace.Rule{Table: "nat", Chain: "KUBE-SEP-X", Path: []string{"PREROUTING", "KUBE-SERVICES", "KUBE-SVC-Y", "KUBE-SEP-X"}, Text: "-A KUBE-SEP-X -p tcp -j DNAT --to-destination 10.244.1.5:3306"}
	f.Service = &trace.ServiceRef{Namespace: "ns-a", Name: "mysql-a"}
	f.Conntrack = &trace.Conntrack{Replied: true}
	check(t, f, trace.VerdictOK, "DNAT'd to 10.244.1.5:3306")
}

func TestPingClusterIPRejectedByFilter(t *testing.T) {
	f := flow("icmp", "10.244.1.7", "10.96.0.10", "", trace.KindReject, trace.KindDrop)
	f.Rule = filterRule
	check(t, f, trace.VerdictIPVSFilterReject, "KUBE-IPVS-FILTER", "ICMP (ping)", "only tcp:80", "kube-ipvs0", "ping never will")
}

// ping6 to a ClusterIP is refused by the same filter as ping; the IPv6
// filter answers with the ICMPv6 error, never the IPv4 name.
func TestPing6ClusterIPRejectedByFilter(t *testing.T) {
	f := flow("icmpv6", "fd00:10:244:1::7", "fd00:10:96::a", "", trace.KindReject, trace.KindDrop)
	f.Events[0].Reason = "icmp6-port-unreachable"
	f.Rule = filterRule6
	check(t, f, trace.VerdictIPVSFilterReject, "ICMP (ping)", "only tcp:80", "ping never will",
		"REJECTs new connections with icmp6-port-unreachable", "ipset KUBE-6-IPVS-IPS")
	if r := Diagnose(f, newEnv()); strings.Contains(r.Explanation, "icmp-port-unreachable") {
		t.Errorf("IPv4 reject type named for an IPv6 flow: %s", r.Explanation)
	}
}

// The reject type comes from the kernel's event; without one, REJECT's
// default for the destination's family.
func TestFilterRejectNamesReason(t *testing.T) {
	for _, tt := range []struct {
		name, src, dst, reason, want string
	}{
		{"v4 reported", "10.244.1.7:40000", "192.168.1.200:443", "icmp-admin-prohibited", "with icmp-admin-prohibited"},
		{"v4 unreported", "10.244.1.7:40000", "192.168.1.200:443", "", "with icmp-port-unreachable"},
		{"v6 unreported", "[fd00:10:244:1::7]:40000", "[fd00:10:96::a]:443", "", "with icmp6-port-unreachable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := flow("tcp", tt.src, tt.dst, "", trace.KindReject)
			f.Events[0].Reason = tt.reason
			f.Rule = filterRule
			check(t, f, trace.VerdictIPVSFilterReject, tt.want)
		})
	}
}

// kube-proxy's nftables mode: ping6 gets the ping wording and advice.
func TestPing6ClusterIPRejectedNFT(t *testing.T) {
	f := flow("icmpv6", "fd00:10:244:1::7", "fd00:10:96::a", "", trace.KindReject)
	f.Events[0].Reason = "icmp6-port-unreachable"
	f.Rule = &trace.Rule{Backend: trace.BackendNFTables, Family: "ip6", Table: "kube-proxy", Chain: "cluster-ips-check", Handle: 12,
		EntryChain: "filter-input", Path: []string{"filter-input", "cluster-ips-check"},
		Text: `ip6 daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`}
	check(t, f, trace.VerdictClusterIPReject, "ICMP (ping)", "ping never will", "answered with icmp6-port-unreachable")
}

// An ip6tables rule is named as one; an IPv4 rule reads as it always has.
func TestRuleEvidenceFamily(t *testing.T) {
	f := flow("tcp", "10.244.1.7:40000", "192.168.1.200:443", "", trace.KindReject)
	f.Rule = filterRule
	check(t, f, trace.VerdictIPVSFilterReject, "Rule `"+filterRule.Text+"` (table filter, chain path INPUT → KUBE-IPVS-FILTER)")
	f = flow("tcp", "[fd00:10:244:1::7]:40000", "[fd00:10:96::a]:443", "", trace.KindReject)
	f.Rule = filterRule6
	check(t, f, trace.VerdictIPVSFilterReject, "ip6tables rule `"+filterRule6.Text+"` (table filter, chain path INPUT → KUBE-IPVS-FILTER)")
}

func TestLBPortOutsideClusterRejected(t *testing.T) {
	f := flow("tcp", "10.244.1.7:40000", "192.168.1.200:443", "", trace.KindReject)
	f.Rule = filterRule
	f.Service = &trace.ServiceRef{Namespace: "web", Name: "web"}
	check(t, f, trace.VerdictIPVSFilterReject, "tcp port 443", "ipMode: Proxy", "hostname")
}

// Without a rules snapshot the address on kube-ipvs0 still identifies it.
func TestFilterRejectWithoutRule(t *testing.T) {
	f := flow("icmp", "10.244.1.7", "10.96.0.10", "", trace.KindReject)
	check(t, f, trace.VerdictIPVSFilterReject, "not attributed")
}

// Near miss: a REJECT in another chain is not KUBE-IPVS-FILTER.
func TestOtherRejectIsRejected(t *testing.T) {
	f := flow("udp", "10.244.1.7:5000", "10.96.0.10:53", "", trace.KindReject)
	f.Rule = &trace.Rule{Table: "filter", Chain: "MY-FIREWALL", Path: []string{"FORWARD", "MY-FIREWALL"}, Text: "-A MY-FIREWALL -p udp -j REJECT"}
	check(t, f, trace.VerdictRejected, "MY-FIREWALL", "icmp-port-unreachable")
}

func TestIPVSNoEndpoint(t *testing.T) {
	f := flow("tcp", "172.18.0.9:40000", "192.168.1.200:80", "", trace.KindIPVSNoDest, trace.KindReject)
	f.Events[0].Virtual = "192.168.1.200:80"
	f.Service = &trace.ServiceRef{Namespace: "web", Name: "web"}
	check(t, f, trace.VerdictIPVSNoEndpoint, "no real server", "externalTrafficPolicy=Local", "before 1.24")
}

func TestReturnPathOnDNATNode(t *testing.T) {
	f := flow("tcp", "172.18.0.99:40000", "192.168.1.200:80", "10.244.2.7:8080", trace.KindIPVS)
	f.Events[0].To = "10.244.2.7:8080"
	f.Conntrack = &trace.Conntrack{Replied: false, State: "SYN_SENT"}
	f.DstPod = &trace.PodRef{Namespace: "ns-a", Name: "mysql-a"}
	f.Service = &trace.ServiceRef{Namespace: "web", Name: "web"}
	check(t, f, trace.VerdictReturnPathMismatch, "without SNAT", "node-1", "UNREPLIED", "since Kubernetes 1.24")
}

// Near miss: the same DNAT with its reply seen is fine.
func TestRepliedRemoteDNATIsOK(t *testing.T) {
	f := flow("tcp", "172.18.0.99:40000", "192.168.1.200:80", "10.244.2.7:8080", trace.KindIPVS)
	f.Events[0].To = "10.244.2.7:8080"
	f.Conntrack = &trace.Conntrack{Replied: true}
	f.DstPod = &trace.PodRef{Namespace: "ns-a", Name: "mysql-a"}
	check(t, f, trace.VerdictOK, "real server 10.244.2.7:8080")
}

func TestReturnPathOnClient(t *testing.T) {
	f := flow("tcp", "172.18.0.99:40000", "192.168.1.200:80", "192.168.1.200:80", trace.KindReset)
	f.Events[0].Packet = &trace.Tuple{Src: "10.244.2.7:8080", Dst: "172.18.0.99:40000"}
	f.Conntrack = &trace.Conntrack{Replied: false}
	check(t, f, trace.VerdictReturnPathMismatch, "10.244.2.7:8080", "different five-tuple")
}

func TestStackResetAndDrop(t *testing.T) {
	f := flow("tcp", "10.0.0.1:40000", "10.0.0.2:9999", "10.0.0.2:9999", trace.KindReset)
	f.Events[0].Packet = &trace.Tuple{Src: "10.0.0.1:40000", Dst: "10.0.0.2:9999"}
	check(t, f, trace.VerdictReset, "NO_SOCKET", "no socket listens on 10.0.0.2:9999")
	f = flow("tcp", "10.0.0.1:40000", "10.0.0.2:22", "", trace.KindDrop)
	f.Rule = &trace.Rule{Table: "filter", Chain: "INPUT", Text: "-A INPUT -p tcp --dport 22 -j DROP"}
	check(t, f, trace.VerdictDropped, "NETFILTER_DROP", "-A INPUT -p tcp --dport 22 -j DROP")
}

// A connection every packet of which a rule dropped before conntrack
// confirmed its entry is in no conntrack table: the explanation says so,
// for whoever looks there next. DNAT'd to a pod on another node and never
// answered, it is still the drop, not a return path: its packets never
// left.
func TestDropOfUnconfirmedConnection(t *testing.T) {
	f := flow("tcp", "10.0.0.1:40000", "10.0.0.2:22", "", trace.KindDrop)
	f.Rule = &trace.Rule{Table: "filter", Chain: "INPUT", Text: "-A INPUT -p tcp --dport 22 -m conntrack --ctstate NEW -j DROP"}
	f.Conntrack = &trace.Conntrack{Unconfirmed: true}
	check(t, f, trace.VerdictDropped, "--ctstate NEW -j DROP", "never confirmed", "conntrack -L and conntrack -E do not show it")
	f.Conntrack = &trace.Conntrack{State: "ESTABLISHED", Replied: true}
	if r := Diagnose(f, newEnv()); strings.Contains(r.Explanation, "never confirmed") {
		t.Errorf("a confirmed connection's drop names its entry: %s", r.Explanation)
	}

	f = flow("tcp", "172.18.0.99:40000", "192.168.1.200:80", "10.244.2.7:8080", trace.KindDNAT)
	f.Events[0].To = "10.244.2.7:8080"
	drop := f.Events[0]
	drop.Kind, drop.To, drop.Reason = trace.KindDrop, "", "NETFILTER_DROP"
	f.Events = append(f.Events, drop)
	f.DstPod = &trace.PodRef{Namespace: "ns-a", Name: "mysql-a"}
	f.Rule = &trace.Rule{Table: "filter", Chain: "FORWARD", Text: "-A FORWARD -d 10.244.2.7/32 -j DROP"}
	f.Conntrack = &trace.Conntrack{Status: []string{"DST_NAT"}, Unconfirmed: true}
	check(t, f, trace.VerdictDropped, "-A FORWARD -d 10.244.2.7/32 -j DROP", "never confirmed")
}

func TestNetfilterResetIsRejected(t *testing.T) {
	f := flow("tcp", "10.0.0.1:40000", "10.0.0.2:81", "", trace.KindReset)
	f.Events[0].By = "netfilter"
	check(t, f, trace.VerdictRejected, "tcp-reset")
}

func flowHijackVIP() *trace.Flow {
	f := flow("tcp", "10.244.2.9:40000", "10.96.0.20:3306", "10.244.1.5:3306", trace.KindDNAT)
	f.Rule = portmapRule
	return f
}

// A drop whose rule is a REJECT is the REJECT's drop (its reset or ICMP
// may go out unseen, e.g. for bridged packets).
func TestDropByRejectRuleIsRejected(t *testing.T) {
	f := flow("tcp", "10.244.1.2:40000", "10.244.2.2:9000", "", trace.KindDrop)
	f.Rule = &trace.Rule{Table: "filter", Chain: "LAB-POLICY", Text: "-A LAB-POLICY -p tcp --dport 9000 -j REJECT --reject-with tcp-reset"}
	check(t, f, trace.VerdictRejected, "REJECT rule", "tcp-reset")
}

func TestSentences(t *testing.T) {
	for _, c := range []struct {
		parts []string
		want  string
	}{
		{[]string{"ok: a went to b", " Rule `x`. ", "", "  ", "Conntrack entry replied"}, "ok: a went to b. Rule `x`. Conntrack entry replied."},
		{nil, ""},
		{[]string{"", "one."}, "one."},
	} {
		if got := sentences(c.parts...); got != c.want {
			t.Errorf("sentences(%q) = %q, want %q", c.parts, got, c.want)
		}
	}
}

// The IPv6 twins of verdicts whose tests above are IPv4: the same events
// with bracketed endpoints give the same verdicts and name the addresses.
func TestVerdictsIPv6(t *testing.T) {
	f := flow("tcp", "[fd00:18::9]:40000", "[fd00:1::200]:80", "", trace.KindIPVSNoDest, trace.KindReject)
	f.Events[0].Virtual = "[fd00:1::200]:80"
	f.Service = &trace.ServiceRef{Namespace: "web", Name: "web"}
	check(t, f, trace.VerdictIPVSNoEndpoint, "no real server", "[fd00:1::200]:80")

	f = flow("tcp", "[fd00:18::99]:40000", "[fd00:1::200]:80", "[fd44:2::7]:8080", trace.KindIPVS)
	f.Events[0].To = "[fd44:2::7]:8080"
	f.Conntrack = &trace.Conntrack{Replied: false, State: "SYN_SENT"}
	f.DstPod = &trace.PodRef{Namespace: "ns-a", Name: "mysql-a"}
	check(t, f, trace.VerdictReturnPathMismatch, "without SNAT", "[fd44:2::7]:8080")

	f = flow("tcp", "[fd00:18::99]:40000", "[fd00:1::200]:80", "[fd00:1::200]:80", trace.KindReset)
	f.Events[0].Packet = &trace.Tuple{Src: "[fd44:2::7]:8080", Dst: "[fd00:18::99]:40000"}
	f.Conntrack = &trace.Conntrack{Replied: false}
	check(t, f, trace.VerdictReturnPathMismatch, "[fd44:2::7]:8080", "different five-tuple")

	f = flow("tcp", "[fd00::1]:40000", "[fd00::2]:9999", "[fd00::2]:9999", trace.KindReset)
	f.Events[0].Packet = &trace.Tuple{Src: "[fd00::1]:40000", Dst: "[fd00::2]:9999"}
	check(t, f, trace.VerdictReset, "no socket listens on [fd00::2]:9999")
}
