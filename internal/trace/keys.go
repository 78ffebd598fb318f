package trace

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
)

// AddrKeys is a compact summary of every address a flow carries (its
// tuples, and each event's packet, conntrack tuples, NAT target and IPVS
// virtual server): the distinct addresses and ports. The Store keeps one
// per flow in a dense array, so a port: or ip: filter over a million
// flows compares integers instead of parsing strings. When a flow has an
// address that does not fit (a NAT range, a zoned address, both families,
// too many), Complete is false and filters use the flow itself.
type AddrKeys struct {
	// Addrs holds the addresses as 32-bit words, most significant first:
	// one word for an IPv4 address, four for an IPv6 one (IPv6 says
	// which). The families share the words because a flow's addresses are
	// all of one family, and the Store holds a key for every flow.
	Addrs [addrWords]uint32
	Ports [maxKeys]uint16
	// NAddrs counts addresses, not words.
	NAddrs   uint8
	NPorts   uint8
	IPv6     bool
	Complete bool
}

const (
	maxKeys = 6
	// addrWords holds 16 IPv4 addresses or 4 IPv6 ones: a DNAT'd and
	// masqueraded connection has four (client, Service, backend, node).
	addrWords = 16
)

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

// add records one "IP:PORT", "[IPv6]:PORT" or bare "IP" (a SNAT target
// without port).
func (k *AddrKeys) add(s string) {
	// A shape's placeholders are its flows' client, added per flow.
	if s == "" || s == slotClient || s == slotSeen || !k.Complete {
		return
	}
	if strings.IndexByte(s, '-') >= 0 {
		k.Complete = false // a NAT range
		return
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		k.addIP(ap.Addr())
		k.addPort(ap.Port())
		return
	}
	if a, err := netip.ParseAddr(s); err == nil {
		k.addIP(a)
		return
	}
	k.Complete = false
}

// addEndpoint records a stored flow's client endpoint.
func (k *AddrKeys) addEndpoint(e *endpoint) {
	if !k.Complete {
		return
	}
	k.addIP(e.addr())
	if e.form == formIPv4 || e.form == formIPv6 {
		k.addPort(e.port)
	}
}

func (k *AddrKeys) addIP(a netip.Addr) {
	// The filter matches a mapped address as the IPv4 one, and no prefix
	// holds a zoned address.
	a = a.Unmap()
	if a.Zone() != "" || (k.NAddrs > 0 && a.Is6() != k.IPv6) {
		k.Complete = false
		return
	}
	k.IPv6 = a.Is6()
	var w [4]uint32
	n := 1
	if a.Is4() {
		b := a.As4()
		w[0] = binary.BigEndian.Uint32(b[:])
	} else {
		b := a.As16()
		for i := range w {
			w[i] = binary.BigEndian.Uint32(b[4*i:])
		}
		n = 4
	}
	held := k.Addrs[:int(k.NAddrs)*n]
	for i := 0; i < len(held); i += n {
		if slices.Equal(held[i:i+n], w[:n]) {
			return
		}
	}
	if len(held)+n > addrWords {
		k.Complete = false
		return
	}
	copy(k.Addrs[len(held):], w[:n])
	k.NAddrs++
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
