package lab

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// nftProof proves one attempt on a node whose kube-proxy and portmap write
// native nftables tables. Their rules have no counters (neither program
// writes a counter statement on a rule that decides, and the lab writes
// their rules exactly as they do), so the deciding rule is singled out by
// what the node did: the DNAT target conntrack shows, the ICMP errors and
// resets its SNMP counters show, and the ruleset's own elements, which
// say what each address and port can meet. Each proof says why that
// leaves one rule (RuleHit.ProvenBy). Only the lab's own policy table
// counts packets.
type nftProof struct {
	c       *cluster
	e       *Expectation
	l       *nftListing
	fam     string    // the attempt's nftables family: ip or ip6
	kp      *nftTable // kube-proxy's table of that family
	counted []*RuleHit
	missing []string
}

// labPolicyTable is the lab's own native policy table (policyNFT).
const labPolicyTable = "lab-policy"

func (c *cluster) proveNFT(e *Expectation, before, after counters) []string {
	fam := familyOf(e.Dst)
	pf := &nftProof{c: c, e: e, l: after.nft, fam: fam, kp: after.nft.table(fam, "kube-proxy"), counted: countedNFT(before.nft, after.nft)}
	switch e.Mechanism {
	case NoDecision:
		pf.noDecision()
	case ServiceDNAT:
		pf.serviceDNAT()
	case HostportDNAT:
		pf.hostportDNAT()
	case ClusterIPReject:
		pf.clusterIPReject()
	case ClusterIPDrop:
		pf.clusterIPDrop()
	case NoEndpointReject:
		pf.noEndpoint("goto reject-chain")
	case NoEndpointDrop:
		pf.noEndpoint("drop")
	case PolicyReject:
		pf.policy("reject")
	case PolicyDrop:
		pf.policy("drop")
	case StackReset:
		pf.stackReset()
	default:
		pf.need(false, "mechanism %q has no proof on an nftables node", e.Mechanism)
	}
	return pf.missing
}

func (pf *nftProof) need(ok bool, what string, args ...any) {
	if !ok {
		pf.missing = append(pf.missing, fmt.Sprintf(what, args...))
	}
}

// countedNFT lists the rules whose counters went up between a and b.
func countedNFT(a, b *nftListing) []*RuleHit {
	before := map[string]uint64{}
	for _, r := range a.rules(func(r *nftRule) bool { return r.counter }) {
		before[r.key()] = r.packets
	}
	var out []*RuleHit
	for _, r := range b.rules(func(r *nftRule) bool { return r.counter }) {
		if r.packets > before[r.key()] {
			out = append(out, r.hit(r.packets-before[r.key()]))
		}
	}
	return out
}

func describeNFTHits(hs []*RuleHit) string {
	if len(hs) == 0 {
		return "nothing"
	}
	var parts []string
	for _, h := range hs {
		parts = append(parts, fmt.Sprintf("%s %s %q", h.Table, h.Chain, h.Text))
	}
	return strings.Join(parts, ", ")
}

// translated is where conntrack says the connection went, when that is
// not where the client sent it.
func (pf *nftProof) translated() (string, bool) {
	ct := pf.e.Proof.Conntrack
	if ct == nil || ct.ReplySrc == pf.e.Dst {
		return "", false
	}
	return ct.ReplySrc, true
}

func (pf *nftProof) noDecision() {
	pf.need(len(pf.counted) == 0, "no rule of the lab's policy counted it (counted: %s)", describeNFTHits(pf.counted))
	_, nat := pf.translated()
	pf.need(!nat, "conntrack -L shows it untranslated (%s)", describeCT(pf.e.Proof.Conntrack))
}

func (pf *nftProof) stackReset() {
	pf.noDecision()
	pf.need(pf.e.Proof.NodeResets > 0, "the node's TCP stack sent a reset (Tcp OutRsts)")
}

// policy: the lab's own policy table counts its rules, so the rule whose
// counter the attempt raised is the one that decided.
func (pf *nftProof) policy(verdict string) {
	var found []*RuleHit
	for _, h := range pf.counted {
		if h.Table == labPolicyTable && strings.Contains(h.Text+" ", " "+verdict+" ") {
			found = append(found, h)
		}
	}
	pf.need(len(found) == 1, "exactly one %s rule of table %s counted the attempt (counted: %s)", verdict, labPolicyTable, describeNFTHits(pf.counted))
	if len(found) == 1 {
		pf.e.Proof.Rule = found[0]
	}
}

// dnatsTo reports whether a rule's DNAT can go to target: `dnat to
// IP:PORT`, or kube-proxy's numgen map holding `IP . PORT`.
func dnatsTo(text, target string) bool {
	if strings.Contains(text+" ", " dnat to "+target+" ") {
		return true
	}
	if !strings.Contains(text, " dnat ") || !strings.Contains(text, " numgen ") {
		return false
	}
	pair := ": " + hostOf(target) + " . " + strconv.Itoa(portOf(target))
	return strings.Contains(text, pair+",") || strings.Contains(text, pair+" }")
}

// hostportDNAT: conntrack's DNAT target is the hostPort pod's, and of the
// rules that translate there only portmap's can have met this packet:
// kube-proxy's service chains are reached only from its map elements, and
// the element for the client's destination, if any, leads to none that
// goes there (the hostPort pod may be another Service's endpoint); no
// other table translates there.
func (pf *nftProof) hostportDNAT() {
	target, ok := pf.translated()
	pf.need(ok, "conntrack -L shows the connection DNAT'd (%s)", describeCT(pf.e.Proof.Conntrack))
	if !ok {
		return
	}
	pm := pf.l.table(pf.fam, "cni_hostport")
	found := pf.l.rules(func(r *nftRule) bool { return r.chain.table == pm && dnatsTo(r.text, target) })
	others := pf.l.rules(func(r *nftRule) bool { return r.chain.table != pm && r.chain.table != pf.kp && dnatsTo(r.text, target) })
	var kube []*nftRule
	if _, el := pf.element("service-ips", "service-nodeports"); el != nil {
		for _, ch := range pf.reached(verdictChain(el.value)) {
			for _, r := range ch.rules {
				if dnatsTo(r.text, target) {
					kube = append(kube, r)
				}
			}
		}
	}
	pf.need(len(found) == 1, "exactly one rule of table cni_hostport DNATs to %s (found %d)", target, len(found))
	pf.need(len(kube) == 0 && len(others) == 0, "no other rule that can meet the packet DNATs to %s (kube-proxy's: %d, other tables': %d)", target, len(kube), len(others))
	if len(found) != 1 {
		return
	}
	h := found[0].hit(0)
	h.ProvenBy = fmt.Sprintf("conntrack -L: DNAT to %s, which of the rules that can meet this packet only this one translates to", target)
	pf.e.Proof.Rule = h
	pf.e.Proof.Owner = pf.c.podBySandbox(found[0].comment())
	pf.need(pf.e.Proof.Owner != "", "the rule's comment %q is the sandbox id of a lab pod", found[0].comment())
}

func (c *cluster) podBySandbox(id string) string {
	for _, p := range c.pods {
		if id != "" && p.sandboxID == id {
			return p.namespace + "/" + p.name
		}
	}
	return ""
}

// familyOf is the nftables family of a destination ("IP", "IP:PORT",
// "[IP]:PORT"): ip6 for IPv6, else ip.
func familyOf(dst string) string {
	if strings.Contains(hostOf(dst), ":") {
		return "ip6"
	}
	return "ip"
}

func isICMP(proto string) bool { return proto == "icmp" || proto == "icmpv6" }

// dialled is the kube-proxy map keys of the client's destination:
// "IP . PROTO . PORT" and "PROTO . PORT" (ICMP has no port: no key).
func (pf *nftProof) dialled() (ipKey, portKey string, ok bool) {
	if isICMP(pf.e.Proto) {
		return "", "", false
	}
	port := strconv.Itoa(portOf(pf.e.Dst))
	return hostOf(pf.e.Dst) + " . " + pf.e.Proto + " . " + port, pf.e.Proto + " . " + port, true
}

// element finds the client's destination in kube-proxy's address map
// ipMap or, for an address of @nodeport-ips, in its NodePort map.
func (pf *nftProof) element(ipMap, portMap string) (string, *nftElem) {
	ipKey, portKey, ok := pf.dialled()
	if !ok {
		return "", nil
	}
	if el := pf.kp.elem(ipMap, ipKey); el != nil {
		return ipMap, el
	}
	if pf.kp.elem("nodeport-ips", hostOf(pf.e.Dst)) != nil {
		if el := pf.kp.elem(portMap, portKey); el != nil {
			return portMap, el
		}
	}
	return "", nil
}

// serviceDNAT: conntrack's DNAT target, and the element of service-ips
// (or service-nodeports) for the client's destination, whose chains hold
// one DNAT that can reach that target; no other table translates there.
func (pf *nftProof) serviceDNAT() {
	target, ok := pf.translated()
	pf.need(ok, "conntrack -L shows the connection DNAT'd (%s)", describeCT(pf.e.Proof.Conntrack))
	mapName, el := pf.element("service-ips", "service-nodeports")
	pf.need(el != nil, "kube-proxy's service-ips or service-nodeports has an element for %s", pf.e.Dst)
	if !ok || el == nil {
		return
	}
	var found []*nftRule
	for _, ch := range pf.reached(verdictChain(el.value)) {
		for _, r := range ch.rules {
			if dnatsTo(r.text, target) {
				found = append(found, r)
			}
		}
	}
	pf.need(len(found) == 1, "exactly one DNAT to %s in the chains %s's element %s leads to (found %d)", target, mapName, el.key, len(found))
	others := pf.l.rules(func(r *nftRule) bool { return r.chain.table != pf.kp && dnatsTo(r.text, target) })
	pf.need(len(others) == 0, "no rule of another table DNATs to %s (found %d)", target, len(others))
	if len(found) != 1 {
		return
	}
	h := found[0].hit(0)
	h.Element = &ElementHit{Map: mapName, Key: el.key, Comment: el.comment}
	h.ProvenBy = fmt.Sprintf("conntrack -L: DNAT to %s; kube-proxy's %s sends %s to %s, where this is the only DNAT that can go there, and no other table translates to it",
		target, mapName, el.key, verdictChain(el.value))
	pf.e.Proof.Rule = h
}

// verdictChain is the chain of a "goto X" or "jump X" verdict.
func verdictChain(v string) string {
	f := strings.Fields(v)
	if len(f) == 2 && (f[0] == "goto" || f[0] == "jump") {
		return f[1]
	}
	return ""
}

// reached is chain and every chain of kube-proxy's table its rules jump
// or go to, transitively.
func (pf *nftProof) reached(chain string) []*nftChain {
	var out []*nftChain
	seen := map[string]bool{}
	queue := []string{chain}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		ch := pf.kp.chain(name)
		if ch == nil || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, ch)
		for _, r := range ch.rules {
			f := strings.Fields(r.text)
			for i := 0; i+1 < len(f); i++ {
				if f[i] == "goto" || f[i] == "jump" {
					queue = append(queue, f[i+1])
				}
			}
		}
	}
	return out
}

// kpRule is the rule of kube-proxy's chain whose text starts with prefix.
func (pf *nftProof) kpRule(chain, prefix string) *nftRule {
	for _, r := range pf.kp.chain(chain).rulesOrNil() {
		if strings.HasPrefix(r.text, prefix) {
			return r
		}
	}
	return nil
}

func (c *nftChain) rulesOrNil() []*nftRule {
	if c == nil {
		return nil
	}
	return c.rules
}

// foreign lists the rules outside kube-proxy's table whose text has word.
func (pf *nftProof) foreign(word string) []*nftRule {
	return pf.l.rules(func(r *nftRule) bool {
		return r.chain.table != pf.kp && pf.sees(r.chain.table) && strings.Contains(" "+r.text+" ", " "+word+" ")
	})
}

// sees says the table sees the attempt's packets: a table of its family
// or an inet one.
func (pf *nftProof) sees(t *nftTable) bool { return t.family == pf.fam || t.family == "inet" }

// clusterIPReject: the node sent an ICMP error for a ClusterIP's address.
// kube-proxy's table rejects in two places: reject-chain, reached only
// from an element of no-endpoint-services or -nodeports, and
// cluster-ips-check's `ip daddr @cluster-ips reject`. The destination is
// in @cluster-ips, and its protocol and port are in neither service-ips
// (no DNAT took it away) nor no-endpoint-services (reject-chain never saw
// it: ICMP has no such key at all), and no other table rejects: so
// cluster-ips-check's rule sent the error.
func (pf *nftProof) clusterIPReject() {
	p := &pf.e.Proof
	pf.need(p.NodeUnreach > 0, "the node sent an ICMP destination unreachable")
	pf.need(isICMP(pf.e.Proto) || p.Conntrack == nil, "no conntrack entry was confirmed (%s)", describeCT(p.Conntrack))
	pf.need(pf.kp.elem("cluster-ips", hostOf(pf.e.Dst)) != nil, "%s is in kube-proxy's @cluster-ips", hostOf(pf.e.Dst))
	if ipKey, _, ok := pf.dialled(); ok {
		pf.need(pf.kp.elem("service-ips", ipKey) == nil && pf.kp.elem("no-endpoint-services", ipKey) == nil,
			"%s is in neither service-ips nor no-endpoint-services", ipKey)
	}
	pf.need(len(pf.icmpRejects()) == 0, "no other table has a rule that rejects with an ICMP error")
	r := pf.kpRule("cluster-ips-check", pf.fam+" daddr @cluster-ips reject")
	pf.need(r != nil, "kube-proxy's cluster-ips-check has its reject rule")
	if r != nil {
		h := r.hit(0)
		h.ProvenBy = "the node sent ICMP port unreachable for an address in @cluster-ips whose protocol and port no element of service-ips or no-endpoint-services has: only cluster-ips-check rejects such a packet"
		p.Rule = h
	}
}

// clusterIPDrop: the connection timed out with no ICMP error and no
// reset, to an address inside the service CIDR of cluster-ips-check's
// drop rule that is not in @cluster-ips, and no other rule drops: that
// rule dropped it.
func (pf *nftProof) clusterIPDrop() {
	p := &pf.e.Proof
	pf.need(p.NodeUnreach == 0 && p.NodeResets == 0, "the node sent no ICMP error and no reset")
	pf.need(p.Conntrack == nil, "no conntrack entry was confirmed (%s)", describeCT(p.Conntrack))
	ip := hostOf(pf.e.Dst)
	pf.need(pf.kp.elem("cluster-ips", ip) == nil, "%s is not in @cluster-ips", ip)
	r := pf.cidrDrop()
	pf.need(r != nil && inCIDR(r.textOrEmpty(), ip), "%s is in the service CIDR of cluster-ips-check's drop rule", ip)
	pf.need(len(pf.foreign("drop")) == 0, "no other table has a drop rule")
	if r != nil {
		h := r.hit(0)
		h.ProvenBy = "a timeout with no ICMP error or reset, to an address of the service CIDR that is no ClusterIP: only cluster-ips-check's drop applies"
		p.Rule = h
	}
}

// cidrDrop is cluster-ips-check's drop of the service CIDR, which nft
// lists as `ip daddr 10.96.0.0/12 drop` (`ip6 daddr fd96::/108 drop`;
// kube-proxy writes it in braces).
func (pf *nftProof) cidrDrop() *nftRule {
	for _, r := range pf.kp.chain("cluster-ips-check").rulesOrNil() {
		if strings.HasPrefix(r.text, pf.fam+" daddr ") && strings.Contains(r.text, " drop") {
			return r
		}
	}
	return nil
}

// inCIDR reports whether ip is in the prefix of "ip daddr P drop ..." (or
// "ip6 daddr P drop ...").
func inCIDR(text, ip string) bool {
	_, rest, _ := strings.Cut(text, " daddr ")
	f := strings.Fields(strings.NewReplacer("{", " ", "}", " ").Replace(rest))
	if len(f) == 0 {
		return false
	}
	pfx, err := netip.ParsePrefix(f[0])
	a, err2 := netip.ParseAddr(ip)
	return err == nil && err2 == nil && pfx.Contains(a)
}

// noEndpoint: an element of no-endpoint-services (or -nodeports, for a
// NodePort) for the client's destination has verdict want. For a reject,
// cluster-ips-check would have rejected a ClusterIP the same way, so the
// effects cannot tell them apart; what does is the order nft lists: every
// kube-proxy filter chain jumps to service-endpoints-check before
// cluster-ips-check, and a reject ends the packet's walk, so
// cluster-ips-check never sees it. For a drop there is no second
// candidate: cluster-ips-check drops only addresses of the service CIDR
// that are no ClusterIP.
func (pf *nftProof) noEndpoint(want string) {
	p := &pf.e.Proof
	mapName, el := pf.element("no-endpoint-services", "no-endpoint-nodeports")
	pf.need(el != nil && el.value == want, "kube-proxy's no-endpoint-services or no-endpoint-nodeports sends %s to %q", pf.e.Dst, want)
	var r *nftRule
	if want == "drop" {
		pf.need(p.NodeUnreach == 0 && p.NodeResets == 0, "the node sent no ICMP error and no reset")
		pf.need(len(pf.foreign("drop")) == 0, "no other table has a drop rule")
		pf.need(!inCIDR(pf.cidrDrop().textOrEmpty(), hostOf(pf.e.Dst)), "%s is outside the service CIDR", hostOf(pf.e.Dst))
		r = pf.vmapRule(mapName)
	} else {
		pf.need(p.NodeUnreach > 0, "the node sent an ICMP destination unreachable")
		pf.need(len(pf.icmpRejects()) == 0, "no other table has a rule that rejects with an ICMP error")
		pf.need(pf.endpointsCheckFirst(), "every kube-proxy filter chain jumps to service-endpoints-check before cluster-ips-check")
		r = pf.kpRule("reject-chain", "reject")
	}
	pf.need(r != nil, "kube-proxy's table has the rule that applies %q", want)
	if r == nil || el == nil {
		return
	}
	h := r.hit(0)
	h.Element = &ElementHit{Map: mapName, Key: el.key, Comment: el.comment}
	h.ProvenBy = fmt.Sprintf("%s's element %s is %q, and no other rule can have %s it", mapName, el.key, el.value, map[string]string{"drop": "dropped", "goto reject-chain": "rejected"}[want])
	p.Rule = h
}

func (r *nftRule) textOrEmpty() string {
	if r == nil {
		return ""
	}
	return r.text
}

// vmapRule is kube-proxy's rule that looks the packet up in map name.
func (pf *nftProof) vmapRule(name string) *nftRule {
	found := pf.l.rules(func(r *nftRule) bool {
		return r.chain.table == pf.kp && strings.HasSuffix(r.text, " vmap @"+name)
	})
	if len(found) != 1 {
		return nil
	}
	return found[0]
}

// endpointsCheckFirst: every chain of kube-proxy's that jumps to
// cluster-ips-check jumps to service-endpoints-check before.
func (pf *nftProof) endpointsCheckFirst() bool {
	for _, c := range pf.kp.chains {
		sec, cic := c.position("ct state new jump service-endpoints-check"), c.position("ct state new jump cluster-ips-check")
		if cic >= 0 && (sec < 0 || sec > cic) {
			return false
		}
	}
	return true
}

// icmpRejects lists the rules outside kube-proxy's table that can answer
// with an ICMP error: every reject but a TCP reset.
func (pf *nftProof) icmpRejects() []*nftRule {
	return pf.l.rules(func(r *nftRule) bool {
		return r.chain.table != pf.kp && pf.sees(r.chain.table) && strings.Contains(" "+r.text+" ", " reject ") && !strings.Contains(r.text, "reject with tcp reset")
	})
}
