//go:build ignore

/* Batched conntrack lookups: one BPF_PROG_TEST_RUN of ct_lookup answers
 * up to CT_QUERY_SLOTS tuples through the kernel's conntrack kfuncs, the
 * work of as many netlink GETs, each of which costs the kernel a
 * page-sized reply. The queries are the run's packet data and the
 * answers are written over them; the lookup is in the network namespace
 * of the thread that starts the run. */

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

#define AF_INET 2
#define CT_QUERY_SLOTS 32
#define BPF_F_CURRENT_NETNS (-1)
#define CT_DIR_REPLY 1

/* struct bpf_ct_opts as 5.18-6.x have it, before it carried a zone;
 * newer kernels take it too. Its own type, not vmlinux.h's: the kernel
 * may not have the type in vmlinux's BTF (nf_conntrack is a module), and
 * the fields set here must not be CO-RE relocations. */
struct bpf_ct_opts___v1 {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u8 reserved[2];
};

extern struct nf_conn *bpf_xdp_ct_lookup(struct xdp_md *ctx, struct bpf_sock_tuple *tuple,
					 __u32 tuple_size, struct bpf_ct_opts___v1 *opts,
					 __u32 opts_size) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;

struct ct_tuple {
	__u32 saddr[4];
	__u32 daddr[4];
	__be16 sport;
	__be16 dport;
};

/* One query and its answer (96 bytes). In: family, proto, tuple. Out:
 * found, and when found the entry: tuple becomes its original tuple. */
struct ct_query {
	__u8 family;
	__u8 proto;
	__u8 found;
	__u8 tcp_state;
	__u16 zone;
	__u16 pad0;
	__u32 status;
	__u32 mark;
	__u32 pad1;
	struct ct_tuple tuple;
	struct ct_tuple reply;
	__u32 pad2;
};

/* Keeps struct ct_query in the object's BTF for bpf2go. */
const struct ct_query *unused_ct_query __attribute__((unused));

static __always_inline void put_tuple(struct ct_tuple *dst, const struct nf_conntrack_tuple *src)
{
	for (int i = 0; i < 4; i++) {
		dst->saddr[i] = src->src.u3.all[i];
		dst->daddr[i] = src->dst.u3.all[i];
	}
	dst->sport = src->src.u.all;
	dst->dport = src->dst.u.all;
}

static __always_inline void answer(struct ct_query *q, struct nf_conn *ct)
{
	q->found = 1;
	q->status = ct->status;
	if (bpf_core_field_exists(ct->mark))
		q->mark = ct->mark;
	if (bpf_core_field_exists(ct->zone))
		q->zone = ct->zone.id;
	if (q->proto == IPPROTO_TCP)
		q->tcp_state = ct->proto.tcp.state;
	put_tuple(&q->tuple, &ct->tuplehash[0].tuple);
	put_tuple(&q->reply, &ct->tuplehash[CT_DIR_REPLY].tuple);
}

SEC("xdp")
int ct_lookup(struct xdp_md *ctx)
{
	for (__u32 i = 0; i < CT_QUERY_SLOTS; i++) {
		struct ct_query *q = (void *)(long)ctx->data + i * sizeof(*q);
		if ((void *)(q + 1) > (void *)(long)ctx->data_end)
			break;
		struct bpf_ct_opts___v1 opts = {.netns_id = BPF_F_CURRENT_NETNS, .l4proto = q->proto};
		struct bpf_sock_tuple tup = {};
		__u32 size;
		if (q->family == AF_INET) {
			tup.ipv4.saddr = q->tuple.saddr[0];
			tup.ipv4.daddr = q->tuple.daddr[0];
			tup.ipv4.sport = q->tuple.sport;
			tup.ipv4.dport = q->tuple.dport;
			size = sizeof(tup.ipv4);
		} else {
			for (int j = 0; j < 4; j++) {
				tup.ipv6.saddr[j] = q->tuple.saddr[j];
				tup.ipv6.daddr[j] = q->tuple.daddr[j];
			}
			tup.ipv6.sport = q->tuple.sport;
			tup.ipv6.dport = q->tuple.dport;
			size = sizeof(tup.ipv6);
		}
		q->found = 0;
		struct nf_conn *ct = bpf_xdp_ct_lookup(ctx, &tup, size, &opts, sizeof(opts));
		if (!ct)
			continue;
		/* The call may not keep packet pointers valid: look again. */
		q = (void *)(long)ctx->data + i * sizeof(*q);
		if ((void *)(q + 1) <= (void *)(long)ctx->data_end)
			answer(q, ct);
		bpf_ct_release(ct);
	}
	return XDP_PASS;
}
