package rules

import (
	"crypto/sha512"
	"encoding/hex"
	"strings"
)

// Names the CNI portmap plugin (iptables backend) gives its chains.
const (
	PortmapDNATChain   = "CNI-HOSTPORT-DNAT"
	PortmapMasqChain   = "CNI-HOSTPORT-MASQ"
	PortmapChainPrefix = "CNI-DN-"
	// portmapChainLen is the plugin's maxChainLength: the whole name,
	// prefix included, is cut to 28 characters (iptables allows 28 usable
	// bytes in a chain name).
	portmapChainLen = 28
)

// PortmapChainName is the per-sandbox chain the portmap plugin creates:
// "CNI-DN-" + hex(sha512(netName + containerID)), the whole name cut to 28
// characters, as utils.MustFormatChainNameWithPrefix(netName, id, "DN-")
// in containernetworking/plugins computes it.
func PortmapChainName(netName, containerID string) string {
	// Attribution asks for it on every walk through a portmap rule: one
	// allocation, the name, when the input fits the stack buffer.
	var in [256]byte
	sum := sha512.Sum512(append(append(in[:0], netName...), containerID...))
	var name [portmapChainLen + 1]byte
	n := copy(name[:], PortmapChainPrefix)
	hex.Encode(name[n:], sum[:(len(name)-n)/2])
	return string(name[:portmapChainLen])
}

// IsPortmapChain reports whether chain is a portmap per-sandbox DNAT chain.
func IsPortmapChain(chain string) bool {
	return strings.HasPrefix(chain, PortmapChainPrefix) && len(chain) == portmapChainLen
}

// ParsePortmapComment extracts the network name and sandbox container id
// from a portmap comment, `dnat name: "NET" id: "ID"`. The plugin cuts
// comments longer than 255 bytes to 253 and appends "..." (iptables itself
// refuses more than 255, so such a rule only survives from other writers
// that trim a little differently): truncated then says the id (or name) is
// only a prefix.
func ParsePortmapComment(comment string) (netName, containerID string, truncated, ok bool) {
	rest, found := strings.CutPrefix(comment, `dnat name: "`)
	if !found {
		return "", "", false, false
	}
	if strings.HasSuffix(rest, "...") && len(comment) >= 253 {
		truncated = true
		rest = strings.TrimSuffix(rest, "...")
	}
	netName, rest, found = strings.Cut(rest, `" id: "`)
	if !found {
		if truncated {
			return netName, "", true, true
		}
		return "", "", false, false
	}
	containerID, found = strings.CutSuffix(rest, `"`)
	if !found && !truncated {
		return "", "", false, false
	}
	return netName, containerID, truncated, true
}

// PortmapOwner ties a portmap chain to the CNI network and sandbox
// container that own it.
type PortmapOwner struct {
	Chain       string
	Network     string
	ContainerID string
	// Truncated: the comment was cut by the plugin, ContainerID is a prefix.
	Truncated bool
	// Verified: PortmapChainName(Network, ContainerID) == Chain. False for
	// a truncated id, or a comment that does not belong to the chain
	// (hand-edited rules), which callers should say.
	Verified bool
	// Jump is the CNI-HOSTPORT-DNAT rule that leads to Chain, whose comment
	// carries the id; nil when the id came from the rule itself.
	Jump *Rule
}

// PortmapJump finds the CNI-HOSTPORT-DNAT rule that jumps to chain in the
// nat table; the first one if the sandbox has several (one per protocol
// or per 15 ports).
func (rs *Ruleset) PortmapJump(chain string) *Rule {
	c := rs.Chain("nat", PortmapDNATChain)
	if c == nil {
		return nil
	}
	for _, r := range c.Rules {
		if r.Target.Kind == TargetJump && r.Target.Chain == chain {
			return r
		}
	}
	return nil
}

// PortmapOwnerOf returns the owner of a rule that is in a CNI-DN-* chain,
// carries a portmap comment, or jumps to a CNI-DN-* chain. The id comes
// from the rule's own comment when it has one, else from the jump rule
// into its chain (CNI-DN rules themselves carry no comment).
func (rs *Ruleset) PortmapOwnerOf(r *Rule) (*PortmapOwner, bool) {
	if r == nil {
		return nil, false
	}
	chain := ""
	switch {
	case IsPortmapChain(r.Chain):
		chain = r.Chain
	case r.Target.Kind == TargetJump && IsPortmapChain(r.Target.Chain):
		chain = r.Target.Chain
	}
	if net, id, trunc, ok := ParsePortmapComment(r.Comment); ok {
		return newOwner(chain, net, id, trunc, nil), true
	}
	if chain == "" {
		return nil, false
	}
	return rs.PortmapChainOwner(chain)
}

// PortmapChainOwner returns the owner of a CNI-DN-* chain from the comment
// of the jump rule into it.
func (rs *Ruleset) PortmapChainOwner(chain string) (*PortmapOwner, bool) {
	j := rs.PortmapJump(chain)
	if j == nil {
		return nil, false
	}
	net, id, trunc, ok := ParsePortmapComment(j.Comment)
	if !ok {
		return nil, false
	}
	return newOwner(chain, net, id, trunc, j), true
}

func newOwner(chain, net, id string, trunc bool, jump *Rule) *PortmapOwner {
	o := &PortmapOwner{Chain: chain, Network: net, ContainerID: id, Truncated: trunc, Jump: jump}
	if chain == "" {
		o.Chain = PortmapChainName(net, id)
	}
	o.Verified = !trunc && PortmapChainName(net, id) == o.Chain
	return o
}

// PortmapOwnerOfPath returns the owner of the portmap chain on an
// evaluation path, taking the id from the jump rule the walk went through.
func (rs *Ruleset) PortmapOwnerOfPath(o *Outcome) (*PortmapOwner, bool) {
	for i := len(o.Path) - 1; i >= 0; i-- {
		s := o.Path[i]
		if !IsPortmapChain(s.Chain) {
			continue
		}
		if s.Via != nil {
			if net, id, trunc, ok := ParsePortmapComment(s.Via.Comment); ok {
				return newOwner(s.Chain, net, id, trunc, s.Via), true
			}
		}
		return rs.PortmapChainOwner(s.Chain)
	}
	if o.Rule != nil {
		return rs.PortmapOwnerOf(o.Rule)
	}
	return nil, false
}
