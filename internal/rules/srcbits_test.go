package rules

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestSrcInBitsDecide: every address that shares the leading bits srcIn
// recorded with the tested one is in the prefix, or out of it, as the
// tested one is. Addresses and prefixes are random, of both families,
// with the tested one often inside or just outside.
func TestSrcInBitsDecide(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 20000 {
		v6 := i%2 == 1
		pre := netip.PrefixFrom(randomAddr(rng, v6), rng.IntN(bitLen(v6)+1)).Masked()
		a := randomAddr(rng, v6)
		if rng.IntN(2) == 0 {
			// Near the prefix: its bits, then some of its own.
			a = withLeading(pre.Addr(), a, rng.IntN(bitLen(v6)+1))
		}
		var reads Reads
		p := Packet{Src: netip.AddrPortFrom(a, 1), Reads: &reads}
		in := p.srcIn(pre)
		if in != pre.Contains(a) {
			t.Fatalf("srcIn(%s) of %s: %v", pre, a, in)
		}
		if reads.SrcBits > pre.Bits() {
			t.Fatalf("%s against %s read %d bits, more than the prefix has", a, pre, reads.SrcBits)
		}
		for range 20 {
			b := withLeading(a, randomAddr(rng, v6), reads.SrcBits)
			if pre.Contains(b) != in {
				t.Fatalf("%s against %s read %d bits, but %s shares them and is in it: %v", a, pre, reads.SrcBits, b, !in)
			}
		}
	}
}

// TestSrcReadsWhole: an IPv4-mapped address against an IPv4 prefix, and
// an address read other than by a prefix, are read whole.
func TestSrcReadsWhole(t *testing.T) {
	var reads Reads
	p := Packet{Src: netip.MustParseAddrPort("[::ffff:10.1.2.3]:5"), Reads: &reads}
	if !p.srcIn(netip.MustParsePrefix("10.1.0.0/16")) || reads.SrcBits != 128 {
		t.Errorf("::ffff:10.1.2.3 in 10.1.0.0/16: read %d bits, want 128 and in", reads.SrcBits)
	}
	reads = Reads{}
	p = Packet{Src: netip.MustParseAddrPort("10.1.2.3:5"), Reads: &reads}
	if p.srcIn(netip.MustParsePrefix("fd00::/8")) || reads.SrcBits != 0 {
		t.Errorf("10.1.2.3 in fd00::/8: read %d bits, want none and out", reads.SrcBits)
	}
	if p.srcAddr(); reads.SrcBits != 32 {
		t.Errorf("srcAddr read %d bits, want 32", reads.SrcBits)
	}
}

func bitLen(v6 bool) int {
	if v6 {
		return 128
	}
	return 32
}

func randomAddr(rng *rand.Rand, v6 bool) netip.Addr {
	if v6 {
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return netip.AddrFrom16(b)
	}
	var b [4]byte
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return netip.AddrFrom4(b)
}

// withLeading is rest with its first n bits taken from lead.
func withLeading(lead, rest netip.Addr, n int) netip.Addr {
	l, r := lead.AsSlice(), rest.AsSlice()
	for i := range n {
		m := byte(0x80 >> (i % 8))
		r[i/8] = r[i/8]&^m | l[i/8]&m
	}
	a, _ := netip.AddrFromSlice(r)
	return a
}
