package audit

import (
	"fmt"
	"net/netip"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// VerdictStaleHostPort is the audit's own finding for a hostPort rule
// left behind: no live flow has it, since the rule decides nothing until
// a connection meets it, and then the flow's verdict says where it went.
const VerdictStaleHostPort = "stale-hostport"

// podAddrs are the pods (not hostNetwork) by their addresses.
type podAddrs map[netip.Addr]trace.Pod

func podsByAddr(snap *trace.Snapshot) podAddrs {
	out := podAddrs{}
	for _, p := range snap.Pods {
		if p.HostNetwork {
			continue
		}
		for _, s := range p.IPs {
			if a, err := netip.ParseAddr(s); err == nil {
				out[a.Unmap()] = p
			}
		}
	}
	return out
}

// staleHostPorts finds portmap's DNAT rules (iptables CNI-DN-* chains,
// nftables cni_hostport tables) whose target no pod holds, or a pod holds
// that declares no hostPort: what a failed or skipped CNI DEL leaves.
// Connections to the hostPort then go to an address nothing answers, or
// to whichever pod got the address next.
func staleHostPorts(snap *trace.Snapshot, env enrich.Env) []Finding {
	pods := podsByAddr(snap)
	var out []Finding
	for _, fam := range []rules.Family{rules.IPv4, rules.IPv6} {
		rs := env.Ruleset(fam)
		if rs == nil || rs.Tables["nat"] == nil {
			continue
		}
		for _, name := range rs.Tables["nat"].Order {
			if !rules.IsPortmapChain(name) {
				continue
			}
			for _, r := range rs.Tables["nat"].Chains[name].Rules {
				if r.Target.Kind != rules.TargetDNAT || len(r.Target.NAT) == 0 {
					continue
				}
				if f, ok := staleIPTables(rs, r, fam, pods); ok {
					out = append(out, f)
				}
			}
		}
	}
	return append(out, staleNFT(env, pods)...)
}

func staleIPTables(rs *rules.Ruleset, r *rules.Rule, fam rules.Family, pods podAddrs) (Finding, bool) {
	to := r.Target.NAT[0].MinAddr
	why, stale := staleTarget(to, pods)
	if !stale {
		return Finding{}, false
	}
	rule := &trace.Rule{Table: "nat", Chain: r.Chain, Text: r.Text}
	save := "iptables-save"
	if fam == rules.IPv6 {
		rule.Family, save = "ip6", "ip6tables-save"
	}
	fix := fmt.Sprintf("delete the chain and its jump: `%s -t nat | grep %s` lists them", save, r.Chain)
	if o, ok := rs.PortmapOwnerOf(r); ok {
		rule.EntryChain = rules.PortmapDNATChain
		rule.Owner = &trace.Owner{ContainerID: o.ContainerID}
		fix = fmt.Sprintf("delete chain %s and the %s rule that jumps to it (sandbox %s)", r.Chain, rules.PortmapDNATChain, o.ContainerID)
	}
	return staleFinding(rule, to, why, fix), true
}

func staleNFT(env enrich.Env, pods podAddrs) []Finding {
	rs, err := env.NFTRuleset()
	if err != nil || rs == nil {
		return nil
	}
	var out []Finding
	for _, t := range rs.Tables {
		if t.Name != "cni_hostport" {
			continue
		}
		for _, c := range t.Order {
			for _, r := range c.Rules {
				for _, to := range r.DNATAddrs() {
					why, stale := staleTarget(to, pods)
					if !stale {
						continue
					}
					rule := &trace.Rule{Backend: trace.BackendNFTables, Family: t.Family, Table: t.Name, Chain: c.Name, Handle: r.Handle, Text: r.Text,
						Owner: &trace.Owner{ContainerID: r.Comment}}
					fix := fmt.Sprintf("`nft delete rule %s %s %s handle %d` and the sandbox's other rules (comment %q)", t.Family, t.Name, c.Name, r.Handle, r.Comment)
					out = append(out, staleFinding(rule, to, why, fix))
				}
			}
		}
	}
	return out
}

// staleTarget says why a hostPort DNAT target is stale, if it is.
func staleTarget(to netip.Addr, pods podAddrs) (string, bool) {
	p, ok := pods[to.Unmap()]
	switch {
	case !ok:
		return fmt.Sprintf("no pod holds %s", to), true
	case len(p.HostPorts) == 0:
		return fmt.Sprintf("%s is now pod %s/%s's, which declares no hostPort", to, p.Namespace, p.Name), true
	}
	return "", false
}

func staleFinding(rule *trace.Rule, to netip.Addr, why, fix string) Finding {
	return Finding{
		Severity: Problem, Verdict: VerdictStaleHostPort, Proto: "any", To: fmt.Sprintf("hostPort rule to %s", to),
		From: []string{"any client of the hostPort"}, Rule: rule,
		Steps: []string{fmt.Sprintf("%s %s: `%s`", rule.Table, rule.Chain, rule.Text)},
		Explanation: fmt.Sprintf("stale hostPort: portmap's rule `%s` (table %s, chain %s) still DNATs to %s, but %s: the CNI DEL that should have removed it failed or never ran, "+
			"so connections to its hostPort go to an address nothing answers, or to whichever pod got the address next. Fix: %s.", rule.Text, rule.Table, rule.Chain, to, why, fix),
	}
}
