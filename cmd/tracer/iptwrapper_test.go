package main

import "testing"

func TestPickBackend(t *testing.T) {
	const (
		hint    = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
		canary  = "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
		twoRule = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A INPUT -j DROP\nCOMMIT\n"
		oneRule = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n"
	)
	for _, tc := range []struct{ legacy, nft, want string }{
		{"", "", "nft"},                     // nothing anywhere: the default of today's distributions
		{hint, twoRule + twoRule, "legacy"}, // the hint wins over rule counts
		{twoRule, hint, "nft"},
		{twoRule + canary, oneRule, "legacy"},
		{hint, canary, "nft"}, // both hinted: nf_tables, as kube-proxy's wrapper
		{twoRule, oneRule, "legacy"},
		{oneRule, oneRule, "nft"},
		{oneRule, twoRule, "nft"},
	} {
		if got := pickBackend([]byte(tc.legacy), []byte(tc.nft)); got != tc.want {
			t.Errorf("legacy %q nft %q: %s, want %s", tc.legacy, tc.nft, got, tc.want)
		}
	}
}
