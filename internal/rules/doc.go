// Package rules attributes a netfilter decision to the iptables rule that
// made it.
//
// When the kernel reports that a conntrack entry was DNAT'd, that an ICMP
// port-unreachable was sent, or that a packet was dropped by netfilter, the
// tracer must name the exact rule, the chain path that led to it and the pod
// that owns it. This package does that from the text iptables-save prints
// (iptables-legacy and iptables-nft print the same syntax):
//
//   - ParseSave turns iptables-save output into a Ruleset (tables, chains
//     with policies, rules in order with their verbatim "-A" text, parsed
//     into matches and a target).
//   - Ruleset.Evaluate walks a base chain the way ipt_do_table does:
//     jumps, gotos, RETURN, MARK changes and the chain policy. Matches it
//     cannot decide (an unknown module, a set it has not been given, an
//     interface it does not know) are explored both ways; when the two
//     branches end at different rules the Result is uncertain and says why,
//     so the tracer never gives a confident wrong answer.
//   - Attribute checks that the rule found agrees with what the kernel
//     reported (the DNAT range contains the chosen address, the REJECT type
//     matches the ICMP sent, ...).
//   - The portmap helpers tie a CNI-DN-* chain to its CNI network and
//     sandbox container id, and back.
//   - ParseIPSetSave and MemNode provide the node state the evaluator needs
//     (LOCAL addresses, ipset membership) from `ip route show table local`
//     style prefixes and `ipset save` output.
//
// Native nftables tables, such as the `ip cni_hostport` table the portmap
// plugin (1.6 and later, "backend": "nftables") and the `ip kube-proxy`
// table kube-proxy's nftables mode create, are not iptables rules:
// iptables-nft only prints its own xtables-compatible tables. They are the
// other rule source, internal/nft, which takes the same Packet and
// KernelAction; internal/enrich asks both and keeps the one whose chain ran
// first at the hook.
package rules
