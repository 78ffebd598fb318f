package rules

import (
	"net/netip"
	"strings"
	"testing"
)

func lk(dir Dir, addr string, proto uint8, port uint16) SetLookup {
	return SetLookup{Dir: dir, Addr: netip.MustParseAddr(addr), Proto: proto, Port: port, PortKnown: true}
}

func TestIPSetSaveKubeProxy(t *testing.T) {
	n := testNode(t)
	if len(n.Sets) != 17 {
		t.Fatalf("%d sets, want kube-proxy's 17", len(n.Sets))
	}
	cases := []struct {
		set  string
		ls   []SetLookup
		want bool
	}{
		{"KUBE-CLUSTER-IP", []SetLookup{lk(DirDst, "10.96.0.20", ProtoTCP, 80), lk(DirDst, "10.96.0.20", ProtoTCP, 80)}, true},
		// The protocol is part of the member: udp:80 is not tcp:80.
		{"KUBE-CLUSTER-IP", []SetLookup{lk(DirDst, "10.96.0.20", ProtoUDP, 80), lk(DirDst, "10.96.0.20", ProtoUDP, 80)}, false},
		{"KUBE-CLUSTER-IP", []SetLookup{lk(DirDst, "10.96.0.20", ProtoTCP, 3306), lk(DirDst, "10.96.0.20", ProtoTCP, 3306)}, false},
		// ICMP echo (8/0) is port 0x0800 with proto icmp: not a member.
		{"KUBE-CLUSTER-IP", []SetLookup{lk(DirDst, "10.96.0.20", ProtoICMP, 0x800), lk(DirDst, "10.96.0.20", ProtoICMP, 0x800)}, false},
		// One flag for a two-dimensional set never matches.
		{"KUBE-CLUSTER-IP", []SetLookup{lk(DirDst, "10.96.0.20", ProtoTCP, 80)}, false},
		{"KUBE-IPVS-IPS", []SetLookup{lk(DirDst, "10.96.0.20", ProtoICMP, 0x800)}, true},
		{"KUBE-IPVS-IPS", []SetLookup{lk(DirDst, "172.18.0.2", ProtoICMP, 0x800)}, false},
		// Extra flags are ignored.
		{"KUBE-IPVS-IPS", []SetLookup{lk(DirDst, "10.96.0.10", ProtoTCP, 1), lk(DirDst, "10.96.0.10", ProtoTCP, 1)}, true},
		{"KUBE-NODE-PORT-TCP", []SetLookup{lk(DirDst, "172.18.0.2", ProtoTCP, 30080)}, true},
		{"KUBE-NODE-PORT-TCP", []SetLookup{lk(DirDst, "172.18.0.2", ProtoTCP, 30082)}, false},
		{"KUBE-NODE-PORT-TCP", []SetLookup{lk(DirDst, "172.18.0.2", ProtoICMP, 0x800)}, false},
		{"KUBE-LOOP-BACK", []SetLookup{lk(DirDst, "10.244.1.5", ProtoTCP, 8080), lk(DirDst, "10.244.1.5", ProtoTCP, 8080), lk(DirSrc, "10.244.1.5", ProtoTCP, 4000)}, true},
		{"KUBE-LOOP-BACK", []SetLookup{lk(DirDst, "10.244.1.5", ProtoTCP, 8080), lk(DirDst, "10.244.1.5", ProtoTCP, 8080), lk(DirSrc, "10.244.1.7", ProtoTCP, 4000)}, false},
		// An IPv6 packet never matches an inet set.
		{"KUBE-IPVS-IPS", []SetLookup{lk(DirDst, "fd00::1", ProtoTCP, 80)}, false},
	}
	for _, c := range cases {
		got, err := n.SetMember(c.set, c.ls)
		if err != nil || got != c.want {
			t.Errorf("%s %+v: %v %v, want %v", c.set, c.ls, got, err, c.want)
		}
	}
	if _, err := n.SetMember("NOPE", nil); err == nil {
		t.Error("unknown set: want an error")
	}
	// An ICMP packet whose type is unknown cannot be looked up by port.
	if _, err := n.SetMember("KUBE-CLUSTER-IP", []SetLookup{{Addr: netip.MustParseAddr("10.96.0.20"), Proto: ProtoICMP}, {Proto: ProtoICMP}}); err == nil {
		t.Error("unknown ICMP type: want an error")
	}
}

func TestIPSetNetTypes(t *testing.T) {
	sets, err := ParseIPSetSave(strings.NewReader(`create N hash:net family inet hashsize 1024 maxelem 65536
add N 10.0.0.0/8
add N 10.1.0.0/16 nomatch
add N 10.1.2.0/24
create PN hash:ip,port,net family inet hashsize 1024 maxelem 65536
add PN 192.168.1.200,tcp:80,203.0.113.0/24
create P6 hash:ip,port family inet6 hashsize 1024 maxelem 65536
add P6 fd00::10,udp:53
create M hash:ip family inet hashsize 1024 maxelem 65536 netmask 24
add M 10.5.5.0
create L list:set size 8
add L N
create I hash:ip,port family inet hashsize 1024 maxelem 65536
add I 10.0.0.1,icmp:echo-request
add I 10.0.0.1,udp:53 timeout 300
`))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sets["L"]; ok {
		t.Error("list:set is not supported and must be left out")
	}
	test := func(set string, want bool, ls ...SetLookup) {
		t.Helper()
		got, err := sets[set].Test(ls)
		if err != nil || got != want {
			t.Errorf("%s %+v: %v %v, want %v", set, ls, got, err, want)
		}
	}
	test("N", true, lk(DirSrc, "10.9.9.9", 0, 0))
	test("N", false, lk(DirSrc, "10.1.9.9", 0, 0)) // the /16 nomatch is more specific
	test("N", true, lk(DirSrc, "10.1.2.3", 0, 0))  // the /24 is more specific still
	test("N", false, lk(DirSrc, "11.0.0.1", 0, 0))
	test("PN", true, lk(DirDst, "192.168.1.200", ProtoTCP, 80), lk(DirDst, "192.168.1.200", ProtoTCP, 80), lk(DirSrc, "203.0.113.9", ProtoTCP, 5))
	test("PN", false, lk(DirDst, "192.168.1.200", ProtoTCP, 80), lk(DirDst, "192.168.1.200", ProtoTCP, 80), lk(DirSrc, "198.51.100.9", ProtoTCP, 5))
	test("P6", true, lk(DirDst, "fd00::10", ProtoUDP, 53), lk(DirDst, "fd00::10", ProtoUDP, 53))
	test("M", true, lk(DirDst, "10.5.5.77", 0, 0))
	test("I", true, lk(DirDst, "10.0.0.1", ProtoICMP, 0x800), lk(DirDst, "10.0.0.1", ProtoICMP, 0x800))
	test("I", true, lk(DirDst, "10.0.0.1", ProtoUDP, 53), lk(DirDst, "10.0.0.1", ProtoUDP, 53))
}

func TestIPSetSaveErrors(t *testing.T) {
	for name, text := range map[string]string{
		"add before create": "add X 10.0.0.1\n",
		"wrong dimensions":  "create X hash:ip,port family inet\nadd X 10.0.0.1\n",
		"bad port":          "create X bitmap:port range 0-65535\nadd X http-ish\n",
		"wrong family":      "create X hash:ip family inet6\nadd X 10.0.0.1\n",
		"garbage":           "flush X\n",
	} {
		if _, err := ParseIPSetSave(strings.NewReader(text)); err == nil {
			t.Errorf("%s: want an error", name)
		} else if !strings.HasPrefix(err.Error(), "parse ipset save") {
			t.Errorf("%s: %q does not name the operation", name, err)
		}
	}
}

func TestMemNodeLocal(t *testing.T) {
	n := NewMemNode()
	if err := n.AddLocal("172.18.0.2", "10.96.0.0/12"); err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]bool{"127.0.0.53": true, "172.18.0.2": true, "10.100.1.1": true, "172.18.0.3": false, "::1": true, "::ffff:172.18.0.2": true} {
		if got, err := n.IsLocal(netip.MustParseAddr(a)); err != nil || got != want {
			t.Errorf("IsLocal(%s) = %v %v, want %v", a, got, err, want)
		}
	}
	n.LocalUnknown = true
	if _, err := n.IsLocal(netip.MustParseAddr("172.18.0.3")); err == nil {
		t.Error("LocalUnknown: want an error for an address not known local")
	}
	if err := n.AddLocal("nope"); err == nil {
		t.Error("bad address: want an error")
	}
	// An unknown local table makes addrtype uncertain in a walk.
	n.Sets = testNode(t).Sets
	rs := loadSave(t, "appended.save")
	res := mustEval(t, rs, "nat", "PREROUTING", tcp("10.244.2.9:40000", "10.200.0.1:3306"), n)
	if !res.Uncertain || !strings.Contains(strings.Join(res.Reasons, " "), "local routing table unknown") {
		t.Errorf("uncertain %v reasons %v", res.Uncertain, res.Reasons)
	}
}

// FuzzParseIPSetSave: whatever `ipset save` printed, parsing gives sets or
// an error, never a panic, and every set it gives can be asked.
func FuzzParseIPSetSave(f *testing.F) {
	f.Add("create N hash:net family inet hashsize 1024 maxelem 65536\nadd N 10.0.0.0/8\nadd N 10.1.0.0/16 nomatch\n")
	f.Add("create PN hash:ip,port,net family inet hashsize 1024 maxelem 65536\nadd PN 192.168.1.200,tcp:80,203.0.113.0/24\n")
	f.Add("create P6 hash:ip,port family inet6 hashsize 1024 maxelem 65536\nadd P6 fd00::10,udp:53\n")
	f.Add("create L list:set size 8\nadd L N\ncreate I hash:ip,port family inet\nadd I 10.0.0.1,icmp:echo-request\n")
	f.Fuzz(func(t *testing.T, text string) {
		sets, err := ParseIPSetSave(strings.NewReader(text))
		if err != nil {
			return
		}
		probe := []SetLookup{{Addr: netip.MustParseAddr("10.0.0.1"), Proto: 6, Port: 80, PortKnown: true},
			{Addr: netip.MustParseAddr("fd00::10"), Proto: 17, Port: 53, PortKnown: true},
			{Addr: netip.MustParseAddr("203.0.113.7"), Proto: 6, Port: 80, PortKnown: true}}
		for name, s := range sets {
			if s == nil {
				t.Fatalf("set %q is nil", name)
			}
			for i := 1; i <= len(probe); i++ {
				s.Test(probe[:i]) // an error is an answer; a panic is not
			}
		}
	})
}

// A bitmap:port set has no family: kube-proxy's KUBE-6-NODE-PORT-TCP,
// created without one, matches an IPv6 packet's port as the kernel does
// (NFPROTO_UNSPEC), while a hash:ip,port set of family inet never matches
// an IPv6 address.
func TestIPSetPortsHaveNoFamily(t *testing.T) {
	sets, err := ParseIPSetSave(strings.NewReader("create KUBE-6-NODE-PORT-TCP bitmap:port range 0-65535\nadd KUBE-6-NODE-PORT-TCP 30092\n" +
		"create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\nadd KUBE-CLUSTER-IP 10.96.0.1,tcp:80\n"))
	if err != nil {
		t.Fatal(err)
	}
	v6 := netip.MustParseAddr("fd18::2")
	if ok, err := sets["KUBE-6-NODE-PORT-TCP"].Test([]SetLookup{{Addr: v6, Proto: ProtoTCP, Port: 30092, PortKnown: true}}); !ok || err != nil {
		t.Errorf("an IPv6 packet to port 30092: %v, %v; want a member", ok, err)
	}
	if ok, err := sets["KUBE-CLUSTER-IP"].Test([]SetLookup{{Addr: v6, Proto: ProtoTCP, Port: 80, PortKnown: true}, {Addr: v6, Proto: ProtoTCP, Port: 80, PortKnown: true}}); ok || err != nil {
		t.Errorf("an IPv6 address in an inet set: %v, %v; want no member", ok, err)
	}
}
