// Package event holds the kernel's decisions as Go values: the decoder of
// the ring buffer records written by bpf/tracer.c (struct event) and the
// enums that name their kinds, hooks and attach methods.
package event

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"
)

// Kind is what the kernel decided.
type Kind uint8

const (
	KindDNAT       Kind = 1
	KindSNAT       Kind = 2
	KindIPVS       Kind = 3
	KindIPVSNoDest Kind = 4
	KindReject     Kind = 5 // an ICMP error was sent for a packet
	KindReset      Kind = 6
	KindDrop       Kind = 7
	// KindCTDestroy is not a decision: a conntrack entry's end (Orig,
	// Reply, CTStatus, CTMark, CTZone; TCP's state in Reason), what
	// ctnetlink's DESTROY event says, for the conntrack trackers. It
	// never joins a flow.
	KindCTDestroy Kind = 8
)

// kindNames are the trace format's names of the kinds (trace.Kind*;
// internal/trace's tests hold the two together).
var kindNames = [...]string{"", "dnat", "snat", "ipvs", "ipvs-no-dest", "reject", "reset", "drop", "ct-destroy"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Hook is a logical kernel hook: one decision point, whatever the attach
// method.
type Hook uint8

const (
	HookNFNat        Hook = 1
	HookIPVSConnNew  Hook = 2
	HookIPVSLeave    Hook = 3
	HookICMPSend     Hook = 4
	HookNFSendReset  Hook = 5
	HookTCPSendReset Hook = 6
	HookKfreeSkb     Hook = 7
	// IPv6 sends ICMP errors and resets from functions of its own.
	HookICMP6Send     Hook = 8
	HookNFSendReset6  Hook = 9
	HookTCPSendReset6 Hook = 10
	// HookCTDestroy reports conntrack entries' ends (KindCTDestroy).
	HookCTDestroy Hook = 11
)

// Hooks lists every hook in the order doctor shows them.
var Hooks = []Hook{HookNFNat, HookIPVSConnNew, HookIPVSLeave, HookICMPSend, HookICMP6Send,
	HookNFSendReset, HookNFSendReset6, HookTCPSendReset, HookTCPSendReset6, HookKfreeSkb, HookCTDestroy}

var hookNames = [...]string{"", "nf_nat_setup_info", "ip_vs_conn_new", "ip_vs_leave", "icmp_send", "nf_send_reset",
	"tcp_send_reset", "kfree_skb", "icmp6_send", "nf_send_reset6", "tcp_send_reset6", "nf_ct_delete"}

func (h Hook) String() string {
	if int(h) < len(hookNames) && h != 0 {
		return hookNames[h]
	}
	return fmt.Sprintf("hook(%d)", uint8(h))
}

// Via is how a hook's program is attached.
type Via uint8

const (
	ViaNone       Via = 0
	ViaFentry     Via = 1
	ViaKprobe     Via = 2
	ViaTracepoint Via = 3
	ViaNetfilter  Via = 4
)

var viaNames = [...]string{"none", "fentry", "kprobe", "tracepoint", "netfilter"}

func (v Via) String() string {
	if int(v) < len(viaNames) {
		return viaNames[v]
	}
	return fmt.Sprintf("via(%d)", uint8(v))
}

// Tuple is a five-tuple. For ICMP, SrcPort is the echo id and DstPort holds
// the type and code bytes, as conntrack keys ICMP.
type Tuple struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
}

// Valid reports whether the tuple was filled in.
func (t Tuple) Valid() bool { return t.Src.IsValid() }

// SrcAddrPort and DstAddrPort give the endpoints.
func (t Tuple) SrcAddrPort() netip.AddrPort { return netip.AddrPortFrom(t.Src, t.SrcPort) }
func (t Tuple) DstAddrPort() netip.AddrPort { return netip.AddrPortFrom(t.Dst, t.DstPort) }

// Reverse returns the tuple of a packet going the other way.
func (t Tuple) Reverse() Tuple {
	return Tuple{Src: t.Dst, Dst: t.Src, SrcPort: t.DstPort, DstPort: t.SrcPort, Proto: t.Proto}
}

// ProtoName names IP protocol numbers the way users write them.
func ProtoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	case 132:
		return "sctp"
	case 0:
		return ""
	}
	return fmt.Sprintf("proto-%d", p)
}

// Range is the translation a NAT decision chose: addresses and ports
// MinAddr..MaxAddr, MinPort..MaxPort (ports zero when unchanged).
type Range struct {
	MinAddr, MaxAddr netip.Addr
	MinPort, MaxPort uint16
	Flags            uint32
}

// Event is one decision, decoded.
type Event struct {
	Time      time.Time
	Kind      Kind
	Hook      Hook
	Via       Via
	Netns     uint32
	Packet    Tuple // the packet the decision was about
	Orig      Tuple // conntrack original tuple, or IPVS client -> virtual server
	Reply     Tuple // conntrack reply tuple
	To        Range // NAT range, or IPVS real server (MinAddr:MinPort)
	CTStatus  uint32
	CTMark    uint32
	CTZone    uint16
	CTInfo    uint8
	NFHook    uint8 // NF_INET_* or NFHookNone
	ICMPType  uint8
	ICMPCode  uint8
	Reason    uint32 // drop reason, RST reason, IPVS connection flags
	HasReason bool
	// NoCT: a dropped packet that carried no conntrack entry, so raw
	// table rules or conntrack itself (table full) dropped it.
	NoCT bool
}

// NFHookNone marks events not seen at a known netfilter hook.
const NFHookNone = 0xff

var nfHookNames = [...]string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}

// NFHookName names a netfilter hook as iptables does, or "".
func NFHookName(h uint8) string {
	if int(h) < len(nfHookNames) {
		return nfHookNames[h]
	}
	return ""
}

// IPVSForward names the IPVS forwarding method in connection flags.
func IPVSForward(flags uint32) string {
	switch flags & 7 {
	case 0:
		return "masq"
	case 1:
		return "local"
	case 2:
		return "tunnel"
	case 3:
		return "route"
	case 4:
		return "bypass"
	}
	return fmt.Sprintf("fwd-%d", flags&7)
}

// Conntrack status bits (include/uapi/linux/netfilter/nf_conntrack_common.h).
var ctStatusNames = []string{"EXPECTED", "SEEN_REPLY", "ASSURED", "CONFIRMED", "SRC_NAT", "DST_NAT",
	"SEQ_ADJUST", "SRC_NAT_DONE", "DST_NAT_DONE", "DYING", "FIXED_TIMEOUT", "TEMPLATE",
	"NAT_CLASH", "HELPER", "OFFLOAD", "HW_OFFLOAD"}

// CTStatusNames lists the names of the bits set in a conntrack status.
// The list is shared by every caller asking for the same bits: read it,
// never change it (its capacity is its length, so an append copies).
func CTStatusNames(status uint32) []string {
	status &= 1<<len(ctStatusNames) - 1
	var lists map[uint32][]string
	p := ctStatusLists.Load() // nil until the first list is made
	if p != nil {
		lists = *p
	}
	if l, ok := lists[status]; ok {
		return l
	}
	var out []string
	for i, n := range ctStatusNames {
		if status&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	out = slices.Clip(out)
	if len(lists) < maxCTStatusLists {
		// Copy on write: a node's NAT decisions carry a handful of statuses.
		next := make(map[uint32][]string, len(lists)+1)
		maps.Copy(next, lists)
		next[status] = out
		ctStatusLists.CompareAndSwap(p, &next)
	}
	return out
}

// ctStatusLists are the lists CTStatusNames made, by status.
var ctStatusLists atomic.Pointer[map[uint32][]string]

const maxCTStatusLists = 256
