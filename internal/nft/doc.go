// Package nft attributes a netfilter decision to the native nftables rule
// that made it: kube-proxy's nftables mode (`table ip kube-proxy`), portmap's
// nftables backend (`table ip cni_hostport`) and any other table iptables-nft
// did not create. It is the second rule source beside internal/rules (the
// iptables one); both answer with the same rules.KernelAction in and a rule
// out, so a verdict never cares which one decided.
//
// The ruleset is read from libnftables' JSON (`nft -j list ruleset`) rather
// than over netlink with github.com/google/nftables v0.3.0. The JSON is the
// schema nft itself documents and keeps stable (json_schema_version 1); it
// carries what attribution needs already decoded: verdict maps with their
// verdicts, concatenated keys split into their fields, interval elements as
// ranges and prefixes, anonymous sets inline, and rule and element comments.
// The netlink library leaves vmap verdicts and concatenated keys raw on
// read, misreports a vmap's key type, skips expressions it does not know
// without saying so, and passes NAT arguments through registers that would
// have to be traced back by hand. The rule text users see is taken from
// `nft -a list ruleset` by handle, so a rule is shown exactly as nft prints
// it, never as this package would re-render it.
//
// Evaluate walks the base chains of a hook the way nft_do_chain does: jump,
// goto, return, verdict maps and the base chain's policy. What it cannot
// decide (numgen, an interface name, an expression it does not model) is
// explored both ways; Attribute then keeps the outcomes that agree with
// what the kernel did (the DNAT address it chose settles numgen, as it
// settles iptables' statistic match), and says the answer is uncertain,
// and why, whenever more than one rule or none could have done it.
package nft
