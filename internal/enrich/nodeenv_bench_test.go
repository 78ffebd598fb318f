package enrich

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/enrich/node"
	"github.com/tracer-dev/tracer/internal/trace"
)

// busyNode is a node of kube-proxy's iptables mode with n Services of two
// endpoints each, with IPVS mode's service ipsets beside them: about 12
// rules and 2 set members a Service.
func busyNode(n int) *trace.Snapshot {
	var nat, sets strings.Builder
	nat.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n")
	nat.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	sets.WriteString("create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n")
	for i := range n {
		vip := fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250)
		svc, sep1, sep2 := fmt.Sprintf("KUBE-SVC-%012d", i), fmt.Sprintf("KUBE-SEP-%012da", i), fmt.Sprintf("KUBE-SEP-%012db", i)
		fmt.Fprintf(&nat, ":%s - [0:0]\n:%s - [0:0]\n:%s - [0:0]\n", svc, sep1, sep2)
		fmt.Fprintf(&nat, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"ns/svc-%d:http cluster IP\" -m tcp --dport 80 -j %s\n", vip, i, svc)
		fmt.Fprintf(&nat, "-A %s -m comment --comment \"ns/svc-%d:http -> 10.244.%d.%d:8080\" -m statistic --mode random --probability 0.5 -j %s\n", svc, i, i/250, 1+i%250, sep1)
		fmt.Fprintf(&nat, "-A %s -m comment --comment \"ns/svc-%d:http -> 10.245.%d.%d:8080\" -j %s\n", svc, i, i/250, 1+i%250, sep2)
		for j, sep := range []string{sep1, sep2} {
			ep := fmt.Sprintf("10.%d.%d.%d", 244+j, i/250, 1+i%250)
			fmt.Fprintf(&nat, "-A %s -s %s/32 -m comment --comment \"ns/svc-%d:http\" -j MARK --set-xmark 0x4000/0x4000\n", sep, ep, i)
			fmt.Fprintf(&nat, "-A %s -p tcp -m comment --comment \"ns/svc-%d:http\" -m tcp -j DNAT --to-destination %s:8080\n", sep, i, ep)
		}
		fmt.Fprintf(&sets, "add KUBE-CLUSTER-IP %s,tcp:80\nadd KUBE-CLUSTER-IP %s,udp:53\n", vip, vip)
	}
	nat.WriteString("COMMIT\n")
	return &trace.Snapshot{
		Addresses:   []trace.Address{{Interface: "eth0", Address: "172.18.0.2/16", Up: true}},
		LocalRoutes: []string{"127.0.0.0/8", "172.18.0.2/32"},
		Rules:       map[string]string{"nat": nat.String()},
		Ipsets:      sets.String(),
	}
}

// BenchmarkNodeEnv builds the environment of a busy node's state, as the
// live pipeline does at each change of the node: from the state as read,
// and (reprinted) by printing the state as a trace snapshot and parsing
// that again, as it did before.
func BenchmarkNodeEnv(b *testing.B) {
	for _, services := range []int{1000, 10000} {
		st, err := node.FromSnapshot(busyNode(services))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("services=%d/from-state", services), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				NewStateEnv("node-1", st, nil)
			}
		})
		b.Run(fmt.Sprintf("services=%d/reprinted", services), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewNodeEnv("node-1", st.Snapshot(), nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
