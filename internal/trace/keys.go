package trace

import (
	"net/netip"
	"strings"
)

// AddrKeys is a compact summary of every address a flow carries (its
// tuples, and each event's packet, conntrack tuples, NAT target and IPVS
// virtual server): the distinct IPv4 addresses and ports. The Store keeps
// one per flow in a dense array, so a port: or ip: filter over a million
// flows compares integers instead of parsing strings. When a flow has an
// address that does not fit (IPv6, a NAT range, too many), Complete is
// false and filters use the flow itself.
type AddrKeys struct {
	IPv4     [maxKeys]uint32
	Ports    [maxKeys]uint16
	NIPv4    uint8
	NPorts   uint8
	Complete bool
}

const maxKeys = 6

// KeysOf computes a flow's AddrKeys.
func KeysOf(f *Flow) AddrKeys {
	k := AddrKeys{Complete: true}
	k.addTuple(&f.Orig)
	k.addTuple(f.Reply)
	for i := range f.Events {
		e := &f.Events[i]
		k.addTuple(e.Packet)
		k.addTuple(e.Orig)
		k.addTuple(e.Reply)
		k.add(e.To)
		k.add(e.Virtual)
	}
	return k
}

func (k *AddrKeys) addTuple(t *Tuple) {
	if t != nil {
		k.add(t.Src)
		k.add(t.Dst)
	}
}

// add records one "IP:PORT" or bare "IP" (a SNAT target without port).
func (k *AddrKeys) add(s string) {
	if s == "" || !k.Complete {
		return
	}
	if strings.IndexByte(s, '-') >= 0 {
		k.Complete = false // a NAT range
		return
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Is4() {
		k.addIP(ap.Addr())
		k.addPort(ap.Port())
		return
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
		k.addIP(a)
		return
	}
	k.Complete = false
}

func (k *AddrKeys) addIP(a netip.Addr) {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	for _, x := range k.IPv4[:k.NIPv4] {
		if x == v {
			return
		}
	}
	if int(k.NIPv4) == maxKeys {
		k.Complete = false
		return
	}
	k.IPv4[k.NIPv4] = v
	k.NIPv4++
}

func (k *AddrKeys) addPort(p uint16) {
	for _, x := range k.Ports[:k.NPorts] {
		if x == p {
			return
		}
	}
	if int(k.NPorts) == maxKeys {
		k.Complete = false
		return
	}
	k.Ports[k.NPorts] = p
	k.NPorts++
}
