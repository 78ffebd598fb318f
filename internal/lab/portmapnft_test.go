package lab

import (
	"os"
	"regexp"
	"testing"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// The lab's portmap writer, given what tests/cni TestPortmapFixtures gave
// the real plugins (container 4f2a9c1e0b7d at 10.88.0.2: tcp 8080->80,
// tcp 8083->83 on host IP 192.168.0.2, udp 5353->53), leaves in a fresh
// namespace exactly the ruleset the real v1.10.0 and v1.8.0 wrote there:
// internal/nft/testdata/portmap-VERSION.nft and .json, byte for byte.
func TestPortmapNFTWriter(t *testing.T) {
	requirePrivileged(t)
	ports := []containerPort{
		{Proto: "tcp", Port: 80, HostPort: 8080},
		{Proto: "tcp", Port: 83, HostPort: 8083, HostIP: "192.168.0.2"},
		{Proto: "udp", Port: 53, HostPort: 5353},
	}
	for _, v := range []string{PortmapV1100, PortmapV180} {
		t.Run(v, func(t *testing.T) {
			l, err := netlab.New(Prefix + "-pmwriter")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ns, err := l.Namespace("node")
			if err != nil {
				t.Fatal(err)
			}
			n := &node{name: "node", ns: ns, portmapNFT: v}
			tx, err := portmapNFTTx(v, "4f2a9c1e0b7d", "10.88.0.2", ports)
			if err != nil {
				t.Fatal(err)
			}
			if err := knftablesCheck(n, "ip cni_hostport"); err != nil {
				t.Fatal(err)
			}
			if err := runStdin(ns, tx, "nft", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			for _, f := range []struct{ ext, flag string }{{"nft", "-a"}, {"json", "-j"}} {
				got, err := ns.Run("nft", f.flag, "list", "ruleset")
				if err != nil {
					t.Fatal(err)
				}
				want, err := os.ReadFile("../nft/testdata/portmap-" + v + "." + f.ext)
				if err != nil {
					t.Fatal(err)
				}
				// Before 5.x table handles were one counter for the whole
				// kernel, not per namespace: the table's own handle is the
				// one thing that may differ.
				if tableHandle(got) != tableHandle(string(want)) {
					t.Errorf("nft %s list ruleset differs from what portmap %s wrote:\ngot\n%s\nwant\n%s", f.flag, v, got, want)
				}
			}
		})
	}
}

var tableHandleRe = regexp.MustCompile(`(table ip cni_hostport \{ # handle )\d+|("table": \{"family": "ip", "name": "cni_hostport", "handle": )\d+`)

func tableHandle(listing string) string { return tableHandleRe.ReplaceAllString(listing, "${1}${2}N") }
