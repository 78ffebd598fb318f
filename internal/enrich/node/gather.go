package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/cloudflare/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netns"
	"github.com/tracer-dev/tracer/internal/nft"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Runner runs a read-only command in the observed namespace and returns its
// standard output. It is injectable so tests need neither root nor the
// commands.
type Runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// execRunner runs the command with os/exec; stderr goes into the error.
func execRunner(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg != "" {
			return nil, fmt.Errorf("run %s: %w: %s", name, err, msg)
		}
		return nil, fmt.Errorf("run %s: %w", name, err)
	}
	return out, nil
}

// nsRunner runs commands inside the namespace at path (any namespace file,
// /proc/PID/ns/net too): each starts from a thread switched into it, whose
// network namespace the child inherits and nothing else. That is one exec
// where nsenter costs two, which counts where exec is dear (the tests/vm
// guests' TCG: 64 ms each).
func nsRunner(path string) Runner {
	if path == "" {
		return execRunner
	}
	return func(ctx context.Context, name string, args ...string) (out []byte, err error) {
		err = netns.Do(path, func() error {
			out, err = execRunner(ctx, name, args...)
			return err
		})
		return out, err
	}
}

// errNoTool says a command is not installed; it makes a note, not a failure.
var errNoTool = errors.New("not installed")

// toolCheck says whether a command can be run; nil means "assume it can"
// (an injected Runner answers for itself).
type toolCheck func(name string) error

// lookPath checks for a command in our own PATH: nsRunner only switches the
// network namespace, so the child sees the same files.
func lookPath(name string) error {
	if _, err := exec.LookPath(name); err != nil {
		return fmt.Errorf("%s: %w", name, errNoTool)
	}
	return nil
}

func (c toolCheck) have(name string) error {
	if c == nil {
		return nil
	}
	return c(name)
}

// readLinks reads the addresses and the local table through a netlink handle
// opened in the namespace.
func readLinks(h *netlink.Handle) ([]Address, []netip.Prefix, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, nil, fmt.Errorf("list links: %w", err)
	}
	var addrs []Address
	for _, l := range links {
		as, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, nil, fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range as {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			ones, _ := a.Mask.Size()
			addrs = append(addrs, Address{
				Interface: l.Attrs().Name,
				Prefix:    netip.PrefixFrom(ip.Unmap(), ones),
				Up:        l.Attrs().Flags&net.FlagUp != 0,
			})
		}
	}
	sort.Slice(addrs, func(i, j int) bool {
		if addrs[i].Interface != addrs[j].Interface {
			return addrs[i].Interface < addrs[j].Interface
		}
		return addrs[i].Prefix.String() < addrs[j].Prefix.String()
	})
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, nil, fmt.Errorf("list local routing table: %w", err)
	}
	var local []netip.Prefix
	for _, r := range routes {
		// Only "local" routes: broadcast, anycast and multicast routes of
		// the same table are not what addrtype LOCAL matches.
		if r.Type != unix.RTN_LOCAL || r.Dst == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		local = append(local, netip.PrefixFrom(ip.Unmap(), ones).Masked())
	}
	sort.Slice(local, func(i, j int) bool { return local[i].String() < local[j].String() })
	local = compactPrefixes(local)
	return addrs, local, nil
}

func compactPrefixes(p []netip.Prefix) []netip.Prefix {
	out := p[:0]
	for i, x := range p {
		if i == 0 || x != p[i-1] {
			out = append(out, x)
		}
	}
	return out
}

// readRules runs iptables-save and ip6tables-save (all tables, as a user
// reading them would) and returns the text per table. iptables-save with no
// -t lists only the tables that exist, on legacy and nft alike, so it never
// instantiates a table.
func readRules(ctx context.Context, run Runner, tools toolCheck, nftBackend bool, ready func(string) bool) (texts, notes map[string]string, facts map[string]bool) {
	texts = map[string]string{}
	notes = map[string]string{}
	facts = map[string]bool{}
	for _, c := range []struct{ cmd, prefix, part, legacyMod string }{
		{"iptables-save", "", "rules", "ip_tables"}, {"ip6tables-save", "ip6/", "rules6", "ip6_tables"},
	} {
		if err := tools.have(c.cmd); err != nil {
			notes[c.part] = fmt.Sprintf("%v: its rules are not known", err)
			continue
		}
		mod := c.legacyMod
		if nftBackend {
			mod = "nf_tables"
		}
		if !ready(mod) {
			// Nothing can be in a table whose module is not loaded.
			notes[c.part] = fmt.Sprintf("%s: module %s is not loaded, so there are no rules (not loading it)", c.cmd, mod)
			facts[c.part] = true
			continue
		}
		out, err := run(ctx, c.cmd)
		if err != nil {
			notes[c.part] = fmt.Sprintf("read rules with %s: %v", c.cmd, err)
			continue
		}
		for k, v := range splitSave(string(out), c.prefix) {
			texts[k] = v
		}
	}
	return texts, notes, facts
}

// legacyTables says which families have iptables-legacy tables in a
// namespace.
type legacyTables struct{ v4, v6 bool }

func (l legacyTables) any() bool { return l.v4 || l.v6 }

// noteLegacy says, beside iptables-nft's rules, that iptables-legacy
// tables exist: the kernel runs both, and iptables-save shows only
// iptables-nft's (it warns of the others on its standard error).
func noteLegacy(notes map[string]string, l legacyTables) {
	for _, c := range []struct {
		has       bool
		part, cmd string
	}{{l.v4, "rules-legacy", "iptables"}, {l.v6, "rules6-legacy", "ip6tables"}} {
		if c.has {
			notes[c.part] = fmt.Sprintf("iptables-legacy tables are also present (%s-save warns of them): those rules run too but are not shown or attributed (see %s-legacy-save)", c.cmd, c.cmd)
		}
	}
}

// legacyTablesIn says which families have iptables-legacy tables in the
// namespace at nsPath ("" for the caller's): those x_tables lists a table
// for, which is what makes iptables-nft warn of them. Reading the lists
// creates no table.
func legacyTablesIn(nsPath string) (legacyTables, error) {
	var l legacyTables
	err := netns.On(nsPath, func() error {
		for _, f := range []struct {
			name string
			has  *bool
		}{{"ip_tables_names", &l.v4}, {"ip6_tables_names", &l.v6}} {
			// thread-self: the namespace this locked thread entered,
			// not the process's.
			b, err := os.ReadFile("/proc/thread-self/net/" + f.name)
			if errors.Is(err, fs.ErrNotExist) {
				continue // no x_tables for this family in the kernel
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", f.name, err)
			}
			*f.has = len(bytes.TrimSpace(b)) > 0
		}
		return nil
	})
	return l, err
}

// iptablesIsNFT asks iptables-save which backend it is: iptables-nft
// prints "(nf_tables)" in its version.
func iptablesIsNFT(ctx context.Context, run Runner, tools toolCheck) (isNFT, known bool) {
	if tools.have("iptables-save") != nil {
		return false, false
	}
	v, err := run(ctx, "iptables-save", "--version")
	if err != nil {
		return false, false
	}
	return bytes.Contains(v, []byte("nf_tables")), true
}

var (
	// ipsetVolatile are the per-member options whose values move on their
	// own (timeouts count down, counters count): they say nothing about
	// membership and would make every poll a change.
	ipsetVolatile = regexp.MustCompile(` (timeout|packets|bytes) [0-9]+`)
	// nftVolatile are counters and timers in `nft list` output.
	nftVolatile = regexp.MustCompile(`counter packets [0-9]+ bytes [0-9]+|expires [0-9a-z.]+|used [0-9]+ bytes`)
)

func readIPSets(ctx context.Context, run Runner, tools toolCheck) (string, error) {
	if err := tools.have("ipset"); err != nil {
		return "", err
	}
	out, err := run(ctx, "ipset", "save")
	if err != nil {
		return "", fmt.Errorf("read ipsets: %w", err)
	}
	var b strings.Builder
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "add ") {
			line = ipsetVolatile.ReplaceAllString(line, "")
		}
		if strings.TrimSpace(line) != "" {
			b.WriteString(line)
			b.WriteString("\n")
		}
	}
	return b.String(), nil
}

// compatTables are the tables iptables-nft, ip6tables-nft, ebtables-nft and
// arptables-nft create; their content is what iptables-save shows.
var compatTables = map[string]bool{
	"ip filter": true, "ip nat": true, "ip mangle": true, "ip raw": true, "ip security": true,
	"ip6 filter": true, "ip6 nat": true, "ip6 mangle": true, "ip6 raw": true, "ip6 security": true,
	"bridge filter": true, "bridge nat": true, "bridge broute": true, "arp filter": true,
}

// readNFT lists the ruleset twice, as JSON for its meaning and with
// handles for its text, and keeps the native tables. When iptables is the
// nft backend, its tables are left to iptables-save and only the native
// tables are listed; with iptables-legacy every nftables table is native.
// A rule in one listing and not the other means a change landed between
// the two reads: they are read again, once. tables lists the namespace's
// tables ("family name"); nil: nft does.
func readNFT(ctx context.Context, run Runner, tools toolCheck, iptablesIsNFT bool, tables func() ([]string, error)) ([]NFTable, *trace.NFTRuleset, error) {
	if err := tools.have("nft"); err != nil {
		return nil, nil, err
	}
	for attempt := 0; ; attempt++ {
		listing, js, err := listNFT(ctx, run, iptablesIsNFT, tables)
		if err != nil {
			return nil, nil, err
		}
		native := splitNFT(string(listing), iptablesIsNFT)
		if len(native) == 0 {
			return nil, nil, nil
		}
		snap := &trace.NFTRuleset{JSON: js, Listing: string(listing)}
		if iptablesIsNFT {
			snap.IPTables = compatTableList()
		}
		// Counting, not parsing: the snapshot's reader parses it once.
		if nft.JSONRules(js) == nft.ListedRules(listing) || attempt == 1 {
			return native, snap, nil
		}
	}
}

// listNFT lists the ruleset, or under iptables-nft its native tables
// alone, as text (with handles) and as JSON.
func listNFT(ctx context.Context, run Runner, iptablesIsNFT bool, tables func() ([]string, error)) (listing, js []byte, err error) {
	if !iptablesIsNFT {
		return listBoth(ctx, run, "ruleset")
	}
	// iptables-nft's tables hold every iptables rule of the node: on
	// kube-proxy's iptables mode for 10,000 Services, 27 MB of JSON and
	// 5 s of nft's CPU at each change of any rule, all of it left out.
	if tables == nil {
		tables = func() ([]string, error) { return nftListTables(ctx, run) }
	}
	names, err := tables()
	if err != nil {
		return nil, nil, err
	}
	var docs [][]byte
	for _, name := range names {
		if compatTables[name] {
			continue
		}
		family, table, _ := strings.Cut(name, " ")
		l, j, err := listBoth(ctx, run, "table", family, table)
		if err != nil {
			return nil, nil, err
		}
		listing = append(listing, l...)
		docs = append(docs, j)
	}
	if len(docs) == 0 {
		return nil, nil, nil
	}
	if js, err = joinNFTJSON(docs); err != nil {
		return nil, nil, err
	}
	return listing, js, nil
}

// nftListTables is `nft list tables`, as "family name".
func nftListTables(ctx context.Context, run Runner) ([]string, error) {
	out, err := run(ctx, "nft", "list", "tables")
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "table" {
			names = append(names, f[1]+" "+f[2])
		}
	}
	return names, nil
}

// listBoth lists what (the ruleset, or a table) as text with handles and
// as JSON at once: on kube-proxy's table for 5,000 Services each listing
// takes nft over two seconds, most of it the kernel's dump, and run one
// after the other they made most of the tracer's start.
func listBoth(ctx context.Context, run Runner, what ...string) (listing, js []byte, err error) {
	var jsErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		js, jsErr = run(ctx, "nft", append([]string{"-j", "list"}, what...)...)
	}()
	listing, err = run(ctx, "nft", append([]string{"-a", "list"}, what...)...)
	<-done
	name := strings.Join(what, " ")
	if err != nil {
		return nil, nil, fmt.Errorf("read nftables %s: %w", name, err)
	}
	if jsErr != nil {
		return nil, nil, fmt.Errorf("read nftables %s as json: %w", name, jsErr)
	}
	return listing, js, nil
}

// joinNFTJSON is the tables' `nft -j list table` documents as one
// document of `nft -j list ruleset`'s form: their objects in order, the
// first one's metainfo alone.
func joinNFTJSON(docs [][]byte) ([]byte, error) {
	out := []byte(`{"nftables":[`)
	n := 0
	for _, d := range docs {
		var doc struct {
			Objects []json.RawMessage `json:"nftables"`
		}
		if err := json.Unmarshal(d, &doc); err != nil {
			return nil, fmt.Errorf("read nftables table as json: %w", err)
		}
		for _, o := range doc.Objects {
			if n > 0 && bytes.HasPrefix(bytes.TrimSpace(o), []byte(`{"metainfo"`)) {
				continue
			}
			if n > 0 {
				out = append(out, ',')
			}
			out = append(out, o...)
			n++
		}
	}
	return append(out, "]}"...), nil
}

func compatTableList() []string {
	out := make([]string, 0, len(compatTables))
	for t := range compatTables {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func splitNFT(out string, iptablesIsNFT bool) []NFTable {
	var tables []NFTable
	var cur *NFTable
	var b strings.Builder
	for _, line := range strings.Split(out, "\n") {
		if cur == nil {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == "table" && strings.HasPrefix(line, "table ") {
				cur = &NFTable{Family: f[1], Name: f[2]}
				b.Reset()
			} else {
				continue
			}
		}
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			// nft's "managed by iptables-nft" warnings and comments.
			continue
		}
		b.WriteString(nftVolatile.ReplaceAllStringFunc(line, func(m string) string {
			if strings.HasPrefix(m, "counter") {
				return "counter"
			}
			return ""
		}))
		b.WriteString("\n")
		if line == "}" {
			cur.Text = b.String()
			if !(iptablesIsNFT && compatTables[cur.Family+" "+cur.Name]) {
				tables = append(tables, *cur)
			}
			cur = nil
		}
	}
	return tables
}

// moduleReady reports whether using a kernel subsystem cannot load a
// module: it is loaded or built in, or the kernel cannot load modules at
// all. `ipset save`, `nft list` and iptables-nft-save talk nfnetlink, which
// loads the subsystem's module on demand (ip_set, nf_tables), and legacy
// iptables-save modprobes ip_tables when its proc file is missing; on a
// node that does not use them, reading must not load them.
func moduleReady(name string) bool {
	if _, err := os.Stat("/sys/module/" + name); err == nil {
		return true
	}
	if _, err := os.Stat("/proc/modules"); err != nil {
		// CONFIG_MODULES off: everything there is, is built in.
		return true
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return false
	}
	b, err := os.ReadFile("/lib/modules/" + unix.ByteSliceToString(uts.Release[:]) + "/modules.builtin")
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte("/"+name+".ko\n"))
}

// ipvsLoaded reports whether the kernel has IPVS without asking for it:
// a generic netlink request for the IPVS family would make the kernel load
// the ip_vs module, which is a change the tracer must not make.
func ipvsLoaded() bool {
	_, err := os.Stat("/sys/module/ip_vs")
	return err == nil
}

// dialIPVS creates the IPVS generic netlink client in the namespace (its
// socket stays there for its whole life).
func dialIPVS(nsPath string) (ipvs.Client, error) {
	if nsPath == "" {
		return ipvs.New()
	}
	var c ipvs.Client
	err := netns.Do(nsPath, func() (err error) {
		c, err = ipvs.New()
		return err
	})
	return c, err
}

func readIPVS(c ipvs.Client) ([]IPVSService, error) {
	svcs, err := c.Services()
	if errors.Is(err, fs.ErrNotExist) {
		// The IPVS client says so of a table with no virtual server (a
		// fresh ip_vs, seen in the 5.10 and 6.1 guests): nothing unknown.
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list ipvs services: %w", err)
	}
	var out []IPVSService
	for _, s := range svcs {
		v := IPVSService{Scheduler: s.Scheduler, FWMark: s.FWMark}
		switch {
		case s.FWMark != 0:
			v.Proto = "fwmark"
		default:
			v.Proto = event.ProtoName(uint8(s.Protocol))
			v.VIP = netip.AddrPortFrom(s.Address.Unmap(), s.Port)
		}
		dests, err := c.Destinations(s.Service)
		// cloudflare/ipvs answers an empty dump, a virtual server without
		// real servers (seed 004's), with os.ErrNotExist.
		if errors.Is(err, os.ErrNotExist) {
			dests, err = nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list real servers of %s %s: %w", v.Proto, v.VIP, err)
		}
		for _, d := range dests {
			v.Reals = append(v.Reals, IPVSReal{
				Addr:    netip.AddrPortFrom(d.Address.Unmap(), d.Port),
				Forward: event.IPVSForward(uint32(d.FwdMethod)),
				Weight:  d.Weight,
			})
		}
		sort.Slice(v.Reals, func(i, j int) bool { return v.Reals[i].Addr.String() < v.Reals[j].Addr.String() })
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return ipvsKey(out[i]) < ipvsKey(out[j]) })
	return out, nil
}

func ipvsKey(v IPVSService) string {
	return fmt.Sprintf("%s %s %d", v.Proto, v.VIP, v.FWMark)
}

// ipvsText is a stable rendering for change detection.
func ipvsText(vs []IPVSService) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "%s %s\n", ipvsKey(v), v.Scheduler)
		for _, r := range v.Reals {
			fmt.Fprintf(&b, "  %s %s %d\n", r.Addr, r.Forward, r.Weight)
		}
	}
	return b.String()
}

func listenersText(ls []Listener) string {
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "%s %s %v %d\n", l.Proto, l.Addr, l.V6Only, l.Inode)
	}
	return b.String()
}

func sortListeners(ls []Listener) {
	sort.Slice(ls, func(i, j int) bool {
		if ls[i].Proto != ls[j].Proto {
			return ls[i].Proto < ls[j].Proto
		}
		return ls[i].Addr.String() < ls[j].Addr.String()
	})
}
