package loader

import (
	"net/netip"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
)

// TestKernelFilters: the filters pushed into the programs keep exactly the
// events they name, for either family. Two real DNATs are made, one IPv4
// and one IPv6; each filter must let through the one it matches and not
// the other (without the filters both arrive: the "none" case).
func TestKernelFilters(t *testing.T) {
	requirePrivileged(t)
	tp := newTopology(t)
	serve(t, tp.s, sAddr+":8080")
	serve(t, tp.s, hostPort(sAddr6, 8080))
	run(t, tp.c, "iptables", "-t", "nat", "-A", "OUTPUT", "-d", vip, "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", sAddr+":8080")
	run(t, tp.c, "ip6tables", "-t", "nat", "-A", "OUTPUT", "-d", vip6, "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", hostPort(sAddr6, 8080))
	ino, err := tp.c.Inode()
	must(t, err)
	v4, v6 := hostPort(vip, 80), hostPort(vip6, 80)
	for _, c := range []struct {
		name string
		cfg  Config
		want []string // the original destinations of the dnat events that pass
	}{
		{"none", Config{}, []string{v4, v6}},
		{"ipv6 prefix of the target", Config{Prefixes: []netip.Prefix{netip.MustParsePrefix("fd77:2::/64")}}, []string{v6}},
		{"ipv6 address of the client", Config{Prefixes: []netip.Prefix{netip.MustParsePrefix(cAddr6 + "/128")}}, []string{v6}},
		{"ipv4 prefix", Config{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.96.77.0/24")}}, []string{v4}},
		{"port of the target", Config{Ports: []uint16{8080}}, []string{v4, v6}},
		{"other port", Config{Ports: []uint16{8081}}, nil},
		{"ipv6 prefix and other protocol", Config{Prefixes: []netip.Prefix{netip.MustParsePrefix("fd77:2::/64")}, Protos: []uint8{17}}, nil},
		{"netns of the client", Config{Netns: []uint32{ino}}, []string{v4, v6}},
		{"another netns", Config{Netns: []uint32{ino + 1}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.NetnsPaths = []string{tp.c.Path()}
			trc, err := Open(c.cfg)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer trc.Close()
			col := collect(trc)
			mustConnect(t, tp.c, v4)
			mustConnect(t, tp.c, v6)
			var got []string
			deadline := time.After(time.Second)
		read:
			for {
				select {
				case e := <-col.events:
					if e.Kind == event.KindDNAT && e.Netns == ino {
						got = append(got, e.Orig.DstAddrPort().String())
					}
				case <-deadline:
					break read
				}
			}
			if len(got) != len(c.want) {
				t.Fatalf("dnat events to %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("dnat events to %v, want %v", got, c.want)
				}
			}
		})
	}
}
