package lab

import (
	"strings"
	"testing"
)

// The nat payload for a node whose ipsets all have entries (the realistic
// node of /work/shared/kube-proxy-ipvs.md: hairpin endpoints, LoadBalancer
// with externalTrafficPolicy=Local, TCP NodePorts, ClusterIPs) is the one
// that document replays from kube-proxy's source; with no Service yet, the
// rules of the empty ipsets are left out, as kube-proxy v1.37.2 leaves them
// out (TestStandInIPVSMatchesIPVSMode in tests/controlplane/kubeproxy holds
// it against the real one).
func TestNATRulesFollowIPSets(t *testing.T) {
	documented := `*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-LOAD-BALANCER -m comment --comment "Kubernetes service load balancer ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m mark ! --mark 0x004000/0x004000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x004000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x004000
COMMIT
`
	filled := map[string]bool{"KUBE-LOOP-BACK": true, "KUBE-CLUSTER-IP": true, "KUBE-LOAD-BALANCER": true,
		"KUBE-LOAD-BALANCER-LOCAL": true, "KUBE-NODE-PORT-TCP": true, "KUBE-NODE-PORT-LOCAL-TCP": true}
	if got := natRules(clusterCIDR, filled, nil); got != documented {
		t.Errorf("nat rules with every ipset filled:\n%s\nwant (kube-proxy-ipvs.md):\n%s", got, documented)
	}
	empty := natRules(clusterCIDR, nil, nil)
	for _, set := range []string{"KUBE-LOOP-BACK", "KUBE-LOAD-BALANCER", "KUBE-NODE-PORT-TCP", "KUBE-CLUSTER-IP"} {
		if strings.Contains(empty, "--match-set "+set+" ") {
			t.Errorf("no Service yet, but the nat rules match ipset %s:\n%s", set, empty)
		}
	}
	udp := natRules(clusterCIDR, map[string]bool{"KUBE-NODE-PORT-UDP": true}, nil)
	if !strings.Contains(udp, `-A KUBE-NODE-PORT -p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-UDP dst -j KUBE-MARK-MASQ`) {
		t.Errorf("a UDP NodePort is not marked for masquerade:\n%s", udp)
	}
	portal := `-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-X`
	withPortal := natRules(clusterCIDR, filled, []string{portal})
	if i, j := strings.Index(withPortal, portal), strings.Index(withPortal, "KUBE-CLUSTER-IP dst,dst -j ACCEPT"); i < 0 || i > j {
		t.Errorf("the substitute's jump is not just before KUBE-SERVICES' ACCEPTs:\n%s", withPortal)
	}
}
