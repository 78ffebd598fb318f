package node

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/rules"
)

// fakeRunner answers the read-only commands from a table the test edits.
type fakeRunner struct {
	mu    sync.Mutex
	out   map[string]string
	calls map[string]int
}

func (f *fakeRunner) set(cmd, out string) {
	f.mu.Lock()
	f.out[cmd] = out
	f.mu.Unlock()
}

func (f *fakeRunner) count(cmd string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[cmd]
}

func (f *fakeRunner) run(_ context.Context, name string, args ...string) ([]byte, error) {
	cmd := strings.Join(append([]string{name}, args...), " ")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[cmd]++
	out, ok := f.out[cmd]
	if !ok {
		return nil, fmt.Errorf("%s: %w", name, errNoTool)
	}
	return []byte(out), nil
}

// TestWatcherRebuildsOnlyChangedParts runs in the caller's namespace (no
// root needed: rtnetlink and sock_diag reads are unprivileged) with the
// commands faked, and checks that a part is re-parsed only when its text
// changed, and that counters moving are not a change.
func TestWatcherRebuildsOnlyChangedParts(t *testing.T) {
	f := &fakeRunner{out: map[string]string{
		"iptables-save":           natSave,
		"ip6tables-save":          "",
		"iptables-save --version": "iptables-save v1.8.9 (nf_tables)",
		"ipset save":              ipsetSave,
	}, calls: map[string]int{}}
	w, err := WatchWith(context.Background(), "", WatchOptions{Poll: 20 * time.Millisecond, Runner: f.run})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	st := w.Current()
	rs := st.Ruleset(rules.IPv4)
	if rs == nil || rs.Chain("nat", "CNI-HOSTPORT-DNAT") == nil || st.IPSets()["KUBE-IPVS-IPS"] == nil {
		t.Fatalf("first state: rules %v sets %v notes %v", rs, st.IPSets(), st.Notes())
	}
	if notes := strings.Join(st.Notes(), "\n"); !strings.Contains(notes, "nft: not installed") {
		t.Errorf("missing nft is not a note: %q", notes)
	}

	// Only counters move: never re-parsed.
	f.set("iptables-save", strings.ReplaceAll(natSave, "[1234:56789]", "[5555:66666]"))
	f.set("ipset save", strings.ReplaceAll(ipsetSave, "add KUBE-IPVS-IPS 10.96.0.10", "add KUBE-IPVS-IPS 10.96.0.10 timeout 100 packets 3 bytes 180"))
	polls := w.Stats().Polls
	for w.Stats().Polls < polls+5 {
		time.Sleep(10 * time.Millisecond)
	}
	if w.Current().Ruleset(rules.IPv4) != rs {
		t.Error("rules re-parsed although only counters changed")
	}

	// A real change is picked up by the next polls.
	f.set("iptables-save", strings.Replace(natSave, "COMMIT", "-A OUTPUT -j CNI-HOSTPORT-DNAT\nCOMMIT", 1))
	deadline := time.Now().Add(3 * time.Second)
	for w.Current().Ruleset(rules.IPv4).Chain("nat", "OUTPUT") == nil || len(w.Current().Ruleset(rules.IPv4).Chain("nat", "OUTPUT").Rules) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("rule change not picked up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A rules text that does not parse drops the rules (attribution must
	// not use stale or half rules) and says why.
	f.set("iptables-save", "*nat\n-A NOWHERE -j ACCEPT\nbogus line\nCOMMIT\n")
	deadline = time.Now().Add(3 * time.Second)
	for w.Current().Ruleset(rules.IPv4) != nil {
		if time.Now().After(deadline) {
			t.Fatal("unparsable rules kept")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if notes := strings.Join(w.Current().Notes(), "\n"); !strings.Contains(notes, "parse iptables rules") {
		t.Errorf("notes %q", notes)
	}
	if n := f.count("iptables-save --version"); n != 1 {
		t.Errorf("backend asked %d times", n)
	}
	t.Logf("stats %+v", w.Stats())
}

// TestWatcherLoadsNoModules: on a node whose kernel has neither nf_tables,
// ip_set nor ip_tables loaded, nothing that would load them is run, and
// each absence is a note.
func TestWatcherLoadsNoModules(t *testing.T) {
	f := &fakeRunner{out: map[string]string{
		"iptables-save":           natSave,
		"ip6tables-save":          "",
		"iptables-save --version": "iptables-save v1.8.9 (nf_tables)",
		"ipset save":              ipsetSave,
		"nft list ruleset":        "",
	}, calls: map[string]int{}}
	w, err := WatchWith(context.Background(), "", WatchOptions{Poll: time.Hour, Runner: f.run, moduleReady: func(string) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, cmd := range []string{"iptables-save", "ip6tables-save", "ipset save", "nft list ruleset"} {
		if n := f.count(cmd); n != 0 {
			t.Errorf("%q run %d times although its module is not loaded", cmd, n)
		}
	}
	notes := strings.Join(w.Current().Notes(), "\n")
	for _, want := range []string{"module nf_tables is not loaded", "module ip_set is not loaded", "iptables-save: module nf_tables"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	if w.Current().Ruleset(rules.IPv4) != nil {
		t.Error("rules without reading them")
	}
}

// nftBackendRunner answers for iptables-nft with natSave's rules.
func nftBackendRunner() *fakeRunner {
	return &fakeRunner{out: map[string]string{
		"iptables-save":           natSave,
		"ip6tables-save":          "",
		"iptables-save --version": "iptables-save v1.8.9 (nf_tables)",
	}, calls: map[string]int{}}
}

// TestWatcherReadsNFTRulesWhenTheGenerationMoves: under iptables-nft,
// iptables-save runs again only when the nftables generation moved or
// the namespace has iptables-legacy tables (whose rules the generation
// does not count, and of which iptables-nft warns).
func TestWatcherReadsNFTRulesWhenTheGenerationMoves(t *testing.T) {
	f := nftBackendRunner()
	var gen atomic.Uint32
	var legacy atomic.Bool
	gen.Store(7)
	w, err := WatchWith(context.Background(), "", WatchOptions{Poll: 5 * time.Millisecond, Runner: f.run,
		nftGen:       func() (uint32, error) { return gen.Load(), nil },
		legacyTables: func() (legacyTables, error) { return legacyTables{v4: legacy.Load(), v6: legacy.Load()}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	waitPolls(t, w, 5)
	if n := f.count("iptables-save"); n != 1 {
		t.Errorf("iptables-save ran %d times while the generation stood; want the first read only", n)
	}
	if n := w.Stats().RuleReads; n != 1 {
		t.Errorf("RuleReads %d, want 1", n)
	}

	// A commit moves the generation: the next round reads the new rule.
	f.set("iptables-save", strings.Replace(natSave, "COMMIT", "-A OUTPUT -j CNI-HOSTPORT-DNAT\nCOMMIT", 1))
	gen.Add(1)
	waitPolls(t, w, 3)
	if c := w.Current().Ruleset(rules.IPv4).Chain("nat", "OUTPUT"); c == nil || len(c.Rules) != 1 {
		t.Fatalf("the rule committed with the new generation is not in the state: %+v", c)
	}
	if n := f.count("iptables-save"); n != 2 {
		t.Errorf("iptables-save ran %d times; want 2 (one per generation)", n)
	}

	// iptables-legacy tables appear: their rules move no generation, and
	// they are a note. Every round reads.
	legacy.Store(true)
	before := f.count("iptables-save")
	waitPolls(t, w, 4)
	if n := f.count("iptables-save") - before; n < 3 {
		t.Errorf("iptables-save ran %d times in 4 rounds with legacy tables present; want every round", n)
	}
	notes := strings.Join(w.Current().Notes(), "\n")
	for _, want := range []string{"(iptables-save warns of them)", "(ip6tables-save warns of them)"} {
		if !strings.Contains(notes, want) {
			t.Errorf("the legacy tables are not a note %q: %q", want, notes)
		}
	}

	// They go: one read clears the note, then the rounds stop reading.
	legacy.Store(false)
	waitPolls(t, w, 2)
	if notes := strings.Join(w.Current().Notes(), "\n"); strings.Contains(notes, "iptables-legacy") {
		t.Errorf("note kept after the legacy tables went: %q", notes)
	}
	before = f.count("iptables-save")
	waitPolls(t, w, 4)
	if n := f.count("iptables-save") - before; n != 0 {
		t.Errorf("iptables-save ran %d times after the legacy tables went and the generation stood", n)
	}
}

// waitPolls waits until n polling rounds have run whole since the call.
// The round under way may have read before the test's last change, so
// it waits for the one after the n-th to start.
func waitPolls(t *testing.T, w *Watcher, n uint64) {
	t.Helper()
	polls := w.Stats().Polls
	deadline := time.Now().Add(time.Minute)
	for w.Stats().Polls < polls+n+1 {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d polls in a minute (stats %+v)", n, w.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}
