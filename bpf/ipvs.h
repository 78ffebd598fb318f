/* IPVS types, declared here because the build machine's kernel has no IPVS
 * and so its vmlinux.h lacks them. Only the fields the programs read are
 * listed: preserve_access_index makes every access a CO-RE relocation that
 * libbpf/cilium resolve against the ip_vs module's BTF at load time, so the
 * order and the missing fields do not matter. */
#pragma once

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct netns_ipvs {
	struct net *net;
};

struct ip_vs_conn_param {
	struct netns_ipvs *ipvs;
	const union nf_inet_addr *caddr;
	const union nf_inet_addr *vaddr;
	__be16 cport;
	__be16 vport;
	__u16 protocol;
	__u16 af;
};

struct ip_vs_service {
	__u16 af;
	__u16 protocol;
	union nf_inet_addr addr;
	__be16 port;
	__u32 fwmark;
	struct netns_ipvs *ipvs;
};

#pragma clang attribute pop

/* include/uapi/linux/ip_vs.h */
#define IP_VS_CONN_F_FWD_MASK 0x0007
#define IP_VS_CONN_F_TEMPLATE 0x1000
