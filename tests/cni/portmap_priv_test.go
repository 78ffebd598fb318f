package cni

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/tests/controlplane/cphelper"
)

// UpdateEnv set to 1 makes TestPortmapFixtures rewrite the fixtures
// instead of checking them.
const UpdateEnv = "TRACER_UPDATE_FIXTURES"

// fixtureDir holds what the real plugin writes, for the nftables reader's
// tests (internal/nft); this package only produces the files.
const fixtureDir = "../../internal/nft/testdata"

// The fixture pod: one plain TCP hostPort, one bound to a host address,
// one UDP. The id is fixed because it is every rule's comment.
var (
	fixtureSandbox = Sandbox{
		ContainerID: "4f2a9c1e0b7d",
		IP:          "10.88.0.2/16",
		Mappings: []PortMapping{
			{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"},
			{HostPort: 8083, ContainerPort: 83, Protocol: "tcp", HostIP: "192.168.0.2"},
			{HostPort: 5353, ContainerPort: 53, Protocol: "udp"},
		},
	}
	fixtureHostIP   = "192.168.0.2/24"
	fixtureClientIP = "192.168.0.1/24"
	fixtureGateway  = "10.88.0.1/16"

	// The dual-stack fixture pod: the same mappings plus one bound to a
	// host IPv6 address, which portmap writes into ip6 cni_hostport only
	// (and the IPv4 hostIP one into ip cni_hostport only).
	fixtureSandboxDual = Sandbox{
		ContainerID: "4f2a9c1e0b7d",
		IP:          "10.88.0.2/16",
		IP6:         "fd88::2/64",
		Mappings: append(slices.Clone(fixtureSandbox.Mappings),
			PortMapping{HostPort: 8086, ContainerPort: 86, Protocol: "tcp", HostIP: "fd92::2"}),
	}
	fixtureHostIP6  = "fd92::2/64"
	fixtureGateway6 = "fd88::1/64"
)

// shapes6 are the IPv6 table's DNATs of the dual-stack fixture.
var shapes6 = map[string]map[string][]string{
	"v1.10.0": {
		"hostports": {
			`tcp dport 8080 dnat to [fd88::2]:80 comment "4f2a9c1e0b7d"`,
			`udp dport 5353 dnat to [fd88::2]:53 comment "4f2a9c1e0b7d"`,
			`ip6 daddr fd92::2 tcp dport 8086 dnat to [fd88::2]:86 comment "4f2a9c1e0b7d"`,
		},
	},
	"v1.8.0": {
		"hostip_hostports": {`ip6 daddr fd92::2 tcp dport 8086 dnat to [fd88::2]:86 comment "4f2a9c1e0b7d"`},
		"hostports": {
			`tcp dport 8080 dnat to [fd88::2]:80 comment "4f2a9c1e0b7d"`,
			`udp dport 5353 dnat to [fd88::2]:53 comment "4f2a9c1e0b7d"`,
		},
	},
}

// shapes are the rules (handles stripped) of the chains that tell the
// releases apart; they catch a cache that handed out the wrong binary,
// which a fixture rewritten from it would hide. v1.8.0's prerouting jumps
// to both chains for every destination and its output guards only the jump
// to hostports with fib daddr type local; v1.10.0 guards both hooks' one
// jump, and puts hostIP rules into hostports.
var shapes = map[string]map[string][]string{
	"v1.10.0": {
		"prerouting":       {"fib daddr type local jump hostports_all"},
		"output":           {"fib daddr type local jump hostports_all"},
		"hostports_all":    {"jump hostip_hostports", "jump hostports"},
		"hostip_hostports": nil,
		"hostports": {
			`tcp dport 8080 dnat to 10.88.0.2:80 comment "4f2a9c1e0b7d"`,
			`ip daddr 192.168.0.2 tcp dport 8083 dnat to 10.88.0.2:83 comment "4f2a9c1e0b7d"`,
			`udp dport 5353 dnat to 10.88.0.2:53 comment "4f2a9c1e0b7d"`,
		},
	},
	"v1.8.0": {
		"prerouting": {"jump hostip_hostports", "jump hostports"},
		"output":     {"jump hostip_hostports", "fib daddr type local jump hostports"},
		"hostip_hostports": {
			`ip daddr 192.168.0.2 tcp dport 8083 dnat to 10.88.0.2:83 comment "4f2a9c1e0b7d"`,
		},
		"hostports": {
			`tcp dport 8080 dnat to 10.88.0.2:80 comment "4f2a9c1e0b7d"`,
			`udp dport 5353 dnat to 10.88.0.2:53 comment "4f2a9c1e0b7d"`,
		},
	},
}

// TestPortmapFixtures runs each portmap release's ADD for the fixture pod in
// a fresh node namespace, compares `nft -j list ruleset` and `nft -a list
// ruleset` there with internal/nft/testdata/portmap-VERSION.{json,nft}
// (or rewrites them with TRACER_UPDATE_FIXTURES=1), then runs DEL and
// checks the pod's rules are gone. The host's ruleset must not change.
func TestPortmapFixtures(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the real portmap plugin and creates network namespaces: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and runs portmap and nft in them")
	}
	update := os.Getenv(UpdateEnv) == "1"
	before, err := HostState()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range cphelper.PortmapVersions {
		t.Run(v, func(t *testing.T) { testPortmapFixture(t, v, update) })
		t.Run(v+"-dualstack", func(t *testing.T) { testPortmapFixtureDual(t, v, update) })
	}
	after, err := HostState()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("the host's netfilter state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func testPortmapFixture(t *testing.T, version string, update bool) {
	bin, err := cphelper.EnsurePortmap(version, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	node, pod := fixtureNamespaces(t)
	if out, err := nft(node, "list", "ruleset"); err != nil || out != "" {
		t.Fatalf("fresh namespace %s has a ruleset (%v):\n%s", node.Name, err, out)
	}
	pm := Portmap{Plugin: bin, Node: node}
	s := fixtureSandbox
	s.NetNS = pod.Path()
	result, err := pm.Add(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(result), `"10.88.0.2/16"`) {
		t.Errorf("portmap add did not pass the prevResult through: %s", result)
	}

	js, err := nft(node, "-j", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	text, err := nft(node, "-a", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	shape, ok := shapes[version]
	if !ok {
		t.Fatalf("no expected shape for portmap %s: add one to shapes", version)
	}
	for chain, want := range shape {
		if got := chainRules(text, chain); !slices.Equal(got, want) {
			t.Errorf("portmap %s chain %s = %q, want %q\n%s", version, chain, got, want, text)
		}
	}
	if out, err := nft(pod, "list", "ruleset"); err != nil || out != "" {
		t.Errorf("portmap wrote into the pod's namespace (%v):\n%s", err, out)
	}
	// snat (the default) makes portmap set route_localnet on the interface
	// towards the pod: in the node's namespace, never the host's.
	if out, err := node.Run("cat", "/proc/sys/net/ipv4/conf/veth0/route_localnet"); err != nil || strings.TrimSpace(out) != "1" {
		t.Errorf("route_localnet on the node's veth0 = %q (%v), want 1", strings.TrimSpace(out), err)
	}

	checkFixtures(t, "portmap-"+version, js, text, update)

	// DEL removes rules by comment only; the table stays for the next pod.
	checkDeleted(t, pm, node, s, 1)
}

// checkFixtures compares what nft listed with the fixtures NAME.json and
// NAME.nft, or rewrites them.
func checkFixtures(t *testing.T, name, js, text string, update bool) {
	t.Helper()
	for _, f := range []struct{ ext, got string }{{"json", js}, {"nft", text}} {
		path := filepath.Join(fixtureDir, name+"."+f.ext)
		if update {
			if err := os.MkdirAll(fixtureDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(f.got), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", path)
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("read fixture (%s=1 writes it): %v", UpdateEnv, err)
		}
		if string(want) != f.got {
			nftVersion, _ := exec.Command("nft", "--version").Output()
			t.Errorf("portmap no longer writes %s (with %s; %s=1 rewrites it): %s",
				path, strings.TrimSpace(string(nftVersion)), UpdateEnv, firstDiff(string(want), f.got))
		}
	}
}

// testPortmapFixtureDual runs ADD for a pod with an address of each family:
// portmap writes ip cni_hostport for the IPv4 one and ip6 cni_hostport for
// the IPv6 one, each mapping bound to a host address in its family's table
// only, and DEL empties both.
func testPortmapFixtureDual(t *testing.T, version string, update bool) {
	bin, err := cphelper.EnsurePortmap(version, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	node, pod := fixtureNamespaces(t)
	for _, s := range []struct {
		ns        netlab.Namespace
		cidr, dev string
	}{{node, fixtureHostIP6, "eth0"}, {node, fixtureGateway6, "veth0"}, {pod, fixtureSandboxDual.IP6, "eth0"}} {
		if _, err := s.ns.Run("ip", "-6", "addr", "add", s.cidr, "dev", s.dev, "nodad"); err != nil {
			t.Fatal(err)
		}
	}
	pm := Portmap{Plugin: bin, Node: node}
	s := fixtureSandboxDual
	s.NetNS = pod.Path()
	if _, err := pm.Add(s); err != nil {
		t.Fatal(err)
	}
	js, err := nft(node, "-j", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	text, err := nft(node, "-a", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	v6 := tableText(text, "ip6 cni_hostport")
	for chain, want := range shapes6[version] {
		if got := chainRules(v6, chain); !slices.Equal(got, want) {
			t.Errorf("portmap %s ip6 chain %s = %q, want %q\n%s", version, chain, got, want, text)
		}
	}
	wantMasq := []string{`ip6 saddr fd88::2 ip6 daddr fd88::2 masquerade comment "4f2a9c1e0b7d"`}
	if got := chainRules(v6, "masquerading"); !slices.Equal(got, wantMasq) {
		t.Errorf("portmap %s ip6 masquerading = %q, want %q (no localhost rule for IPv6)", version, got, wantMasq)
	}
	if v4 := tableText(text, "ip cni_hostport"); strings.Contains(v4, "fd88::") || strings.Contains(v4, "fd92::") {
		t.Errorf("portmap %s wrote IPv6 into ip cni_hostport:\n%s", version, v4)
	}
	checkFixtures(t, "portmap-"+version+"-dualstack", js, text, update)

	checkDeleted(t, pm, node, s, 2) // ip and ip6 cni_hostport
}

// checkDeleted runs DEL for s and checks that none of its rules is left
// and that tables tables remain.
func checkDeleted(t *testing.T, pm Portmap, node netlab.Namespace, s Sandbox, tables int) {
	t.Helper()
	if err := pm.Del(s); err != nil {
		t.Fatal(err)
	}
	js, err := nft(node, "-j", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	left, got, err := rulesWithComment(js, s.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	if left != 0 || got != tables {
		t.Errorf("after del: %d rules of %s left, %d tables (want 0 and %d)", left, s.ContainerID, got, tables)
	}
}

// tableText is the part of `nft list ruleset` output that lists table
// ("ip6 cni_hostport"), or "".
func tableText(text, table string) string {
	_, rest, ok := strings.Cut(text, "table "+table+" {")
	if !ok {
		return ""
	}
	if i := strings.Index(rest, "\n}"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// fixtureNamespaces creates the node (192.168.0.2 on eth0 towards a
// neighbour namespace at 192.168.0.1, veth0 towards the pod) and the pod
// (10.88.0.2/16 on eth0), fresh for each release so handles start from the
// same point. The veths are created inside the node's namespace: no link
// ever appears in the host's. (This kernel has no dummy links.)
func fixtureNamespaces(t *testing.T) (node, pod netlab.Namespace) {
	t.Helper()
	lab, err := netlab.New("trpm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Error(err)
		}
	})
	if node, err = lab.Namespace("node"); err != nil {
		t.Fatal(err)
	}
	if pod, err = lab.Namespace("pod"); err != nil {
		t.Fatal(err)
	}
	ext, err := lab.Namespace("ext")
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		ns   netlab.Namespace
		args []string
	}{
		{node, []string{"link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", ext.Name}},
		{node, []string{"addr", "add", fixtureHostIP, "dev", "eth0"}},
		{node, []string{"link", "set", "eth0", "up"}},
		{ext, []string{"addr", "add", fixtureClientIP, "dev", "eth0"}},
		{ext, []string{"link", "set", "eth0", "up"}},
		{node, []string{"link", "add", "veth0", "type", "veth", "peer", "name", "eth0", "netns", pod.Name}},
		{node, []string{"addr", "add", fixtureGateway, "dev", "veth0"}},
		{node, []string{"link", "set", "veth0", "up"}},
		{pod, []string{"addr", "add", fixtureSandbox.IP, "dev", "eth0"}},
		{pod, []string{"link", "set", "eth0", "up"}},
	}
	for _, s := range steps {
		if _, err := s.ns.Run("ip", s.args...); err != nil {
			t.Fatal(err)
		}
	}
	return node, pod
}

// nft runs nft in ns and returns its stdout alone: a warning on stderr must
// not end up in a fixture.
func nft(ns netlab.Namespace, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name, "nft"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("nft %s in %s: %w: %s", strings.Join(args, " "), ns.Name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// rulesWithComment counts the rules whose comment is id, and the tables,
// in `nft -j list ruleset` output.
func rulesWithComment(js, id string) (rules, tables int, err error) {
	var doc struct {
		Nftables []struct {
			Table *json.RawMessage `json:"table"`
			Rule  *struct {
				Comment string `json:"comment"`
			} `json:"rule"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		return 0, 0, fmt.Errorf("decode nft -j output: %w", err)
	}
	for _, o := range doc.Nftables {
		if o.Table != nil {
			tables++
		}
		if o.Rule != nil && o.Rule.Comment == id {
			rules++
		}
	}
	return rules, tables, nil
}

var handleComment = regexp.MustCompile(` # handle \d+$`)

// chainRules are the rules of chain in `nft -a list ruleset` output,
// without their handles; a base chain's type line is not a rule. nil when
// the chain is empty or absent.
func chainRules(text, chain string) []string {
	var rules []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(handleComment.ReplaceAllString(line, ""))
		switch {
		case !in:
			in = line == "chain "+chain+" {"
		case line == "}":
			return rules
		case strings.HasPrefix(line, "type "):
		default:
			rules = append(rules, line)
		}
	}
	return rules
}

// firstDiff shows where two outputs part, with some context either side
// (the JSON is one line, so a line number alone would not help).
func firstDiff(want, got string) string {
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	from := max(0, i-80)
	clip := func(s string) string { return s[min(from, len(s)):min(i+80, len(s))] }
	return fmt.Sprintf("first difference at byte %d:\nwant …%s…\ngot  …%s…", i, clip(want), clip(got))
}
