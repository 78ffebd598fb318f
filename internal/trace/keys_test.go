package trace

import (
	"fmt"
	"testing"
)

func TestKeysOfIPv6FlowIsComplete(t *testing.T) {
	f := &Flow{Proto: "tcp",
		Orig:   Tuple{Src: "[fd00::2]:40000", Dst: "[fd00:96::20]:3306"},
		Reply:  &Tuple{Src: "[fd00:244::5]:3306", Dst: "[fd00::2]:40000"},
		Events: []Event{{Kind: KindDNAT, To: "[fd00:244::5]:3306"}, {Kind: KindSNAT, To: "fd00::2"}}}
	k := KeysOf(f)
	if !k.Complete {
		t.Fatalf("an IPv6 flow's keys are not complete: %+v", k)
	}
	want := [][4]uint32{{0xfd000000, 0, 0, 2}, {0xfd000096, 0, 0, 0x20}, {0xfd000244, 0, 0, 5}}
	if !k.IPv6 || int(k.NAddrs) != len(want) || k.NPorts != 2 || k.Ports[0] != 40000 || k.Ports[1] != 3306 {
		t.Fatalf("keys %+v", k)
	}
	for i, w := range want {
		if got := [4]uint32(k.Addrs[4*i : 4*i+4]); got != w {
			t.Errorf("address %d: %x, want %x", i, got, w)
		}
	}
}

func TestKeysOfIncomplete(t *testing.T) {
	many := &Flow{Orig: Tuple{Src: "[fd00::1]:1", Dst: "[fd00::2]:1"}, Reply: &Tuple{Src: "[fd00::3]:1", Dst: "[fd00::4]:1"},
		Events: []Event{{Kind: KindSNAT, To: "fd00::5"}}}
	for name, f := range map[string]*Flow{
		"five IPv6 addresses": many,
		"both families":       {Orig: Tuple{Src: "10.0.0.1:1", Dst: "[fd00::2]:1"}},
		"IPv6 NAT range":      {Orig: Tuple{Src: "[fd00::1]:1", Dst: "[fd00::2]:1"}, Events: []Event{{Kind: KindDNAT, To: "[fd00::5-fd00::6]:80"}}},
		"zoned address":       {Orig: Tuple{Src: "[fe80::1%eth0]:1", Dst: "[fe80::2%eth0]:1"}},
	} {
		if k := KeysOf(f); k.Complete {
			t.Errorf("%s: keys complete: %+v", name, k)
		}
	}
	if k := KeysOf(&Flow{Orig: Tuple{Src: "[fd00::1]:1", Dst: "[fd00::2]:1"}, Reply: &Tuple{Src: "[fd00::3]:1", Dst: "[fd00::4]:1"}}); !k.Complete || k.NAddrs != 4 {
		t.Errorf("four IPv6 addresses: %+v", k)
	}
}

// A mapped address is kept as the IPv4 one, as the filter matches it.
func TestKeysOfIPv4(t *testing.T) {
	f := &Flow{Orig: Tuple{Src: "10.244.1.2:40000", Dst: "[::ffff:10.96.0.20]:3306"}}
	for i := range 8 {
		f.Events = append(f.Events, Event{Kind: KindSNAT, To: fmt.Sprintf("192.0.2.%d", i)})
	}
	k := KeysOf(f)
	if !k.Complete || k.IPv6 || k.NAddrs != 10 || k.Addrs[0] != 0x0af40102 || k.Addrs[1] != 0x0a600014 || k.Addrs[9] != 0xc0000207 {
		t.Errorf("keys %+v", k)
	}
}
