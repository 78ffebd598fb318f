/* The record every program writes to the ring buffer. The Go decoder in
 * internal/event mirrors this layout; its test checks the offsets against
 * the BTF of the compiled object, so change both together. */
#pragma once

enum event_kind {
	KIND_DNAT = 1,
	KIND_SNAT = 2,
	KIND_IPVS = 3,
	KIND_IPVS_NO_DEST = 4,
	KIND_REJECT = 5, /* an ICMP error sent for a packet */
	KIND_RESET = 6,
	KIND_DROP = 7,
	/* Not a decision: a conntrack entry's end, as ctnetlink's DESTROY
	 * event says it, for userspace's conntrack trackers. */
	KIND_CT_DESTROY = 8,
};

/* Logical hooks: each has its own attach ladder in internal/loader. */
enum hook_id {
	HOOK_NF_NAT = 1,
	HOOK_IPVS_CONN_NEW = 2,
	HOOK_IPVS_LEAVE = 3,
	HOOK_ICMP_SEND = 4,
	HOOK_NF_SEND_RESET = 5,
	HOOK_TCP_SEND_RESET = 6,
	HOOK_KFREE_SKB = 7,
	/* IPv6 has its own functions for ICMP errors and resets. */
	HOOK_ICMP6_SEND = 8,
	HOOK_NF_SEND_RESET6 = 9,
	HOOK_TCP_SEND_RESET6 = 10,
	HOOK_CT_DESTROY = 11,
	HOOK_MAX = 12,
};

enum via {
	VIA_FENTRY = 1,
	VIA_KPROBE = 2,
	VIA_TRACEPOINT = 3,
	VIA_NETFILTER = 4,
};

/* Roles the netfilter-tier programs take over, for hooks whose better
 * rungs failed (set at load time). */
enum nf_role {
	NF_ROLE_NAT = 1,
	NF_ROLE_RESET = 2,
	NF_ROLE_ICMP = 4,
	NF_ROLE_RESET6 = 8,
	NF_ROLE_ICMP6 = 16,
};

/* Address families a program reports (cfg_families). */
enum family_bit {
	FAMILY_V4 = 1,
	FAMILY_V6 = 2,
};

struct tuple {
	__u8 src[16];
	__u8 dst[16];
	__be16 sport; /* ICMP: the echo id, as conntrack keys it */
	__be16 dport; /* ICMP: type and code bytes */
	__u8 family;  /* AF_INET, AF_INET6, or 0 when absent */
	__u8 proto;
	__u16 _pad;
};

struct event {
	__u64 ts_ns; /* CLOCK_MONOTONIC */
	__u32 netns; /* inode of the network namespace */
	__u32 reason; /* drop reason, RST reason; IPVS: connection flags; conntrack end: TCP state */
	__u32 ct_status;
	__u32 ct_mark;
	__u32 range_flags; /* NF_NAT_RANGE_* */
	__u16 ct_zone;
	__u8 kind;
	__u8 hook;
	__u8 via;
	__u8 icmp_type;
	__u8 icmp_code;
	__u8 nf_hook; /* NF_INET_* where known, else 0xff */
	__u8 ctinfo;
	__u8 has_reason;
	__u8 no_ct; /* drops: the packet carried no conntrack entry */
	__u8 _pad;
	struct tuple pkt;   /* the packet the decision was about */
	struct tuple orig;  /* conntrack original tuple, or IPVS client -> virtual */
	struct tuple reply; /* conntrack reply tuple */
	struct tuple to;    /* NAT range: src=min addr, dst=max addr, sport=min port, dport=max port; IPVS: src=real server */
};

/* A packet's five-tuple as it appears on the wire: the key of the map of
 * connections the tracer follows, so drops are reported only for them. */
struct flow_key {
	__u8 src[16];
	__u8 dst[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 _pad[3];
};

/* One address filter: matches when (addr & mask) == prefix. */
struct prefix {
	__u8 addr[16];
	__u8 mask[16];
	__u8 family;
	__u8 _pad[3];
};

#define MAX_FILTER_PORTS 8
#define MAX_FILTER_PREFIXES 4
#define MAX_FILTER_NETNS 4
