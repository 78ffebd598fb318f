package lab

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// Proof is what the lab read from the node around one attempt, with the
// node's own tools (iptables-save -c, ipvsadm --stats, the conntrack tool,
// /proc/net/snmp) and from the servers' answers: never from the tracer.
// It shows the incident happened, and it is the truth the tracer's flow is
// compared with.
type Proof struct {
	// Rule is the deciding rule whose packet counter this attempt raised,
	// as the node's iptables-save prints it.
	Rule *RuleHit `json:"rule,omitempty"`
	// Owner is the pod whose sandbox portmap named in the comment of the
	// CNI-HOSTPORT-DNAT jump to Rule's chain.
	Owner string `json:"owner,omitempty"`
	// IPVS is the virtual server this attempt reached and the real server
	// IPVS's connection table gives it ("" when it has none).
	IPVS *IPVSHit `json:"ipvs,omitempty"`
	// Conntrack is the node's entry for the attempt, as `conntrack -L` lists it.
	Conntrack *CTEntry `json:"conntrack,omitempty"`
	// AnsweredBy is the pod (namespace/name) whose server answered.
	AnsweredBy string `json:"answered_by,omitempty"`
	// DstPod is the pod the connection ended at: the one that answered,
	// else the one conntrack's reply comes from, else the one owning the
	// address the client dialled.
	DstPod string `json:"dst_pod,omitempty"`
	// Service is the Service owning the address the client dialled (its
	// ClusterIP or LB IP, or a node address and one of its NodePorts).
	Service string `json:"service,omitempty"`
	// Counter deltas of the attempt: the node's TCP resets and ICMP (and
	// ICMPv6) destination-unreachable errors sent, and the client's TCP
	// resets.
	NodeResets   int64 `json:"node_resets,omitempty"`
	NodeUnreach  int64 `json:"node_icmp_unreachable,omitempty"`
	ClientResets int64 `json:"client_resets,omitempty"`
}

// RuleHit is a rule of the node as iptables-save prints it, or a native
// nftables rule as `nft -a list ruleset` prints it.
type RuleHit struct {
	// Backend is "nftables" for a native rule; Family and Handle identify
	// it, Element is the map element that sent the packet to it (or whose
	// verdict it applied).
	Backend string      `json:"backend,omitempty"`
	Family  string      `json:"family,omitempty"`
	Table   string      `json:"table"`
	Chain   string      `json:"chain"`
	Handle  uint64      `json:"handle,omitempty"`
	Text    string      `json:"text"`
	Element *ElementHit `json:"element,omitempty"`
	// Packets the rule's counter counted during the attempt; a native
	// rule has a counter only where its program writes one.
	Packets uint64 `json:"packets,omitempty"`
	// BaseChain: the rule is in a chain netfilter runs itself (nftables)
	// rather than one jumped to.
	BaseChain bool `json:"base_chain,omitempty"`
	// ProvenBy says how the node's effects single this rule out when no
	// counter of it could.
	ProvenBy string `json:"proven_by,omitempty"`
}

// ElementHit is a verdict map element as nft lists it.
type ElementHit struct {
	Map     string `json:"map"`
	Key     string `json:"key"`
	Comment string `json:"comment,omitempty"`
}

const backendNFT = "nftables"

// IPVSHit is a virtual server and the real server it chose.
type IPVSHit struct {
	Virtual string `json:"virtual"`
	Real    string `json:"real,omitempty"`
}

// CTEntry is a conntrack entry as the conntrack tool lists it.
type CTEntry struct {
	State     string   `json:"state,omitempty"`
	Flags     []string `json:"flags,omitempty"` // UNREPLIED, ASSURED
	ReplySrc  string   `json:"reply_src"`
	ReplyDst  string   `json:"reply_dst"`
	Unreplied bool     `json:"unreplied"`
}

// counters is what the lab reads of the observed node (and the client's
// namespace) just before and just after an attempt. It parses the tools'
// output itself rather than with internal/rules, so the truth the tracer
// is checked against does not pass through the tracer's own parser.
type counters struct {
	rules map[ruleKey]uint64
	// ipvs lists the virtual servers ("tcp VIP:PORT") and their real
	// servers ("tcp VIP:PORT RIP:PORT"); ipvsConns is IPVS's connection
	// table. Both are read at once; IPVS's per-service counters are not,
	// as the kernel refreshes them only every two seconds.
	ipvs         map[string]bool
	ipvsConns    []ipvsConn
	snmp         map[string]int64 // "Tcp:OutRsts", "Icmp:OutDestUnreachs"
	clientResets int64
	// nft is the node's native ruleset, on a node whose kube-proxy or
	// portmap writes nftables.
	nft *nftListing
}

// ruleKey is a rule of iptables-save (family "") or ip6tables-save
// (family "ip6", as the trace names an ip6tables rule).
type ruleKey struct{ family, table, text string }

var proofTables = []string{"nat", "filter"}

// readCounters reads the rule and SNMP counters, with ipvs IPVS's
// virtual servers and connection table, with nft the native ruleset, and
// with ip6 the ip6tables rules too (a dual-stack node).
func readCounters(node, client netlab.Namespace, ipvs, nft, ip6 bool) (counters, error) {
	c := counters{rules: map[ruleKey]uint64{}}
	saves := map[string]string{"": "iptables-save"}
	if ip6 {
		saves["ip6"] = "ip6tables-save"
	}
	for family, save := range saves {
		for _, table := range proofTables {
			out, err := node.Run(save, "-c", "-t", table)
			if err != nil {
				return c, fmt.Errorf("read rule counters: %w", err)
			}
			for k, n := range parseRuleCounters(table, out) {
				k.family = family
				c.rules[k] = n
			}
		}
	}
	if ipvs {
		out, err := node.Run("ipvsadm", "-L", "-n")
		if err != nil {
			return c, fmt.Errorf("list ipvs virtual servers: %w", err)
		}
		c.ipvs = parseIPVSList(out)
		if out, err = node.Run("ipvsadm", "-L", "-n", "-c"); err != nil {
			return c, fmt.Errorf("list ipvs connections: %w", err)
		}
		c.ipvsConns = parseIPVSConns(out)
	}
	if nft {
		out, err := node.Run("nft", "-a", "list", "ruleset")
		if err != nil {
			return c, fmt.Errorf("list nftables ruleset: %w", err)
		}
		if c.nft, err = parseNFTListing(out); err != nil {
			return c, err
		}
	}
	var err error
	if c.snmp, err = node.SNMP(); err != nil {
		return c, err
	}
	if client.Name != "" {
		snmp, err := client.SNMP()
		if err != nil {
			return c, err
		}
		c.clientResets = snmp["Tcp:OutRsts"]
	}
	return c, nil
}

// parseRuleCounters reads `iptables-save -c` lines "[pkts:bytes] -A ...";
// identical lines get their occurrence number so none hides another.
func parseRuleCounters(table, out string) map[ruleKey]uint64 {
	m := map[ruleKey]uint64{}
	seen := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "[") {
			continue
		}
		cnt, text, ok := strings.Cut(line[1:], "] ")
		if !ok || !strings.HasPrefix(text, "-A ") {
			continue
		}
		pkts, _, _ := strings.Cut(cnt, ":")
		n, err := strconv.ParseUint(pkts, 10, 64)
		if err != nil {
			continue
		}
		seen[text]++
		if seen[text] > 1 {
			text += "\x00" + strconv.Itoa(seen[text])
		}
		m[ruleKey{table: table, text: text}] = n
	}
	return m
}

// parseIPVSList reads `ipvsadm -L -n`: a virtual server line
// "TCP  VIP:PORT rr" followed by its "  -> RIP:PORT  Masq ..." lines.
func parseIPVSList(out string) map[string]bool {
	m := map[string]bool{}
	vs := ""
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) < 2:
		case f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP":
			vs = strings.ToLower(f[0]) + " " + f[1]
			m[vs] = true
		case f[0] == "->" && vs != "" && strings.Contains(f[1], ":") && f[1] != "RemoteAddress:Port":
			m[vs+" "+f[1]] = true
		}
	}
	return m
}

// ipvsConn is one entry of IPVS's connection table.
type ipvsConn struct{ proto, source, virtual, dest string }

// parseIPVSConns reads `ipvsadm -L -n -c`:
// "TCP 01:59  TIME_WAIT   CLIENT:PORT   VIP:PORT   RIP:PORT".
func parseIPVSConns(out string) []ipvsConn {
	var conns []ipvsConn
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 6 || f[0] != "TCP" && f[0] != "UDP" && f[0] != "SCTP" {
			continue
		}
		conns = append(conns, ipvsConn{proto: strings.ToLower(f[0]), source: f[3], virtual: f[4], dest: f[5]})
	}
	return conns
}

// decidingTargets are the rule targets that decide a connection's fate;
// counters of other rules (jumps, marks, masquerades) are not the decision.
var decidingTargets = map[string]string{"-j DNAT": "nat", "-j REJECT": "filter", "-j DROP": "filter"}

// hits lists the deciding rules whose counters went up between a and b.
func hits(a, b counters) []RuleHit {
	var out []RuleHit
	for k, after := range b.rules {
		before := a.rules[k]
		if after <= before {
			continue
		}
		text, _, _ := strings.Cut(k.text, "\x00")
		for target, table := range decidingTargets {
			if k.table == table && strings.Contains(text+" ", " "+target+" ") {
				chain, _, _ := strings.Cut(strings.TrimPrefix(text, "-A "), " ")
				out = append(out, RuleHit{Family: k.family, Table: k.table, Chain: chain, Text: text, Packets: after - before})
			}
		}
	}
	return out
}

// ipvsHits lists IPVS's connections from the attempt's source.
func ipvsHits(c counters, proto, src string) []IPVSHit {
	var out []IPVSHit
	for _, conn := range c.ipvsConns {
		if conn.proto == proto && conn.source == src {
			out = append(out, IPVSHit{Virtual: conn.virtual, Real: conn.dest})
		}
	}
	return out
}

// parseConntrack reads the first entry of `conntrack -L` output:
// "tcp 6 117 TIME_WAIT src=A dst=B sport=P dport=Q src=.. dst=.. sport=.. dport=.. [ASSURED] ...".
func parseConntrack(out string) *CTEntry {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.Contains(line, "src=") {
			continue
		}
		e := &CTEntry{}
		var tuples [2]map[string]string
		n := -1
		for i, w := range f {
			k, v, ok := strings.Cut(w, "=")
			switch {
			case ok && k == "src":
				n++
				if n < 2 {
					tuples[n] = map[string]string{}
				}
				fallthrough
			case ok && n >= 0 && n < 2:
				tuples[n][k] = v
			case strings.HasPrefix(w, "[") && strings.HasSuffix(w, "]"):
				flag := strings.Trim(w, "[]")
				e.Flags = append(e.Flags, flag)
				e.Unreplied = e.Unreplied || flag == "UNREPLIED"
			case !ok && i == 3 && f[0] == "tcp":
				e.State = w
			}
		}
		if tuples[1] == nil {
			return nil
		}
		e.ReplySrc = endpointOf(tuples[1]["src"], tuples[1]["sport"])
		e.ReplyDst = endpointOf(tuples[1]["dst"], tuples[1]["dport"])
		return e
	}
	return nil
}

func endpointOf(ip, port string) string {
	if port == "" {
		return ip
	}
	return net.JoinHostPort(ip, port)
}

// conntrackEntry lists the node's entry for one connection with the
// conntrack tool (ICMP entries are not looked up: their id is the ping's).
func conntrackEntry(node netlab.Namespace, proto, src, dst string) (*CTEntry, error) {
	if proto == "icmp" || proto == "icmpv6" {
		return nil, nil
	}
	sip, sport, _ := net.SplitHostPort(src)
	dip, dport, _ := net.SplitHostPort(dst)
	family := "ipv4"
	if strings.Contains(sip, ":") {
		family = "ipv6"
	}
	out, err := node.Run("conntrack", "-L", "-f", family, "-p", proto, "--orig-src", sip, "--orig-dst", dip,
		"--orig-port-src", sport, "--orig-port-dst", dport)
	if err != nil {
		return nil, fmt.Errorf("conntrack -L for %s %s -> %s: %w", proto, src, dst, err)
	}
	return parseConntrack(out), nil
}
