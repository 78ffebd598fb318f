package loader

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/tracer-dev/tracer/internal/event"
)

// rung is one way to attach one hook: a program of the object and how to
// attach it. Rungs of a ladder are tried in order; the first that loads and
// attaches wins.
type rung struct {
	via    event.Via
	prog   string // program name in bpf/tracer.c
	target string // kernel function or tracepoint, for messages
	// attach is nil for the netfilter tier, which the loader attaches once
	// for every hook that falls through to it (see nfRole).
	attach func(p *ebpf.Program, target string) (link.Link, error)
	nfRole uint32
	// families, when set, is what the program reports (cfg_families):
	// a tracepoint both families pass through serves each family's hook
	// with an instance of its own, and an IPv6 function's instance files
	// a packet it could not read under the IPv6 hook.
	families uint32
	// needs says what this rung needs that the next one does not, for
	// the explanation when it fails for lack of it.
	needs string
}

// Netfilter roles, as in enum nf_role of bpf/tracer.h.
const (
	nfRoleNAT    = 1
	nfRoleReset  = 2
	nfRoleICMP   = 4
	nfRoleReset6 = 8
	nfRoleICMP6  = 16
)

// Address families a program reports, as in enum family_bit.
const (
	familyV4 = 1
	familyV6 = 2
)

func fentry(p *ebpf.Program, _ string) (link.Link, error) {
	return link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachTraceFEntry})
}

// fexit attaches p after its function returns, through fentry's
// trampoline: the fentry tier, where a program needs what the call did.
func fexit(p *ebpf.Program, _ string) (link.Link, error) {
	return link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachTraceFExit})
}

func kprobe(p *ebpf.Program, fn string) (link.Link, error) {
	return link.Kprobe(fn, p, nil)
}

func rawTracepoint(p *ebpf.Program, name string) (link.Link, error) {
	return link.AttachRawTracepoint(link.RawTracepointOptions{Name: name, Program: p})
}

// ladders gives each hook its attach methods, best first: fentry (cheapest,
// typed), kprobe, tracepoint, then the BPF netfilter hook, which sees
// conntrack as NAT left it on kernels with neither fentry nor kprobes.
var ladders = map[event.Hook][]rung{
	event.HookNFNat: {
		// After the call: the decision's event then carries the reply
		// tuple NAT made.
		{via: event.ViaFentry, prog: "tr_nat_fexit", target: "nf_nat_setup_info", attach: fexit},
		{via: event.ViaKprobe, prog: "tr_nat_kprobe", target: "nf_nat_setup_info", attach: kprobe},
		{via: event.ViaNetfilter, target: "conntrack after nat hooks", nfRole: nfRoleNAT},
	},
	event.HookIPVSConnNew: {
		{via: event.ViaFentry, prog: "tr_ipvs_fentry", target: "ip_vs_conn_new", attach: fentry},
		{via: event.ViaKprobe, prog: "tr_ipvs_kprobe", target: "ip_vs_conn_new", attach: kprobe, needs: "the ip_vs module's BTF (kernel 5.11+)"},
		// Kernels without module BTF (5.10): fixed layout, namespace unknown.
		{via: event.ViaKprobe, prog: "tr_ipvs_kraw", target: "ip_vs_conn_new", attach: kprobe},
	},
	event.HookIPVSLeave: {
		{via: event.ViaFentry, prog: "tr_ipvsl_fentry", target: "ip_vs_leave", attach: fentry},
		{via: event.ViaKprobe, prog: "tr_ipvsl_kprobe", target: "ip_vs_leave", attach: kprobe, needs: "the ip_vs module's BTF (kernel 5.11+)"},
		{via: event.ViaKprobe, prog: "tr_ipvsl_kraw", target: "ip_vs_leave", attach: kprobe},
	},
	event.HookICMPSend: {
		{via: event.ViaFentry, prog: "tr_icmp_fentry", target: "__icmp_send", attach: fentry},
		{via: event.ViaKprobe, prog: "tr_icmp_kprobe", target: "__icmp_send", attach: kprobe},
		{via: event.ViaTracepoint, prog: "tr_icmp_tp", target: "icmp_send", attach: rawTracepoint},
		{via: event.ViaNetfilter, target: "related ICMP at OUTPUT", nfRole: nfRoleICMP},
	},
	// The IPv4 programs, attached to the IPv6 functions: the arguments
	// they read are the same, and the packet's family picks the hook.
	event.HookICMP6Send: {
		{via: event.ViaFentry, prog: "tr_icmp_fentry", target: "icmp6_send", attach: fentry, families: familyV6},
		{via: event.ViaKprobe, prog: "tr_icmp_kprobe", target: "icmp6_send", attach: kprobe, families: familyV6},
		{via: event.ViaNetfilter, target: "related ICMPv6 at OUTPUT", nfRole: nfRoleICMP6},
	},
	event.HookNFSendReset: {
		{via: event.ViaFentry, prog: "tr_nfrst_fentry", target: "nf_send_reset", attach: fentry},
		{via: event.ViaKprobe, prog: "tr_nfrst_kprobe", target: "nf_send_reset", attach: kprobe},
		{via: event.ViaNetfilter, target: "related RST at OUTPUT", nfRole: nfRoleReset},
	},
	event.HookNFSendReset6: {
		{via: event.ViaFentry, prog: "tr_nfrst_fentry", target: "nf_send_reset6", attach: fentry, families: familyV6},
		{via: event.ViaKprobe, prog: "tr_nfrst_kprobe", target: "nf_send_reset6", attach: kprobe, families: familyV6},
		{via: event.ViaNetfilter, target: "related IPv6 RST at OUTPUT", nfRole: nfRoleReset6},
	},
	// From 6.10 the tcp_send_reset tracepoint fires for every reset, a
	// socket's own (tcp_send_active_reset: an abort, SO_LINGER 0) as
	// well as an answer to a packet, with the reason: it comes first.
	// Before, it skips resets without a full socket (a closed port), and
	// tcp_v4_send_reset, which the function rungs see, skips a socket's
	// own.
	event.HookTCPSendReset: {
		{via: event.ViaTracepoint, prog: "tr_rst_tp3", target: "tcp_send_reset", attach: rawTracepoint, families: familyV4, needs: "the RST reason argument (kernel 6.10+)"},
		{via: event.ViaFentry, prog: "tr_rst_fentry3", target: "tcp_v4_send_reset", attach: fentry, needs: "the RST reason argument (kernel 6.10+)"},
		{via: event.ViaFentry, prog: "tr_rst_fentry", target: "tcp_v4_send_reset", attach: fentry},
		{via: event.ViaKprobe, prog: "tr_rst_kprobe", target: "tcp_v4_send_reset", attach: kprobe},
		{via: event.ViaTracepoint, prog: "tr_rst_tp", target: "tcp_send_reset", attach: rawTracepoint, families: familyV4},
	},
	event.HookTCPSendReset6: {
		{via: event.ViaTracepoint, prog: "tr_rst_tp3", target: "tcp_send_reset", attach: rawTracepoint, families: familyV6, needs: "the RST reason argument (kernel 6.10+)"},
		{via: event.ViaFentry, prog: "tr_rst_fentry3", target: "tcp_v6_send_reset", attach: fentry, needs: "the RST reason argument (kernel 6.10+)"},
		{via: event.ViaFentry, prog: "tr_rst_fentry", target: "tcp_v6_send_reset", attach: fentry},
		{via: event.ViaKprobe, prog: "tr_rst_kprobe", target: "tcp_v6_send_reset", attach: kprobe},
		{via: event.ViaTracepoint, prog: "tr_rst_tp", target: "tcp_send_reset", attach: rawTracepoint, families: familyV6},
	},
	// Conntrack entries' ends, for the conntrack trackers that asked
	// (Config.ConntrackNetns). There is no tracepoint or netfilter rung:
	// without fentry or kprobes the trackers subscribe to ctnetlink's
	// DESTROY events instead.
	event.HookCTDestroy: {
		// Before 5.19: nf_ct_delete is inlined into conntrack's own
		// callers (5.10), and the free is a function of its own.
		{via: event.ViaKprobe, prog: "tr_ctfree_kprobe", target: "destroy_conntrack", attach: kprobe},
		{via: event.ViaFentry, prog: "tr_ctdel_fentry", target: "nf_ct_delete", attach: fentry},
		{via: event.ViaKprobe, prog: "tr_ctdel_kprobe", target: "nf_ct_delete", attach: kprobe},
	},
	event.HookKfreeSkb: {
		{via: event.ViaTracepoint, prog: "tr_drop_tp3", target: "kfree_skb", attach: rawTracepoint, needs: "the drop reason argument (kernel 5.17+)"},
		{via: event.ViaTracepoint, prog: "tr_drop_tp", target: "kfree_skb", attach: rawTracepoint},
	},
}
