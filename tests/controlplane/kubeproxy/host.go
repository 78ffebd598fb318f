package kubeproxy

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"regexp"
	"sort"
	"strings"
)

// hostFiles are global, or host-namespace, settings kube-proxy writes on a
// real node. nf_conntrack_max and the conntrack hashsize module parameter
// are global (nf_conntrack_max is read-only in any other network
// namespace); the timeouts, tcp_be_liberal and route_localnet are per
// namespace, so these are the host's own values, which a process that
// escaped its namespace would change.
var hostFiles = []string{
	"/proc/sys/net/netfilter/nf_conntrack_max",
	"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
	"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal",
	"/proc/sys/net/netfilter/nf_conntrack_udp_timeout",
	"/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream",
	"/sys/module/nf_conntrack/parameters/hashsize",
	"/proc/sys/net/ipv4/conf/all/route_localnet",
	"/proc/sys/net/ipv4/ip_forward",
	// ipvs mode's: per namespace (the host's own values here), present
	// once ip_vs is loaded. conn_tab_bits is the one ip_vs module
	// parameter, global.
	"/proc/sys/net/ipv4/vs/conntrack",
	"/proc/sys/net/ipv4/vs/conn_reuse_mode",
	"/proc/sys/net/ipv4/vs/expire_nodest_conn",
	"/proc/sys/net/ipv4/vs/expire_quiescent_template",
	"/proc/sys/net/ipv4/conf/all/arp_ignore",
	"/proc/sys/net/ipv4/conf/all/arp_announce",
	"/sys/module/ip_vs/parameters/conn_tab_bits",
	// The host namespace's IPVS table, read without asking the IPVS
	// generic netlink family (which would load ip_vs where it is absent).
	"/proc/net/ip_vs",
}

// kubeIPVSLink is the dummy link ipvs mode binds Service addresses to.
const kubeIPVSLink = "kube-ipvs0"

// hostCommands print the host namespace's packet filter.
var hostCommands = [][]string{
	{"nft", "list", "ruleset"},
	{"iptables-save"},
	{"ip6tables-save"},
}

// HostState is what the host looks like to the checks: the files above and
// the rulesets, keyed by path or command line.
type HostState map[string]string

var (
	saveComment = regexp.MustCompile(`(?m)^#.*\n?`)
	saveCounter = regexp.MustCompile(`\[\d+:\d+\]`)
	nftCounter  = regexp.MustCompile(`counter packets \d+ bytes \d+`)
)

// ReadHost reads the host's conntrack, forwarding, IPVS and ARP settings,
// its rulesets (nft, iptables-save, ip6tables-save, with timestamps and
// packet counters removed), its IPVS table and ipsets, and whether it has
// a kube-ipvs0 link. Run it from the test process, which is in the
// host's network namespace.
func ReadHost() (HostState, error) {
	st := HostState{}
	for _, p := range hostFiles {
		b, err := os.ReadFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			st[p] = "(absent)"
		case err != nil:
			return nil, fmt.Errorf("read host %s: %w", p, err)
		default:
			st[p] = strings.TrimSpace(string(b))
		}
	}
	for _, c := range hostCommands {
		out, err := run(c[0], c[1:]...)
		if err != nil {
			return nil, fmt.Errorf("read host ruleset: %w", err)
		}
		out = saveComment.ReplaceAllString(out, "")
		out = saveCounter.ReplaceAllString(out, "[]")
		out = nftCounter.ReplaceAllString(out, "counter")
		st[strings.Join(c, " ")] = out
	}
	sets, err := hostIPSets()
	if err != nil {
		return nil, err
	}
	st["ipset save"] = sets
	st["link "+kubeIPVSLink] = hostLink(kubeIPVSLink)
	return st, nil
}

// hostIPSets is `ipset save` of the host namespace, or a note that the
// kernel has no ip_set: listing them would make the kernel load it.
func hostIPSets() (string, error) {
	if _, err := os.Stat("/sys/module/ip_set"); err != nil {
		return "(ip_set not loaded)", nil
	}
	out, err := run("ipset", "save")
	if err != nil {
		return "", fmt.Errorf("read host ipsets: %w", err)
	}
	return out, nil
}

// hostLink says whether the host namespace has a link of that name.
func hostLink(name string) string {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return "(absent)"
	}
	return fmt.Sprintf("index %d flags %s", ifc.Index, ifc.Flags)
}

// Diff lists what differs from before, one entry per setting or ruleset.
func (st HostState) Diff(before HostState) []string {
	var d []string
	for k, v := range before {
		if now, ok := st[k]; !ok || now != v {
			d = append(d, fmt.Sprintf("%s: was %q, now %q", k, v, st[k]))
		}
	}
	for k, v := range st {
		if _, ok := before[k]; !ok {
			d = append(d, fmt.Sprintf("%s: new %q", k, v))
		}
	}
	sort.Strings(d)
	return d
}
