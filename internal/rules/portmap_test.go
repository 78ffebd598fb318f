package rules

import (
	"strings"
	"testing"
)

func TestPortmapChainName(t *testing.T) {
	// Vectors from containernetworking/plugins portmap_iptables_test.go,
	// and the chains the real plugin (1.1.1) wrote into testdata.
	const upstreamID = "icee6giejonei6sohng6ahngee7laquohquee9shiGo7fohferakah3Feiyoolu2pei7ciPhoh7shaoX6vai3vuf0ahfaeng8yohb9ceu0daez5hashee8ooYai5wa3y"
	cases := []struct{ net, id, want string }{
		{"testNetName", upstreamID, "CNI-DN-bfd599665540dd91d5d28"},
		{"test", upstreamID, "CNI-DN-67e92b96e692a494b6b85"},
		{"cbr0", mysqlID, mysqlChain},
		{"cbr0", nginxID, nginxChain},
	}
	for _, c := range cases {
		if got := PortmapChainName(c.net, c.id); got != c.want {
			t.Errorf("PortmapChainName(%q, %.12s...) = %s, want %s", c.net, c.id, got, c.want)
		}
	}
	// The chain of INCIDENTS.md has the same shape.
	if !IsPortmapChain("CNI-DN-733b5c318e3a34b1f1ddf") || IsPortmapChain("CNI-HOSTPORT-DNAT") || IsPortmapChain("CNI-DN-733b") {
		t.Error("IsPortmapChain")
	}
}

func TestParsePortmapComment(t *testing.T) {
	cases := []struct {
		in            string
		net, id       string
		truncated, ok bool
	}{
		{`dnat name: "cbr0" id: "` + mysqlID + `"`, "cbr0", mysqlID, false, true},
		{`dnat name: "k8s-pod-network" id: "abc"`, "k8s-pod-network", "abc", false, true},
		{`CNI portfwd masquerade mark`, "", "", false, false},
		{`dnat name: "cbr0"`, "", "", false, false},
		// Cut as the plugin's trimComment does: 253 bytes and "...".
		{(`dnat name: "` + strings.Repeat("n", 230) + `" id: "` + mysqlID + `"`)[:253] + "...", strings.Repeat("n", 230), mysqlID[:4], true, true},
	}
	for _, c := range cases {
		net, id, tr, ok := ParsePortmapComment(c.in)
		if net != c.net || id != c.id || tr != c.truncated || ok != c.ok {
			t.Errorf("ParsePortmapComment(%.40q) = %q %q %v %v", c.in, net, id, tr, ok)
		}
	}
}

func TestPortmapOwner(t *testing.T) {
	rs := loadSave(t, "appended.save")
	// The DNAT rule in the CNI-DN chain has no comment: the id comes from
	// the CNI-HOSTPORT-DNAT jump.
	dnat := rs.Chain("nat", mysqlChain).Rules[2]
	if dnat.Comment != "" {
		t.Fatalf("CNI-DN rule has a comment: %q", dnat.Comment)
	}
	o, ok := rs.PortmapOwnerOf(dnat)
	if !ok || o.ContainerID != mysqlID || o.Network != "cbr0" || !o.Verified || o.Chain != mysqlChain || o.Jump == nil {
		t.Fatalf("owner %+v %v", o, ok)
	}
	// The jump rule itself.
	o, ok = rs.PortmapOwnerOf(rs.PortmapJump(nginxChain))
	if !ok || o.ContainerID != nginxID || !o.Verified {
		t.Fatalf("jump owner %+v %v", o, ok)
	}
	// And back: from the container id to its chain.
	if c := rs.Chain("nat", PortmapChainName("cbr0", nginxID)); c == nil || c.Name != nginxChain {
		t.Errorf("chain of PortmapChainName: %v", c)
	}
	if _, ok := rs.PortmapOwnerOf(rs.Chain("nat", "KUBE-SERVICES").Rules[0]); ok {
		t.Error("a kube-proxy rule has no portmap owner")
	}
	// From an evaluation path.
	res := mustEval(t, rs, "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.96.0.20:3306"), testNode(t))
	if o, ok := rs.PortmapOwnerOfPath(&res.Outcome); !ok || o.ContainerID != mysqlID {
		t.Errorf("owner of path: %+v %v", o, ok)
	}
	// A comment that does not hash to the chain (hand-edited) is reported
	// unverified rather than trusted.
	bad := strings.Replace(readTestdata(t, "appended.save"), mysqlID, nginxID, 1)
	rs2 := mustParse(t, bad)
	o, ok = rs2.PortmapChainOwner(mysqlChain)
	if !ok || o.Verified {
		t.Errorf("mismatched comment: %+v %v", o, ok)
	}
}
