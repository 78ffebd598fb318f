package diagnose

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// kube-proxy's no-endpoint rules: the texts are kube-proxy's own (its
// proxier_test.go, kubernetes v1.37.2) and, for svc6RejectSaved, the same
// rule as iptables-save prints it once the kernel holds it.
const (
	svc6Reject      = `-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT`
	svc6RejectSaved = `-A KUBE-SERVICES -d 172.30.0.46/32 -p tcp -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`
	svc2NodePort    = `-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP`
)

func kubeServicesRule(text string) *trace.Rule {
	return &trace.Rule{Table: "filter", Chain: "KUBE-SERVICES", EntryChain: "KUBE-SERVICES", Path: []string{"FORWARD", "KUBE-SERVICES"}, Text: text}
}

func externalServicesRule(text string) *trace.Rule {
	return &trace.Rule{Table: "filter", Chain: "KUBE-EXTERNAL-SERVICES", EntryChain: "KUBE-EXTERNAL-SERVICES", Path: []string{"INPUT", "KUBE-EXTERNAL-SERVICES"}, Text: text}
}

// A pod's connection to a ClusterIP whose Service has no endpoints: the
// ICMP error of kube-proxy's REJECT, then the REJECT's drop.
func TestServiceNoEndpointReject(t *testing.T) {
	for _, text := range []string{svc6Reject, svc6RejectSaved} {
		f := flow("tcp", "10.0.0.2:40000", "172.30.0.46:80", "", trace.KindReject, trace.KindDrop)
		f.Rule = kubeServicesRule(text)
		f.Service = &trace.ServiceRef{Namespace: "ns6", Name: "svc6", Port: "p80"}
		check(t, f, trace.VerdictServiceNoEndpoint, "Service ns6/svc6 (port p80) has no ready endpoint",
			"from 10.0.0.2:40000 to 172.30.0.46:80", "icmp-port-unreachable", `"connection refused"`,
			"Rule `"+text+"`", "FORWARD → KUBE-SERVICES", `"ns6/svc6:p80 has no endpoints"`,
			"`kubectl get endpointslices -n ns6 -l kubernetes.io/service-name=svc6 -o wide`", "readiness")
	}
}

// The REJECT's drop alone (its ICMP error unseen) is still the Service's
// rejection, and says what was not seen.
func TestServiceNoEndpointRejectSeenAsDrop(t *testing.T) {
	f := flow("tcp", "10.0.0.2:40000", "172.30.0.46:80", "", trace.KindDrop)
	f.Rule = kubeServicesRule(svc6Reject)
	f.Service = &trace.ServiceRef{Namespace: "ns6", Name: "svc6", Port: "p80"}
	check(t, f, trace.VerdictServiceNoEndpoint, "has no ready endpoint", "ICMP error the kernel did not report")
}

// externalTrafficPolicy Local and no endpoint on this node: a NodePort
// connection is dropped (NETFILTER_DROP), no ICMP error.
func TestServiceNoLocalEndpointDrop(t *testing.T) {
	f := flow("tcp", "203.0.113.2:40000", "192.168.0.2:3001", "", trace.KindDrop)
	f.Rule = externalServicesRule(svc2NodePort)
	f.Service = &trace.ServiceRef{Namespace: "ns2", Name: "svc2", Port: "p80"}
	check(t, f, trace.VerdictServiceNoEndpoint, "Service ns2/svc2 (port p80) has a Local traffic policy and node node-2 runs none of its ready endpoints",
		"dropped it silently: the client times out", "INPUT → KUBE-EXTERNAL-SERVICES", `"ns2/svc2:p80 has no local endpoints"`,
		"externalTrafficPolicy: Local", "healthCheckNodePort", "service-name=svc2")
	if r := Diagnose(f, newEnv()); strings.Contains(r.Explanation, "connection refused") || strings.Contains(r.Explanation, "internalTrafficPolicy") {
		t.Errorf("a DROP explained as a refusal or as the internal policy: %s", r.Explanation)
	}
}

// internalTrafficPolicy Local: the ClusterIP's rule is a DROP in
// KUBE-SERVICES.
func TestServiceNoLocalEndpointInternal(t *testing.T) {
	f := flow("tcp", "10.0.0.2:40000", "172.30.0.42:80", "", trace.KindDrop)
	f.Rule = kubeServicesRule(`-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j DROP`)
	f.Service = &trace.ServiceRef{Namespace: "ns2", Name: "svc2", Port: "p80"}
	check(t, f, trace.VerdictServiceNoEndpoint, "internalTrafficPolicy: Local", "DaemonSet")
}

// A Service port without a name: kube-proxy's comment is "NS/NAME has no
// endpoints".
func TestServiceNoEndpointUnnamedPort(t *testing.T) {
	f := flow("tcp", "10.0.0.2:40000", "172.30.0.46:80", "", trace.KindReject)
	f.Rule = kubeServicesRule(`-A KUBE-SERVICES -d 172.30.0.46/32 -p tcp -m comment --comment "ns6/svc6 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`)
	check(t, f, trace.VerdictServiceNoEndpoint, "Service ns6/svc6 has no ready endpoint", "service-name=svc6")
}

// The rule's comment names one Service, the metadata another: both are
// said, neither is chosen.
func TestServiceNoEndpointOtherServiceAddressed(t *testing.T) {
	f := flow("tcp", "10.0.0.2:40000", "172.30.0.46:80", "", trace.KindReject)
	f.Rule = kubeServicesRule(svc6Reject)
	f.Service = &trace.ServiceRef{Namespace: "ns-a", Name: "mysql-a", Port: "80"}
	check(t, f, trace.VerdictServiceNoEndpoint, "Service ns6/svc6 (port p80) has no ready endpoint",
		"the metadata says 172.30.0.46:80 is Service ns-a/mysql-a, not ns6/svc6", "disagree")
}

// Without metadata the comment is the only name, and the explanation says
// so.
func TestServiceNoEndpointWithoutMetadata(t *testing.T) {
	f := flow("tcp", "10.0.0.2:40000", "172.30.0.46:80", "", trace.KindReject)
	f.Rule = kubeServicesRule(svc6Reject)
	check(t, f, trace.VerdictServiceNoEndpoint, "Service ns6/svc6", "named by the rule's comment alone")
}

// Near misses: kube-proxy's other filter rules, a REJECT whose comment is
// not kube-proxy's no-endpoint one, and a no-endpoint comment on a rule
// that neither rejects nor drops.
func TestServiceNoEndpointNearMisses(t *testing.T) {
	cases := []struct {
		name, text, verdict, fact string
		kinds                     []string
	}{
		{"other REJECT in KUBE-SERVICES", `-A KUBE-SERVICES -d 172.30.0.46/32 -p tcp -m comment --comment "deny admin" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`,
			trace.VerdictRejected, "deny admin", []string{trace.KindReject}},
		{"uncommented REJECT", `-A KUBE-SERVICES -d 172.30.0.46/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`,
			trace.VerdictRejected, "KUBE-SERVICES", []string{trace.KindReject}},
		{"load balancer source ranges", `-A KUBE-PROXY-FIREWALL -m comment --comment "ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP`,
			trace.VerdictDropped, "KUBE-FW-NUKIZ6OKUXPJNT4C", []string{trace.KindDrop}},
		{"no-endpoint comment on a LOG rule", `-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j LOG`,
			trace.VerdictDropped, "NETFILTER_DROP", []string{trace.KindDrop}},
		{"comment saying something else about endpoints", `-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT`,
			trace.VerdictRejected, "has endpoints", []string{trace.KindReject}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := flow("tcp", "10.0.0.2:40000", "172.30.0.46:80", "", c.kinds...)
			f.Rule = kubeServicesRule(c.text)
			f.Service = &trace.ServiceRef{Namespace: "ns6", Name: "svc6", Port: "p80"}
			check(t, f, c.verdict, c.fact)
		})
	}
}

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden from the code")

// TestServiceNoEndpointText holds the whole explanation of each shape of
// no-endpoint flow, iptables and nftables, to testdata: the texts are
// built piece by piece for speed, and a piece lost or doubled shows here.
// go test -run TestServiceNoEndpointText -update rewrites the file.
func TestServiceNoEndpointText(t *testing.T) {
	nftRule := func(chain, elemMap, key, comment string) *trace.Rule {
		return &trace.Rule{Backend: trace.BackendNFTables, Family: "ip", Table: "kube-proxy", Chain: chain, EntryChain: "filter-forward",
			Path: []string{"filter-forward", "service-endpoints-check", chain}, Text: "reject", Handle: 7,
			Element: &trace.RuleElement{Map: elemMap, Key: key, Comment: comment}}
	}
	svc6 := &trace.ServiceRef{Namespace: "ns6", Name: "svc6", Port: "p80"}
	cases := []struct {
		name  string
		rule  *trace.Rule
		svc   *trace.ServiceRef
		kinds []string
	}{
		{"iptables reject", kubeServicesRule(svc6RejectSaved), svc6, []string{trace.KindReject, trace.KindDrop}},
		{"iptables reject seen as its drop", kubeServicesRule(svc6Reject), svc6, []string{trace.KindDrop}},
		{"iptables external Local drop", externalServicesRule(svc2NodePort), &trace.ServiceRef{Namespace: "ns2", Name: "svc2", Port: "p80"}, []string{trace.KindDrop}},
		{"iptables internal Local drop", kubeServicesRule(`-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j DROP`), nil, []string{trace.KindDrop}},
		{"iptables other Service addressed", kubeServicesRule(svc6Reject), &trace.ServiceRef{Namespace: "ns-a", Name: "mysql-a", Port: "80"}, []string{trace.KindReject}},
		{"iptables unnamed port", kubeServicesRule(`-A KUBE-SERVICES -d 172.30.0.46/32 -p tcp -m comment --comment "ns6/svc6 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`), nil, []string{trace.KindReject}},
		{"nftables reject", nftRule("reject-chain", "no-endpoint-services", "172.30.0.46 . tcp . 80", "ns6/svc6:p80"), svc6, []string{trace.KindReject, trace.KindDrop}},
		{"nftables NodePort Local drop", nftRule("nodeport-endpoints-check", "no-endpoint-nodeports", "tcp . 30007", "ns7/svc7:p80"), nil, []string{trace.KindDrop}},
	}
	var got strings.Builder
	for _, c := range cases {
		f := flow("tcp", "10.0.0.2:40000", "172.30.0.46:80", "", c.kinds...)
		f.Rule, f.Service = c.rule, c.svc
		r := Diagnose(f, newEnv())
		fmt.Fprintf(&got, "%s: %s: %s\n", c.name, r.Verdict, r.Explanation)
	}
	matchGolden(t, "testdata/noendpoint.golden", got.String())
}

// matchGolden compares got with the file at path, which -update rewrites
// from got.
func matchGolden(t *testing.T, path, got string) {
	t.Helper()
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("explanations differ from %s:\n got:\n%s\nwant:\n%s", path, got, want)
	}
}
