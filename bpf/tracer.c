//go:build ignore

/* Kernel side of tracer: every NAT, IPVS, ICMP-error, reset and drop
 * decision the kernel makes becomes one struct event in the ring buffer.
 * Each logical hook has several programs (fentry, kprobe, raw tracepoint,
 * netfilter); the loader attaches the first that works on this kernel. */

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "ipvs.h"
#include "tracer.h"

char LICENSE[] SEC("license") = "GPL";

#define AF_INET 2
#define AF_INET6 10
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define IPPROTO_ICMPV6 58
#define NFCT_PTRMASK ~7UL
#define NF_ACCEPT 1
#define NF_INET_NONE 0xff
#define NF_NAT_RANGE_MAP_IPS 1
#define NF_NAT_RANGE_PROTO_SPECIFIED 2
#define TCP_FLAG_RST 0x04

/* Load-time configuration (rodata): the in-kernel filters. */
const volatile __u32 cfg_nnetns = 0; /* 0: every namespace */
const volatile __u32 cfg_netns[MAX_FILTER_NETNS] = {};
const volatile __u32 cfg_proto_mask = 0; /* bit (1 << proto class); 0: all */
const volatile __u32 cfg_nports = 0;
const volatile __u16 cfg_ports[MAX_FILTER_PORTS] = {};
const volatile __u32 cfg_nprefixes = 0;
const volatile struct prefix cfg_prefixes[MAX_FILTER_PREFIXES] = {};
const volatile __u32 cfg_nf_roles = 0;
/* The families a program reports (FAMILY_*): a tracepoint both families
 * pass through is attached once for each family's hook. */
const volatile __u32 cfg_families = FAMILY_V4 | FAMILY_V6;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

/* Events that did not fit in the ring buffer, per hook: read by userspace. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HOOK_MAX);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* Packets of the connections the tracer reported on: a drop is worth
 * reporting only for these (or when netfilter dropped it). A translated
 * connection's packets are told by their conntrack entry instead
 * (ct_translated). The rest are followed by their tuples, looked up by
 * every free on the machine, so only while they can be there
 * (follow_use): IPVS's connections in followed, once one was followed;
 * packets answered with an error or reset, and their connections, in
 * answered, for a minute after the last answer (the answered packet is
 * freed right after its answer). The value says why a tuple is followed
 * (FOLLOW_*). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, __u8);
} followed SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct flow_key);
	__type(value, __u8);
} answered SEC(".maps");

/* FOLLOW_USE_IPVS is set once followed holds a tuple; FOLLOW_USE_ANSWERED
 * is when answered last took one (bpf_ktime_get_ns). */
#define FOLLOW_USE_IPVS 0
#define FOLLOW_USE_ANSWERED 1
#define ANSWERED_FOR_NS (60ULL * 1000000000)
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} follow_use SEC(".maps");

/* Forces BTF for the types userspace decodes. */
const struct event *unused_event __attribute__((unused));

static __always_inline __u32 proto_class(__u8 proto)
{
	switch (proto) {
	case IPPROTO_TCP: return 1;
	case IPPROTO_UDP: return 2;
	case IPPROTO_ICMP: return 4;
	case IPPROTO_ICMPV6: return 4;
	case IPPROTO_SCTP: return 8;
	}
	return 16;
}

static __always_inline bool addr_in(const __u8 *addr, __u8 family)
{
	for (int i = 0; i < MAX_FILTER_PREFIXES; i++) {
		if (i >= cfg_nprefixes)
			break;
		if (cfg_prefixes[i].family != family)
			continue;
		bool ok = true;
		for (int b = 0; b < 16; b++) {
			if ((addr[b] & cfg_prefixes[i].mask[b]) != cfg_prefixes[i].addr[b]) {
				ok = false;
				break;
			}
		}
		if (ok)
			return true;
	}
	return false;
}

static __always_inline bool port_in(__be16 port)
{
	__u16 p = bpf_ntohs(port);
	for (int i = 0; i < MAX_FILTER_PORTS; i++) {
		if (i >= cfg_nports)
			break;
		if (cfg_ports[i] == p)
			return true;
	}
	return false;
}

static __always_inline bool tuple_has_addr(const struct tuple *t)
{
	return t->family && (addr_in(t->src, t->family) || addr_in(t->dst, t->family));
}

static __always_inline bool tuple_has_port(const struct tuple *t)
{
	return t->family && (port_in(t->sport) || port_in(t->dport));
}

/* Whether ns is among the first n of list (a load-time filter). */
static __always_inline bool netns_listed(const volatile __u32 *list, __u32 n, __u32 ns)
{
	for (int i = 0; i < MAX_FILTER_NETNS; i++) {
		if (i >= n)
			break;
		if (list[i] == ns)
			return true;
	}
	return false;
}

static __always_inline bool netns_wanted(__u32 ns)
{
	if (!cfg_nnetns || !ns)
		return true; /* 0: the namespace could not be read */
	return netns_listed(cfg_netns, cfg_nnetns, ns);
}

/* The load-time filter: every configured term must match some part of the
 * event (packet, conntrack tuples or NAT target). */
static __always_inline bool wanted(const struct event *e)
{
	if (!netns_wanted(e->netns))
		return false;
	if (cfg_proto_mask) {
		__u8 proto = e->pkt.family ? e->pkt.proto : e->orig.proto;
		if (!(cfg_proto_mask & proto_class(proto)))
			return false;
	}
	if (cfg_nports && !tuple_has_port(&e->pkt) && !tuple_has_port(&e->orig) &&
	    !tuple_has_port(&e->reply) && !tuple_has_port(&e->to))
		return false;
	if (cfg_nprefixes && !tuple_has_addr(&e->pkt) && !tuple_has_addr(&e->orig) &&
	    !tuple_has_addr(&e->reply) && !tuple_has_addr(&e->to))
		return false;
	return true;
}

static __always_inline bool family_wanted(__u8 family)
{
	return cfg_families & (family == AF_INET6 ? FAMILY_V6 : FAMILY_V4);
}

/* The hook an ICMP error or reset is reported under: IPv6 sends them from
 * functions of its own, each with its own attach ladder, so an event's
 * hook says which one saw it. */
static __always_inline __u8 family_hook(__u8 hook, __u8 family)
{
	/* A packet that could not be read still came to the IPv6 function
	 * when this instance serves IPv6 alone. */
	if (!family && cfg_families == FAMILY_V6)
		family = AF_INET6;
	if (family != AF_INET6)
		return hook;
	switch (hook) {
	case HOOK_ICMP_SEND: return HOOK_ICMP6_SEND;
	case HOOK_NF_SEND_RESET: return HOOK_NF_SEND_RESET6;
	case HOOK_TCP_SEND_RESET: return HOOK_TCP_SEND_RESET6;
	}
	return hook;
}

static __always_inline void count_lost(__u32 hook)
{
	__u64 *n = bpf_map_lookup_elem(&lost, &hook);
	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline struct event *reserve(__u8 kind, __u8 hook, __u8 via)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost(hook);
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = kind;
	e->hook = hook;
	e->via = via;
	e->nf_hook = NF_INET_NONE;
	return e;
}

/* Why a packet's tuple is followed: the tracer reported its connection
 * (IPVS, or the connection of an answered packet), or this very packet
 * was answered with an ICMP error or a reset (the kernel frees it right
 * after, and on kernels without drop reasons that free is the only sign
 * of the drop). */
#define FOLLOW_CONN 1
#define FOLLOW_ANSWERED 2

static __always_inline void tuple_key(struct flow_key *k, const struct tuple *t)
{
	__builtin_memcpy(k->src, t->src, 16);
	__builtin_memcpy(k->dst, t->dst, 16);
	k->sport = t->sport;
	k->dport = t->dport;
	k->proto = t->proto;
}

static __always_inline void follow_tuple(void *map, const struct tuple *t, __u8 why)
{
	if (!t->family)
		return;
	struct flow_key k = {};
	tuple_key(&k, t);
	__u8 *old = bpf_map_lookup_elem(map, &k);
	if (old) {
		/* In place: an LRU update takes the map's locks and a free
		 * node, and a connection's second decision finds its tuple
		 * followed already. Not atomic (BPF has no byte atomics), no
		 * more racy than the update was. */
		if ((*old & why) != why)
			*old |= why;
		return;
	}
	bpf_map_update_elem(map, &k, &why, BPF_ANY);
}

static __always_inline void set_follow_use(__u32 which, __u64 v)
{
	__u64 *use = bpf_map_lookup_elem(&follow_use, &which);
	if (use && *use != v)
		*use = v;
}

static __always_inline __u64 follow_use_of(__u32 which)
{
	__u64 *use = bpf_map_lookup_elem(&follow_use, &which);
	return use ? *use : 0;
}

/* Which maps of followed tuples may hold a packet's: on most nodes, most
 * of the time, neither, and a free need not read its packet at all. */
struct follow_maps {
	bool answered, ipvs;
};

static __always_inline struct follow_maps follow_maps_in_use(void)
{
	struct follow_maps in = {};
	__u64 last = follow_use_of(FOLLOW_USE_ANSWERED);
	in.answered = last && bpf_ktime_get_ns() - last < ANSWERED_FOR_NS;
	in.ipvs = follow_use_of(FOLLOW_USE_IPVS) != 0;
	return in;
}

/* Why the packet of tuple t is followed, 0 when it is not. */
static __always_inline __u8 followed_why(const struct tuple *t, struct follow_maps in)
{
	struct flow_key k = {};
	tuple_key(&k, t);
	__u8 *why = NULL;
	if (in.answered)
		why = bpf_map_lookup_elem(&answered, &k);
	if (!why && in.ipvs)
		why = bpf_map_lookup_elem(&followed, &k);
	return why ? *why : 0;
}

/* Waking the reader for every record costs more than the programs
 * themselves on a busy node; it is woken once this much is waiting, and
 * otherwise reads on its own every few milliseconds (internal/loader). */
#define WAKEUP_BYTES (256 << 10)

static __always_inline void submit(void *e)
{
	__u64 waiting = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(e, waiting >= WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* Submits the event if it passes the filters, and follows its packets.
 * A translated connection is not followed by its tuples: its packets
 * carry its conntrack entry, whose status says it was translated
 * (ct_translated), and a map update per tuple was most of what a
 * connection cost the programs (a full LRU map evicts on every insert). */
static __always_inline void finish(struct event *e)
{
	if (!wanted(e)) {
		bpf_ringbuf_discard(e, 0);
		return;
	}
	if (e->kind == KIND_REJECT || e->kind == KIND_RESET || e->kind == KIND_IPVS_NO_DEST) {
		follow_tuple(&answered, &e->pkt, FOLLOW_ANSWERED);
		follow_tuple(&answered, &e->orig, FOLLOW_CONN);
		follow_tuple(&answered, &e->reply, FOLLOW_CONN);
		set_follow_use(FOLLOW_USE_ANSWERED, e->ts_ns);
	} else if (e->kind != KIND_DNAT && e->kind != KIND_SNAT) {
		follow_tuple(&followed, &e->pkt, FOLLOW_CONN);
		follow_tuple(&followed, &e->orig, FOLLOW_CONN);
		follow_tuple(&followed, &e->reply, FOLLOW_CONN);
		set_follow_use(FOLLOW_USE_IPVS, 1);
	}
	submit(e);
}

static __always_inline __u32 net_inum(struct net *net)
{
	return net ? BPF_CORE_READ(net, ns.inum) : 0;
}

/* The namespace a packet is in: its device's, else its route's device's,
 * else its socket's (locally generated packets before routing). */
static __always_inline __u32 skb_netns(struct sk_buff *skb)
{
	struct net_device *dev = BPF_CORE_READ(skb, dev);
	if (!dev) {
		unsigned long refdst = BPF_CORE_READ(skb, _skb_refdst);
		struct dst_entry *dst = (struct dst_entry *)(refdst & ~1UL);
		if (dst)
			dev = BPF_CORE_READ(dst, dev);
	}
	if (dev)
		return net_inum(BPF_CORE_READ(dev, nd_net.net));
	struct sock *sk = BPF_CORE_READ(skb, sk);
	if (sk)
		return net_inum(BPF_CORE_READ(sk, __sk_common.skc_net.net));
	return 0;
}

/* Takes the L4 ports (or ICMP id and type/code) from h, the first 6 bytes
 * of the L4 header. */
static __always_inline void l4_from(struct tuple *t, const __u8 *h)
{
	if (t->proto == IPPROTO_TCP || t->proto == IPPROTO_UDP || t->proto == IPPROTO_SCTP) {
		__builtin_memcpy(&t->sport, h, 2);
		__builtin_memcpy(&t->dport, h + 2, 2);
	} else if (t->proto == IPPROTO_ICMP || t->proto == IPPROTO_ICMPV6) {
		__builtin_memcpy(&t->dport, h, 2);
		__builtin_memcpy(&t->sport, h + 4, 2);
	}
}

/* Reads the L4 ports (or ICMP id and type/code) at l4 into t. */
static __always_inline void read_l4(struct tuple *t, const void *l4)
{
	__u8 h[6] = {};
	bpf_probe_read_kernel(h, sizeof(h), l4);
	l4_from(t, h);
}

/* IPv6 extension headers (RFC 8200 4.1) that may come before a packet's
 * upper-layer header. */
#define NEXTHDR_HOP 0
#define NEXTHDR_ROUTING 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH 51
#define NEXTHDR_DEST 60
/* RFC 8200 recommends at most one of each, destination options twice. */
#define IPV6_EXT_MAX 6

/* Skips the extension headers from p, next being the first header's type:
 * sets t->proto to the upper layer's and returns its header's address,
 * or NULL for a fragment other than the first (no upper-layer header) or
 * a chain longer than IPV6_EXT_MAX. */
static __always_inline const void *skip_ipv6_ext(struct tuple *t, __u8 next, const void *p)
{
	for (int i = 0; i < IPV6_EXT_MAX; i++) {
		__u8 h[4] = {};
		switch (next) {
		case NEXTHDR_HOP:
		case NEXTHDR_ROUTING:
		case NEXTHDR_DEST:
			bpf_probe_read_kernel(h, 2, p);
			next = h[0];
			p += ((__u32)h[1] + 1) * 8;
			break;
		case NEXTHDR_AUTH:
			bpf_probe_read_kernel(h, 2, p);
			next = h[0];
			p += ((__u32)h[1] + 2) * 4;
			break;
		case NEXTHDR_FRAGMENT:
			bpf_probe_read_kernel(h, 4, p);
			next = h[0];
			p += 8;
			if (((h[2] << 8) | h[3]) & 0xfff8) {
				t->proto = next;
				return NULL;
			}
			break;
		default:
			t->proto = next;
			return p;
		}
	}
	t->proto = next;
	return NULL;
}

/* A packet's first bytes from its network header: an IPv4 header without
 * options or an IPv6 header, and the 8 bytes after it, where the ports
 * are when no options or extension headers come between. */
union packet_head {
	struct iphdr v4;
	struct ipv6hdr v6;
	__u8 b[sizeof(struct ipv6hdr) + 8];
};

/* Parses the IPv4 or IPv6 header at nh (and IPv6's extension headers)
 * and the ports after it into t, and returns the L4 header's address, or
 * NULL when there is none. The common packet takes one read: a read is
 * most of what a program spends on a packet it does not report. */
static __always_inline const void *read_packet(struct tuple *t, const void *nh)
{
	union packet_head h = {};
	bool whole = bpf_probe_read_kernel(&h, sizeof(h), nh) == 0;
	if (!whole) {
		/* What follows a short packet was not readable: its
		 * headers alone. */
		bpf_probe_read_kernel(&h, sizeof(h.v4), nh);
		if ((h.b[0] >> 4) == 6)
			bpf_probe_read_kernel(&h, sizeof(h.v6), nh);
	}
	const void *l4 = NULL;
	if ((h.b[0] >> 4) == 4) {
		t->family = AF_INET;
		t->proto = h.v4.protocol;
		__builtin_memcpy(t->src, &h.v4.saddr, 4);
		__builtin_memcpy(t->dst, &h.v4.daddr, 4);
		if (bpf_ntohs(h.v4.frag_off) & 0x1fff)
			return NULL; /* not the first fragment: no L4 header */
		l4 = nh + (h.b[0] & 0xf) * 4;
		if (whole && l4 == nh + sizeof(struct iphdr)) {
			l4_from(t, h.b + sizeof(struct iphdr));
			return l4;
		}
	} else if ((h.b[0] >> 4) == 6) {
		t->family = AF_INET6;
		__builtin_memcpy(t->src, &h.v6.saddr, 16);
		__builtin_memcpy(t->dst, &h.v6.daddr, 16);
		l4 = skip_ipv6_ext(t, h.v6.nexthdr, nh + sizeof(struct ipv6hdr));
		if (whole && l4 == nh + sizeof(struct ipv6hdr)) {
			l4_from(t, h.b + sizeof(struct ipv6hdr));
			return l4;
		}
	}
	if (l4)
		read_l4(t, l4);
	return l4;
}

/* Reads the five-tuple of the packet in skb from its network header and
 * returns its L4 header's address (NULL when it has none or on failure). */
static __always_inline const void *read_skb_l4(struct tuple *t, struct sk_buff *skb)
{
	__u16 proto = bpf_ntohs(BPF_CORE_READ(skb, protocol));
	if (proto != ETH_P_IP && proto != ETH_P_IPV6)
		return NULL;
	unsigned char *head = BPF_CORE_READ(skb, head);
	__u16 nhoff = BPF_CORE_READ(skb, network_header);
	if (!head || nhoff == (__u16)~0U)
		return NULL;
	return read_packet(t, head + nhoff);
}

/* Reads the five-tuple of the packet in skb from its network header. */
static __always_inline bool read_skb(struct tuple *t, struct sk_buff *skb)
{
	read_skb_l4(t, skb);
	return t->family != 0;
}

static __always_inline void tuple_of_ct(struct tuple *t, const struct nf_conntrack_tuple *ctt)
{
	t->family = ctt->src.l3num;
	t->proto = ctt->dst.protonum;
	__builtin_memcpy(t->src, &ctt->src.u3, 16);
	__builtin_memcpy(t->dst, &ctt->dst.u3, 16);
	t->sport = ctt->src.u.all;
	t->dport = ctt->dst.u.all;
	if (t->family == AF_INET) {
		__builtin_memset(t->src + 4, 0, 12);
		__builtin_memset(t->dst + 4, 0, 12);
	}
}

static __always_inline void read_ct_tuple(struct tuple *t, struct nf_conn *ct, int dir)
{
	struct nf_conntrack_tuple ctt = {};
	bpf_core_read(&ctt, sizeof(ctt), &ct->tuplehash[dir].tuple);
	tuple_of_ct(t, &ctt);
}

/* nf_conn's tuples, status and namespace, which follow one another in
 * every kernel the tracer knows: one read for the four, where the
 * kernel's layout is this one (ct_span_fits, decided at load time). */
struct ct_span {
	struct nf_conntrack_tuple_hash tuplehash[2];
	__u64 status;
	struct net *net;
};

static __always_inline bool ct_span_fits(void)
{
	struct ct_span *s = 0;
	return bpf_core_type_size(struct nf_conntrack_tuple_hash) == sizeof(s->tuplehash[0]) &&
	       bpf_core_field_offset(struct nf_conntrack_tuple_hash, tuple) ==
		       __builtin_offsetof(struct nf_conntrack_tuple_hash, tuple) &&
	       bpf_core_field_offset(struct nf_conn, status) ==
		       bpf_core_field_offset(struct nf_conn, tuplehash) + __builtin_offsetof(struct ct_span, status) &&
	       bpf_core_field_size(struct nf_conn, status) == sizeof(s->status) &&
	       bpf_core_field_offset(struct nf_conn, ct_net) ==
		       bpf_core_field_offset(struct nf_conn, tuplehash) + __builtin_offsetof(struct ct_span, net) &&
	       bpf_core_field_size(struct nf_conn, ct_net) == sizeof(s->net);
}

static __always_inline void read_ct(struct event *e, struct nf_conn *ct)
{
	struct net *net = NULL;
	if (ct_span_fits()) {
		struct ct_span span = {};
		bpf_core_read(&span, sizeof(span), &ct->tuplehash);
		tuple_of_ct(&e->orig, &span.tuplehash[0].tuple);
		tuple_of_ct(&e->reply, &span.tuplehash[1].tuple);
		e->ct_status = (__u32)span.status;
		net = span.net;
	} else {
		read_ct_tuple(&e->orig, ct, 0);
		read_ct_tuple(&e->reply, ct, 1);
		e->ct_status = (__u32)BPF_CORE_READ(ct, status);
		net = BPF_CORE_READ(ct, ct_net.net);
	}
	if (bpf_core_field_exists(ct->mark))
		e->ct_mark = BPF_CORE_READ(ct, mark);
	if (bpf_core_field_exists(ct->zone))
		e->ct_zone = BPF_CORE_READ(ct, zone.id);
	e->netns = net_inum(net);
}

/* ---- nf_nat_setup_info: every DNAT and SNAT chosen ---- */

static __always_inline bool same_addr(const union nf_inet_addr *a, const union nf_inet_addr *b)
{
	return a->all[0] == b->all[0] && a->all[1] == b->all[1] &&
	       a->all[2] == b->all[2] && a->all[3] == b->all[3];
}

/* after: the call has set the reply tuple (fexit), so the event carries
 * it, and the join asks conntrack nothing when it arrives. Before the call
 * (a kprobe) the reply tuple is still the original's inverse, or has only
 * the other manip: what it becomes is conntrack's to say. */
static __always_inline int on_nat(struct nf_conn *ct, const struct nf_nat_range2 *range,
				  int manip, __u8 via, bool after)
{
	if (!ct || !range)
		return 0;
	struct nf_nat_range2 r = {};
	bpf_core_read(&r, sizeof(r), range);

	/* Null bindings (every new connection without a NAT rule gets one)
	 * map the address to itself and are not decisions worth reporting.
	 * The original tuple, which NAT never changes, has the address the
	 * reply tuple had before the call. */
	union nf_inet_addr cur = {};
	if (manip == NF_NAT_MANIP_SRC)
		bpf_core_read(&cur, sizeof(cur), &ct->tuplehash[0].tuple.src.u3);
	else
		bpf_core_read(&cur, sizeof(cur), &ct->tuplehash[0].tuple.dst.u3);
	if (r.flags == NF_NAT_RANGE_MAP_IPS && same_addr(&r.min_addr, &r.max_addr) &&
	    same_addr(&r.min_addr, &cur))
		return 0;

	struct event *e = reserve(manip == NF_NAT_MANIP_DST ? KIND_DNAT : KIND_SNAT, HOOK_NF_NAT, via);
	if (!e)
		return 0;
	read_ct(e, ct);
	if (!after)
		__builtin_memset(&e->reply, 0, sizeof(e->reply));
	e->range_flags = r.flags;
	e->to.family = e->orig.family;
	e->to.proto = e->orig.proto;
	if (r.flags & NF_NAT_RANGE_MAP_IPS) {
		__builtin_memcpy(e->to.src, &r.min_addr, 16);
		__builtin_memcpy(e->to.dst, &r.max_addr, 16);
	}
	if (r.flags & NF_NAT_RANGE_PROTO_SPECIFIED) {
		e->to.sport = r.min_proto.all;
		e->to.dport = r.max_proto.all;
	}
	finish(e);
	return 0;
}

/* fexit, on the fentry tier: the same trampoline, after the call. */
SEC("fexit/nf_nat_setup_info")
int BPF_PROG(tr_nat_fexit, struct nf_conn *ct, const struct nf_nat_range2 *range, int manip, unsigned int ret)
{
	return on_nat(ct, range, manip, VIA_FENTRY, true);
}

SEC("kprobe/nf_nat_setup_info")
int BPF_KPROBE(tr_nat_kprobe, struct nf_conn *ct, const struct nf_nat_range2 *range, int manip)
{
	return on_nat(ct, range, manip, VIA_KPROBE, false);
}

/* ---- nf_ct_delete: the ends of the conntrack entries flows ask for ----
 *
 * What a ctnetlink DESTROY event says of an entry (tuples, status, mark,
 * zone, TCP state), for the namespaces whose conntrack trackers ask for it
 * (cfg_ct_netns), in place of their DESTROY subscription: a listener makes
 * the kernel build a netlink message for every connection that ends, and
 * that cost the benchmark's node about 7 us a connection. In the ring
 * buffer an entry's end also comes before any later decision on its tuple,
 * since the kernel deletes the entry before a new one can take the tuple. */
const volatile __u32 cfg_ct_nnetns = 0;
const volatile __u32 cfg_ct_netns[MAX_FILTER_NETNS] = {};

/* The tracer followed the connection of entry ct: IPVS scheduled it, or
 * one of its packets was answered with an error or a reset. Such a
 * connection's flow asks for its entry as a translated one's does; a
 * node's other connections, most of them, have no flow, and their ends
 * are not worth a record each. */
static __always_inline bool ct_followed(struct nf_conn *ct)
{
	struct follow_maps in = follow_maps_in_use();
	if (!in.answered && !in.ipvs)
		return false;
	struct tuple t = {};
	read_ct_tuple(&t, ct, 0);
	if (followed_why(&t, in))
		return true;
	read_ct_tuple(&t, ct, 1);
	return followed_why(&t, in) != 0;
}

/* at_free: the entry's last reference is going, after its delete. Only
 * the ends a flow can ask for are reported: a translated connection's
 * (the NAT hooks reported it) or a followed one's (ct_followed). */
static __always_inline int on_ct_end(struct nf_conn *ct, bool at_free, __u8 via)
{
	if (!ct)
		return 0;
	/* An unconfirmed entry was never in the table: it has no DESTROY
	 * event. nf_ct_delete does nothing for an entry already dying (a
	 * second delete). */
	__u64 status = BPF_CORE_READ(ct, status);
	if (!(status & IPS_CONFIRMED) || (!at_free && (status & IPS_DYING)))
		return 0;
	if (!netns_listed(cfg_ct_netns, cfg_ct_nnetns, net_inum(BPF_CORE_READ(ct, ct_net.net))))
		return 0;
	if (!(status & (IPS_SRC_NAT | IPS_DST_NAT)) && !ct_followed(ct))
		return 0;
	struct event *e = reserve(KIND_CT_DESTROY, HOOK_CT_DESTROY, via);
	if (!e)
		return 0;
	read_ct(e, ct);
	if (e->orig.proto == IPPROTO_TCP) {
		e->reason = BPF_CORE_READ(ct, proto.tcp.state);
		e->has_reason = 1;
	}
	submit(e);
	return 0;
}

SEC("fentry/nf_ct_delete")
int BPF_PROG(tr_ctdel_fentry, struct nf_conn *ct)
{
	return on_ct_end(ct, false, VIA_FENTRY);
}

SEC("kprobe/nf_ct_delete")
int BPF_KPROBE(tr_ctdel_kprobe, struct nf_conn *ct)
{
	return on_ct_end(ct, false, VIA_KPROBE);
}

/* Kernels before 5.19 free an entry through a pointer to destroy_conntrack,
 * never inlined, while conntrack's own callers of nf_ct_delete may have it
 * inlined (5.10's garbage collection and lookups of expired entries do: a
 * probe on nf_ct_delete misses every entry that timed out). An entry's
 * last reference goes right after its delete, unless a packet in flight
 * still holds it. */
SEC("kprobe/destroy_conntrack")
int BPF_KPROBE(tr_ctfree_kprobe, struct nf_conn *ct)
{
	return on_ct_end(ct, true, VIA_KPROBE);
}

/* ---- ip_vs_conn_new: every IPVS scheduling decision ---- */

static __always_inline void read_inet(__u8 *dst, const union nf_inet_addr *a, __u16 af)
{
	bpf_probe_read_kernel(dst, af == AF_INET ? 4 : 16, a);
}

static __always_inline int on_ipvs_conn_new(const struct ip_vs_conn_param *p, int dest_af,
					    const union nf_inet_addr *daddr, __be16 dport,
					    unsigned int flags, __u8 via)
{
	if (!p || (flags & IP_VS_CONN_F_TEMPLATE))
		return 0; /* persistence templates are not connections */
	struct event *e = reserve(KIND_IPVS, HOOK_IPVS_CONN_NEW, via);
	if (!e)
		return 0;
	__u16 af = BPF_CORE_READ(p, af);
	e->orig.family = af;
	e->orig.proto = BPF_CORE_READ(p, protocol);
	read_inet(e->orig.src, BPF_CORE_READ(p, caddr), af);
	read_inet(e->orig.dst, BPF_CORE_READ(p, vaddr), af);
	e->orig.sport = BPF_CORE_READ(p, cport);
	e->orig.dport = BPF_CORE_READ(p, vport);
	e->to.family = dest_af;
	e->to.proto = e->orig.proto;
	read_inet(e->to.src, daddr, dest_af);
	e->to.sport = dport;
	e->reason = flags;
	e->netns = net_inum(BPF_CORE_READ(p, ipvs, net));
	finish(e);
	return 0;
}

SEC("fentry/ip_vs_conn_new")
int BPF_PROG(tr_ipvs_fentry, const struct ip_vs_conn_param *p, int dest_af,
	     const union nf_inet_addr *daddr, __be16 dport, unsigned int flags)
{
	return on_ipvs_conn_new(p, dest_af, daddr, dport, flags, VIA_FENTRY);
}

SEC("kprobe/ip_vs_conn_new")
int BPF_KPROBE(tr_ipvs_kprobe, const struct ip_vs_conn_param *p, int dest_af,
	       const union nf_inet_addr *daddr, __be16 dport, unsigned int flags)
{
	return on_ipvs_conn_new(p, dest_af, daddr, dport, flags, VIA_KPROBE);
}

/* Kernels without module BTF (5.10) cannot relocate the ip_vs types: these
 * variants read struct ip_vs_conn_param by its layout, unchanged since
 * 4.x (ipvs, caddr, vaddr, cport, vport, protocol, af). The namespace is
 * not reachable without BTF (struct netns_ipvs varies): it is reported as 0,
 * unknown, and such events pass the namespace filter. */
SEC("kprobe/ip_vs_conn_new")
int BPF_KPROBE(tr_ipvs_kraw, const void *p, int dest_af, const union nf_inet_addr *daddr, __be16 dport,
	       unsigned int flags)
{
	if (!p || (flags & IP_VS_CONN_F_TEMPLATE))
		return 0;
	struct event *e = reserve(KIND_IPVS, HOOK_IPVS_CONN_NEW, VIA_KPROBE);
	if (!e)
		return 0;
	const union nf_inet_addr *caddr = NULL, *vaddr = NULL;
	__u16 af = 0, proto = 0;
	bpf_probe_read_kernel(&caddr, sizeof(caddr), p + 8);
	bpf_probe_read_kernel(&vaddr, sizeof(vaddr), p + 16);
	bpf_probe_read_kernel(&e->orig.sport, 2, p + 24);
	bpf_probe_read_kernel(&e->orig.dport, 2, p + 26);
	bpf_probe_read_kernel(&proto, 2, p + 28);
	bpf_probe_read_kernel(&af, 2, p + 30);
	if (af != AF_INET && af != AF_INET6) {
		bpf_ringbuf_discard(e, 0);
		return 0;
	}
	e->orig.family = af;
	e->orig.proto = proto;
	read_inet(e->orig.src, caddr, af);
	read_inet(e->orig.dst, vaddr, af);
	e->to.family = dest_af;
	e->to.proto = e->orig.proto;
	read_inet(e->to.src, daddr, dest_af);
	e->to.sport = dport;
	e->reason = flags;
	finish(e);
	return 0;
}

/* ---- ip_vs_leave: a virtual server found no real server ---- */

static __always_inline int on_ipvs_leave(struct ip_vs_service *svc, struct sk_buff *skb, __u8 via)
{
	if (!svc || !skb)
		return 0;
	struct event *e = reserve(KIND_IPVS_NO_DEST, HOOK_IPVS_LEAVE, via);
	if (!e)
		return 0;
	read_skb(&e->pkt, skb);
	__u16 af = BPF_CORE_READ(svc, af);
	e->orig.family = af;
	e->orig.proto = BPF_CORE_READ(svc, protocol);
	bpf_core_read(e->orig.dst, af == AF_INET ? 4 : 16, &svc->addr);
	e->orig.dport = BPF_CORE_READ(svc, port);
	__builtin_memcpy(e->orig.src, e->pkt.src, 16);
	e->orig.sport = e->pkt.sport;
	e->netns = net_inum(BPF_CORE_READ(svc, ipvs, net));
	finish(e);
	return 0;
}

SEC("fentry/ip_vs_leave")
int BPF_PROG(tr_ipvsl_fentry, struct ip_vs_service *svc, struct sk_buff *skb)
{
	return on_ipvs_leave(svc, skb, VIA_FENTRY);
}

SEC("kprobe/ip_vs_leave")
int BPF_KPROBE(tr_ipvsl_kprobe, struct ip_vs_service *svc, struct sk_buff *skb)
{
	return on_ipvs_leave(svc, skb, VIA_KPROBE);
}

/* Without module BTF: the packet itself says which virtual server it was
 * addressed to, and the skb (a vmlinux type) its namespace. */
SEC("kprobe/ip_vs_leave")
int BPF_KPROBE(tr_ipvsl_kraw, void *svc, struct sk_buff *skb)
{
	if (!skb)
		return 0;
	struct event *e = reserve(KIND_IPVS_NO_DEST, HOOK_IPVS_LEAVE, VIA_KPROBE);
	if (!e)
		return 0;
	read_skb(&e->pkt, skb);
	e->orig = e->pkt;
	e->netns = skb_netns(skb);
	finish(e);
	return 0;
}

/* ---- __icmp_send, icmp6_send: REJECT and every other ICMP error ---- */

/* The IPv6 function takes type and code as u8: only their low bytes are
 * read (e->icmp_type and icmp_code are bytes). */
static __always_inline int on_icmp_send(struct sk_buff *skb, int type, int code, __u8 via)
{
	if (!skb)
		return 0;
	struct tuple t = {};
	read_skb(&t, skb);
	struct event *e = reserve(KIND_REJECT, family_hook(HOOK_ICMP_SEND, t.family), via);
	if (!e)
		return 0;
	e->pkt = t;
	e->icmp_type = type;
	e->icmp_code = code;
	e->netns = skb_netns(skb);
	finish(e);
	return 0;
}

SEC("fentry/__icmp_send")
int BPF_PROG(tr_icmp_fentry, struct sk_buff *skb, int type, int code)
{
	return on_icmp_send(skb, type, code, VIA_FENTRY);
}

SEC("kprobe/__icmp_send")
int BPF_KPROBE(tr_icmp_kprobe, struct sk_buff *skb, int type, int code)
{
	return on_icmp_send(skb, type, code, VIA_KPROBE);
}

/* icmp:icmp_send (6.13+): TP_PROTO(const struct sk_buff *skb, int type, int code) */
SEC("raw_tracepoint/icmp_send")
int tr_icmp_tp(struct bpf_raw_tracepoint_args *ctx)
{
	return on_icmp_send((struct sk_buff *)ctx->args[0], (int)ctx->args[1],
			    (int)ctx->args[2], VIA_TRACEPOINT);
}

/* ---- nf_send_reset, nf_send_reset6: REJECT --reject-with tcp-reset ---- */

static __always_inline int on_nf_send_reset(struct net *net, struct sk_buff *skb, int hook, __u8 via)
{
	if (!skb)
		return 0;
	struct tuple t = {};
	read_skb(&t, skb);
	struct event *e = reserve(KIND_RESET, family_hook(HOOK_NF_SEND_RESET, t.family), via);
	if (!e)
		return 0;
	e->pkt = t;
	e->nf_hook = hook;
	e->netns = net ? net_inum(net) : skb_netns(skb);
	finish(e);
	return 0;
}

SEC("fentry/nf_send_reset")
int BPF_PROG(tr_nfrst_fentry, struct net *net, struct sock *sk, struct sk_buff *skb, int hook)
{
	return on_nf_send_reset(net, skb, hook, VIA_FENTRY);
}

SEC("kprobe/nf_send_reset")
int BPF_KPROBE(tr_nfrst_kprobe, struct net *net, struct sock *sk, struct sk_buff *skb, int hook)
{
	return on_nf_send_reset(net, skb, hook, VIA_KPROBE);
}

/* ---- the stack's RSTs: tcp_v4_send_reset, tcp_v6_send_reset,
 * tcp:tcp_send_reset ---- */

static __always_inline bool is_v4_mapped(const __u8 *a)
{
	for (int i = 0; i < 10; i++)
		if (a[i])
			return false;
	return a[10] == 0xff && a[11] == 0xff;
}

/* The packet a RST answers: the incoming skb, or for an active reset the
 * socket's connection as the peer sends it. */
static __always_inline void read_rst_packet(struct tuple *t, const struct sock *sk, struct sk_buff *skb)
{
	if (skb && read_skb(t, skb))
		return;
	if (!sk)
		return;
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	t->proto = IPPROTO_TCP;
	if (family == AF_INET6) {
		bpf_core_read(t->src, 16, &sk->__sk_common.skc_v6_daddr);
		bpf_core_read(t->dst, 16, &sk->__sk_common.skc_v6_rcv_saddr);
	}
	/* An IPv4 connection of a dual-stack ([::]) socket has an AF_INET6
	 * socket whose addresses are v4-mapped: its packets are IPv4, and so
	 * is its reset. */
	if (family == AF_INET || is_v4_mapped(t->src)) {
		family = AF_INET;
		__builtin_memset(t->src, 0, sizeof(t->src));
		__builtin_memset(t->dst, 0, sizeof(t->dst));
		bpf_core_read(t->src, 4, &sk->__sk_common.skc_daddr);
		bpf_core_read(t->dst, 4, &sk->__sk_common.skc_rcv_saddr);
	}
	t->family = family;
	t->sport = BPF_CORE_READ(sk, __sk_common.skc_dport);
	/* A full socket's reset goes out from inet_sport: an abort
	 * (SO_LINGER 0, tcp_disconnect) moves it to CLOSE, which unbinds it
	 * and zeroes skc_num first. A timewait or request socket has no
	 * inet_sock around its common part: skc_num it is. */
	__u8 state = BPF_CORE_READ(sk, __sk_common.skc_state);
	if (state == 6 /* TCP_TIME_WAIT */ || state == 12 /* TCP_NEW_SYN_RECV */)
		t->dport = bpf_htons(BPF_CORE_READ(sk, __sk_common.skc_num));
	else
		t->dport = BPF_CORE_READ((const struct inet_sock *)sk, inet_sport);
}

static __always_inline int on_tcp_reset(const struct sock *sk, struct sk_buff *skb, __u32 reason,
					bool has_reason, __u8 via)
{
	struct tuple t = {};
	read_rst_packet(&t, sk, skb);
	/* The tracepoint fires for both families; each family's hook has
	 * its own instance of the program. A reset of no known family is the
	 * IPv4 instance's, so it is reported once. */
	if (t.family ? !family_wanted(t.family) : via == VIA_TRACEPOINT && !(cfg_families & FAMILY_V4))
		return 0;
	struct event *e = reserve(KIND_RESET, family_hook(HOOK_TCP_SEND_RESET, t.family), via);
	if (!e)
		return 0;
	e->pkt = t;
	e->reason = reason;
	e->has_reason = has_reason;
	if (skb)
		e->netns = skb_netns(skb);
	if (!e->netns && sk)
		e->netns = net_inum(BPF_CORE_READ(sk, __sk_common.skc_net.net));
	finish(e);
	return 0;
}

/* 6.10+ passes enum sk_rst_reason as a third argument. */
SEC("fentry/tcp_v4_send_reset")
int BPF_PROG(tr_rst_fentry3, const struct sock *sk, struct sk_buff *skb, int reason)
{
	return on_tcp_reset(sk, skb, reason, true, VIA_FENTRY);
}

SEC("fentry/tcp_v4_send_reset")
int BPF_PROG(tr_rst_fentry, const struct sock *sk, struct sk_buff *skb)
{
	return on_tcp_reset(sk, skb, 0, false, VIA_FENTRY);
}

SEC("kprobe/tcp_v4_send_reset")
int BPF_KPROBE(tr_rst_kprobe, const struct sock *sk, struct sk_buff *skb)
{
	__u32 reason = 0;
	bool has = bpf_core_enum_value_exists(enum sk_rst_reason, SK_RST_REASON_NOT_SPECIFIED);
	if (has)
		reason = (__u32)PT_REGS_PARM3(ctx);
	return on_tcp_reset(sk, skb, reason, has, VIA_KPROBE);
}

/* tcp:tcp_send_reset: (sk, skb) until 6.9, (sk, skb, reason) since. A raw
 * tracepoint may not read past its arguments, hence two programs. */
SEC("raw_tracepoint/tcp_send_reset")
int tr_rst_tp3(struct bpf_raw_tracepoint_args *ctx)
{
	return on_tcp_reset((const struct sock *)ctx->args[0], (struct sk_buff *)ctx->args[1],
			    (__u32)ctx->args[2], true, VIA_TRACEPOINT);
}

SEC("raw_tracepoint/tcp_send_reset")
int tr_rst_tp(struct bpf_raw_tracepoint_args *ctx)
{
	return on_tcp_reset((const struct sock *)ctx->args[0], (struct sk_buff *)ctx->args[1],
			    0, false, VIA_TRACEPOINT);
}

/* ---- skb:kfree_skb: drops, for followed packets or netfilter's ---- */

/* The conntrack entry and ctinfo an skb's _nfct holds. */
static __always_inline struct nf_conn *nfct_ct(unsigned long nfct, __u8 *ctinfo)
{
	*ctinfo = nfct & 7;
	return (struct nf_conn *)(nfct & NFCT_PTRMASK);
}

static __always_inline bool ct_related(struct nf_conn *ct, __u8 ctinfo)
{
	return ct && (ctinfo == IP_CT_RELATED || ctinfo == IP_CT_RELATED_REPLY);
}

/* The packet's conntrack entry (its skb's _nfct) is one NAT translated:
 * the packet is one of a connection the NAT hooks reported, in either
 * direction, before or after its translation. */
static __always_inline bool ct_translated(unsigned long nfct)
{
	__u8 ctinfo;
	struct nf_conn *ct = nfct_ct(nfct, &ctinfo);
	if (!ct)
		return false;
	return BPF_CORE_READ(ct, status) & (IPS_SRC_NAT | IPS_DST_NAT);
}

/* reason is the drop reason name, where this kernel has it. */
#define drop_reason_is(reason, name)                                   \
	(bpf_core_enum_value_exists(enum skb_drop_reason, name) &&     \
	 (reason) == bpf_core_enum_value(enum skb_drop_reason, name))

/* A queue emptied wholesale, nearly always a closing socket's (6.7+ says
 * QUEUE_PURGE, 6.14+ SOCKET_CLOSE for some): data the network delivered,
 * not a drop of the network's. Nearly every connection ends with such a
 * free, so it leaves first. */
static __always_inline bool socket_cleanup(__u32 reason)
{
	return drop_reason_is(reason, SKB_DROP_REASON_QUEUE_PURGE) ||
	       drop_reason_is(reason, SKB_DROP_REASON_SOCKET_CLOSE);
}

static __always_inline int on_kfree_skb(struct sk_buff *skb, __u32 reason, bool has_reason)
{
	if (!skb || (has_reason && socket_cleanup(reason)))
		return 0;
	bool nf_drop = has_reason && drop_reason_is(reason, SKB_DROP_REASON_NETFILTER_DROP);
	unsigned long nfct = BPF_CORE_READ(skb, _nfct);
	/* Without a reason (before 5.17, or NOT_SPECIFIED, which many
	 * ordinary frees still use), a free is a drop only for the packet
	 * that was just answered with an error or reset. */
	bool vague = !has_reason ||
		     reason == bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_NOT_SPECIFIED);
	bool by_tuple = !nf_drop && (vague || !ct_translated(nfct));
	struct follow_maps in = {};
	if (by_tuple) {
		in = follow_maps_in_use();
		if (!in.answered && !in.ipvs)
			return 0;
	}
	struct tuple t = {};
	if (!read_skb(&t, skb))
		return 0;
	if (by_tuple) {
		__u8 why = followed_why(&t, in);
		if (!why || (vague && !(why & FOLLOW_ANSWERED)))
			return 0;
	}
	__u32 ns = skb_netns(skb);
	if (!netns_wanted(ns))
		return 0;
	struct event *e = reserve(KIND_DROP, HOOK_KFREE_SKB, VIA_TRACEPOINT);
	if (!e)
		return 0;
	e->pkt = t;
	e->netns = ns;
	e->reason = reason;
	e->has_reason = has_reason;
	/* Conntrack attaches its entry at PREROUTING or OUTPUT (priority
	 * -200): a packet netfilter dropped without one was dropped by a raw
	 * table rule or by conntrack itself (its table full). */
	e->no_ct = nfct == 0;
	/* The entry conntrack gave the packet names its connection: the
	 * join then needs no lookup in the kernel's table, where a new
	 * entry, dropped before it was confirmed, never is (a drop storm of
	 * new connections made two failed lookups a packet). A template
	 * (the raw table's CT target) has no tuples yet. */
	__u8 ctinfo;
	struct nf_conn *ct = nfct_ct(nfct, &ctinfo);
	if (ct && !(BPF_CORE_READ(ct, status) & IPS_TEMPLATE)) {
		read_ct(e, ct);
		e->ctinfo = ctinfo;
		e->netns = ns;
	}
	if (!wanted(e)) {
		bpf_ringbuf_discard(e, 0);
		return 0;
	}
	submit(e);
	return 0;
}

/* skb:kfree_skb: (skb, location) until 5.16, (skb, location, reason, ...) since. */
SEC("raw_tracepoint/kfree_skb")
int tr_drop_tp3(struct bpf_raw_tracepoint_args *ctx)
{
	return on_kfree_skb((struct sk_buff *)ctx->args[0], (__u32)ctx->args[2], true);
}

SEC("raw_tracepoint/kfree_skb")
int tr_drop_tp(struct bpf_raw_tracepoint_args *ctx)
{
	return on_kfree_skb((struct sk_buff *)ctx->args[0], 0, false);
}

/* ---- BPF netfilter tier (6.4+): conntrack as NAT left it ---- */

static __always_inline struct nf_conn *skb_ct(struct sk_buff *skb, __u8 *ctinfo)
{
	return nfct_ct(BPF_CORE_READ(skb, _nfct), ctinfo);
}

/* A new, still unconfirmed entry that NAT translated: seen once per
 * connection, right after the nat hook that translated it. */
static __always_inline void nf_nat_event(struct sk_buff *skb, __u8 hook, __u32 nat_bit, __u8 kind)
{
	/* Almost every packet leaves here, after one plain load. */
	__u8 ctinfo;
	struct nf_conn *ct = nfct_ct(skb->_nfct, &ctinfo);
	if (!ct || ctinfo != IP_CT_NEW)
		return;
	__u32 status = (__u32)BPF_CORE_READ(ct, status);
	if ((status & IPS_CONFIRMED) || !(status & nat_bit))
		return;
	struct event *e = reserve(kind, HOOK_NF_NAT, VIA_NETFILTER);
	if (!e)
		return;
	read_ct(e, ct);
	e->nf_hook = hook;
	e->ctinfo = ctinfo;
	/* The target is what the reply tuple now says. */
	e->to.family = e->reply.family;
	e->to.proto = e->reply.proto;
	if (kind == KIND_DNAT) {
		__builtin_memcpy(e->to.src, e->reply.src, 16);
		__builtin_memcpy(e->to.dst, e->reply.src, 16);
		e->to.sport = e->reply.sport;
		e->to.dport = e->reply.sport;
	} else {
		__builtin_memcpy(e->to.src, e->reply.dst, 16);
		__builtin_memcpy(e->to.dst, e->reply.dst, 16);
		e->to.sport = e->reply.dport;
		e->to.dport = e->reply.dport;
	}
	e->range_flags = NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED;
	finish(e);
}

static __always_inline void reverse_tuple(struct tuple *dst, const struct tuple *src)
{
	__builtin_memcpy(dst->src, src->dst, 16);
	__builtin_memcpy(dst->dst, src->src, 16);
	dst->sport = src->dport;
	dst->dport = src->sport;
	dst->family = src->family;
	dst->proto = src->proto;
}

/* netfilter's IPv6 RST, told from the stack's: nf_send_reset6 attaches
 * the rejected packet's conntrack entry as RELATED (where conntrack runs),
 * and otherwise sends it with the hook's socket: none for a forwarded or
 * incoming packet, the sending socket for one of the host's own. The
 * stack's go out in their connection's entry, on its raw control socket.
 * Both skbs have no owner, unlike IPv4's stack RSTs. */
static __always_inline bool nf_reset6(struct sk_buff *skb, struct sock *state_sk)
{
	__u8 ctinfo;
	struct nf_conn *ct = skb_ct(skb, &ctinfo);
	if (ct)
		return ct_related(ct, ctinfo);
	return !state_sk || state_sk->sk_type == 1 /* SOCK_STREAM */;
}

/* Packets the kernel generates to answer another packet, seen leaving at
 * LOCAL_OUT: a TCP RST netfilter sent (REJECT --reject-with tcp-reset;
 * IPv4's goes without a socket, the stack's on a control socket, and the
 * stack's are seen by their own hook), and ICMP errors (their payload
 * holds the packet they answer). */
static __always_inline void nf_local_out_answer(struct sk_buff *skb, __u32 netns, struct sock *state_sk)
{
	struct tuple t = {};
	const void *l4 = read_skb_l4(&t, skb);
	if (!l4 || !t.family)
		return;
	bool v6 = t.family == AF_INET6;
	__u8 kind = 0, icmp[2] = {};
	if ((cfg_nf_roles & (v6 ? NF_ROLE_RESET6 : NF_ROLE_RESET)) && t.proto == IPPROTO_TCP) {
		__u8 flags = 0;
		bpf_probe_read_kernel(&flags, 1, l4 + 13);
		bool by_nf = v6 ? nf_reset6(skb, state_sk) : !BPF_CORE_READ(skb, sk);
		if ((flags & TCP_FLAG_RST) && by_nf)
			kind = KIND_RESET;
	} else if (!v6 && (cfg_nf_roles & NF_ROLE_ICMP) && t.proto == IPPROTO_ICMP) {
		bpf_probe_read_kernel(icmp, 2, l4);
		/* destination unreachable, time exceeded, parameter problem */
		if (icmp[0] == 3 || icmp[0] == 11 || icmp[0] == 12)
			kind = KIND_REJECT;
	} else if (v6 && (cfg_nf_roles & NF_ROLE_ICMP6) && t.proto == IPPROTO_ICMPV6) {
		bpf_probe_read_kernel(icmp, 2, l4);
		/* ICMPv6 errors are types 1-127; 1-4 are the ones sent for a
		 * packet (unreachable, too big, time exceeded, parameter). */
		if (icmp[0] >= 1 && icmp[0] <= 4)
			kind = KIND_REJECT;
	}
	if (!kind)
		return;
	struct event *e = reserve(kind, family_hook(kind == KIND_RESET ? HOOK_NF_SEND_RESET : HOOK_ICMP_SEND, t.family),
				  VIA_NETFILTER);
	if (!e)
		return;
	e->nf_hook = NF_INET_LOCAL_OUT;
	e->netns = netns;
	if (kind == KIND_RESET) {
		reverse_tuple(&e->pkt, &t);
	} else {
		e->icmp_type = icmp[0];
		e->icmp_code = icmp[1];
		read_packet(&e->pkt, l4 + 8);
	}
	__u8 ctinfo;
	struct nf_conn *ct = skb_ct(skb, &ctinfo);
	if (ct_related(ct, ctinfo)) {
		read_ct(e, ct);
		e->ctinfo = ctinfo;
		e->netns = netns;
	}
	finish(e);
}

/* Whether a packet leaving the host may be an answer to another (an ICMP
 * error, netfilter's RST), told from its skb alone before any of the
 * packet is read: almost every packet leaving the host is a TCP or UDP
 * socket's own. Answers go without a socket (IPv4's RST, and IPv6's for a
 * forwarded or incoming packet), on an ICMP socket, or in the answered
 * connection's entry as RELATED where conntrack runs (nf_reset6). */
static __always_inline bool nf_may_be_answer(struct sk_buff *skb)
{
	struct sock *sk = skb->sk;
	if (!sk)
		return true;
	__u8 ctinfo;
	if (ct_related(nfct_ct(skb->_nfct, &ctinfo), ctinfo))
		return true;
	/* Timewait and request sockets are TCP's, and have no sk_protocol. */
	__u8 state = sk->__sk_common.skc_state;
	if (state == 6 /* TCP_TIME_WAIT */ || state == 12 /* TCP_NEW_SYN_RECV */)
		return false;
	__u16 proto = sk->sk_protocol;
	return proto != IPPROTO_TCP && proto != IPPROTO_UDP;
}

/* PRE_ROUTING and LOCAL_OUT, priority -99: just after DNAT. The context's
 * skb and hook state are trusted pointers, read with plain loads. */
SEC("netfilter")
int tr_nf_dnat(struct bpf_nf_ctx *ctx)
{
	struct sk_buff *skb = ctx->skb;
	__u8 hook = ctx->state->hook;
	if (cfg_nf_roles & NF_ROLE_NAT)
		nf_nat_event(skb, hook, IPS_DST_NAT, KIND_DNAT);
	if (hook == NF_INET_LOCAL_OUT &&
	    (cfg_nf_roles & (NF_ROLE_RESET | NF_ROLE_ICMP | NF_ROLE_RESET6 | NF_ROLE_ICMP6)) &&
	    nf_may_be_answer(skb))
		nf_local_out_answer(skb, ctx->state->net->ns.inum, ctx->state->sk);
	return NF_ACCEPT;
}

/* POST_ROUTING and LOCAL_IN, priority 101: just after SNAT. */
SEC("netfilter")
int tr_nf_snat(struct bpf_nf_ctx *ctx)
{
	if (cfg_nf_roles & NF_ROLE_NAT)
		nf_nat_event(ctx->skb, ctx->state->hook, IPS_SRC_NAT, KIND_SNAT);
	return NF_ACCEPT;
}
