// Package eventtest makes the typed events the kernel side reports, for
// the tests of the stages that read them.
package eventtest

import (
	"net/netip"

	"github.com/tracer-dev/tracer/internal/event"
)

// Tuple is the tuple of proto from src to dst, both IP:PORT.
func Tuple(proto uint8, src, dst string) event.Tuple {
	s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
	return event.Tuple{Src: s.Addr(), Dst: d.Addr(), SrcPort: s.Port(), DstPort: d.Port(), Proto: proto}
}

// DNAT is the netfilter tier's DNAT of a TCP connection from src to dst,
// sent to to: its reply tuple is set, as that tier reads it after NAT.
func DNAT(src, dst, to string) event.Event {
	t := netip.MustParseAddrPort(to)
	return event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, NFHook: 0,
		Orig: Tuple(6, src, dst), Reply: Tuple(6, to, src),
		To: event.Range{MinAddr: t.Addr(), MaxAddr: t.Addr(), MinPort: t.Port(), MaxPort: t.Port()}}
}

// Reject is icmp_send's port unreachable for a TCP packet from src to dst,
// seen by via at nfHook.
func Reject(via event.Via, nfHook uint8, src, dst string) event.Event {
	return event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: via, NFHook: nfHook,
		Packet: Tuple(6, src, dst), ICMPType: 3, ICMPCode: 3}
}

// Drop is kfree_skb's drop, with a reason, of a TCP packet from src to dst.
func Drop(src, dst string) event.Event {
	return event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet: Tuple(6, src, dst), HasReason: true}
}
