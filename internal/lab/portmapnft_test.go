package lab

import (
	"os"
	"regexp"
	"testing"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// The lab's portmap writer, given what tests/cni TestPortmapFixtures gave
// the real plugins (container 4f2a9c1e0b7d at 10.88.0.2: tcp 8080->80,
// tcp 8083->83 on host IP 192.168.0.2, udp 5353->53; the dual-stack pod
// also at fd88::2, with tcp 8086->86 on host IP fd92::2), leaves in a
// fresh namespace exactly the ruleset the real v1.10.0 and v1.8.0 wrote
// there: internal/nft/testdata/portmap-VERSION[-dualstack].nft and .json,
// byte for byte.
func TestPortmapNFTWriter(t *testing.T) {
	requirePrivileged(t)
	ports := []containerPort{
		{Proto: "tcp", Port: 80, HostPort: 8080},
		{Proto: "tcp", Port: 83, HostPort: 8083, HostIP: "192.168.0.2"},
		{Proto: "udp", Port: 53, HostPort: 5353},
	}
	dual := append(ports, containerPort{Proto: "tcp", Port: 86, HostPort: 8086, HostIP: "fd92::2"})
	for _, c := range []struct {
		version, fixture string
		ports            []containerPort
		ip6              string
	}{
		{PortmapV1100, "portmap-" + PortmapV1100, ports, ""},
		{PortmapV180, "portmap-" + PortmapV180, ports, ""},
		{PortmapV1100, "portmap-" + PortmapV1100 + "-dualstack", dual, "fd88::2"},
		{PortmapV180, "portmap-" + PortmapV180 + "-dualstack", dual, "fd88::2"},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			l, err := netlab.New(Prefix + "-pmwriter")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ns, err := l.Namespace("node")
			if err != nil {
				t.Fatal(err)
			}
			n := &node{name: "node", ns: ns, portmapNFT: c.version}
			p := &pod{name: "pod", sandboxID: "4f2a9c1e0b7d", ip: "10.88.0.2", ip6: c.ip6, ports: c.ports}
			if err := portmapNFTFamily(n, p, "ip", p.ip); err != nil {
				t.Fatal(err)
			}
			if p.ip6 != "" {
				if err := portmapNFTFamily(n, p, "ip6", p.ip6); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range []struct{ ext, flag string }{{"nft", "-a"}, {"json", "-j"}} {
				got, err := ns.Run("nft", f.flag, "list", "ruleset")
				if err != nil {
					t.Fatal(err)
				}
				want, err := os.ReadFile("../nft/testdata/" + c.fixture + "." + f.ext)
				if err != nil {
					t.Fatal(err)
				}
				// Before 5.x table handles were one counter for the whole
				// kernel, not per namespace: the tables' own handles are
				// the one thing that may differ.
				if tableHandle(got) != tableHandle(string(want)) {
					t.Errorf("nft %s list ruleset differs from what portmap %s wrote:\ngot\n%s\nwant\n%s", f.flag, c.version, got, want)
				}
			}
		})
	}
}

var tableHandleRe = regexp.MustCompile(`(table ip6? cni_hostport \{ # handle )\d+|("table": \{"family": "ip6?", "name": "cni_hostport", "handle": )\d+`)

func tableHandle(listing string) string { return tableHandleRe.ReplaceAllString(listing, "${1}${2}N") }
