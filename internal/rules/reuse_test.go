package rules

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// reuseCases are a node's rules before and after a change: what
// ParseSaveReusing must parse as a fresh parse would, without changing
// what it shares.
var reuseCases = []struct{ name, before, after string }{
	{"rule inserted first, the rest renumbered",
		"*nat\n:PREROUTING ACCEPT [0:0]\n:SVC - [0:0]\n-A PREROUTING -d 10.96.0.1/32 -j SVC\n-A SVC -j DNAT --to-destination 10.244.1.2:80\nCOMMIT\n",
		"*nat\n:PREROUTING ACCEPT [0:0]\n:SVC - [0:0]\n-A PREROUTING -d 10.96.0.9/32 -j RETURN\n-A PREROUTING -d 10.96.0.1/32 -j SVC\n-A SVC -j DNAT --to-destination 10.244.1.2:80\nCOMMIT\n"},
	{"jumped-to chain removed: the shared jump becomes unknown in the new parse only",
		"*nat\n:PREROUTING ACCEPT [0:0]\n:SVC - [0:0]\n-A PREROUTING -d 10.96.0.1/32 -j SVC\n-A SVC -j DNAT --to-destination 10.244.1.2:80\nCOMMIT\n",
		"*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -d 10.96.0.1/32 -j SVC\nCOMMIT\n"},
	{"a jump to a missing chain, then the chain appears",
		"*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -d 10.96.0.1/32 -j SVC\nCOMMIT\n",
		"*nat\n:PREROUTING ACCEPT [0:0]\n:SVC - [0:0]\n-A PREROUTING -d 10.96.0.1/32 -j SVC\n-A SVC -j DNAT --to-destination 10.244.1.2:80\nCOMMIT\n"},
	{"the same line twice in a chain",
		"*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp -j ACCEPT\nCOMMIT\n",
		"*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -s 10.0.0.1/32 -j DROP\n-A INPUT -p tcp -j ACCEPT\n-A INPUT -p tcp -j ACCEPT\nCOMMIT\n"},
	{"a line moved to another chain and table",
		"*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n-A INPUT -p tcp -j ACCEPT\nCOMMIT\n",
		"*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n-A FORWARD -p tcp -j ACCEPT\nCOMMIT\n*mangle\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp -j ACCEPT\nCOMMIT\n"},
	{"counters and -I lines",
		"*filter\n:INPUT ACCEPT [0:0]\n[1:60] -A INPUT -p tcp -j ACCEPT\nCOMMIT\n",
		"*filter\n:INPUT ACCEPT [0:0]\n[9:540] -A INPUT -p tcp -j ACCEPT\n-I INPUT -p udp -j DROP\nCOMMIT\n"},
	{"nothing changed", busyRules(20, 0), busyRules(20, 0)},
	{"a Service added among many", busyRules(20, 0), busyRules(21, 0)},
	{"a Service removed among many", busyRules(20, 0), busyRules(20, 3)},
}

// busyRules is kube-proxy's iptables mode for n Services, without
// Service skip.
func busyRules(n, skip int) string {
	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n")
	for i := range n {
		if i != skip || skip == 0 {
			fmt.Fprintf(&b, ":KUBE-SVC-%d - [0:0]\n", i)
		}
	}
	b.WriteString("-A PREROUTING -j KUBE-SERVICES\n")
	for i := range n {
		if i == skip && skip != 0 {
			continue
		}
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d 10.96.%d.%d/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-%d\n", i/250, i%250, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%d -s 10.244.%d.%d/32 -j MARK --set-xmark 0x4000/0x4000\n", i, i/250, i%250)
		fmt.Fprintf(&b, "-A KUBE-SVC-%d -p tcp -m tcp -j DNAT --to-destination 10.244.%d.%d:8080\n", i, i/250, i%250)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// checkReuse parses after sharing before's rules: it must equal a fresh
// parse of after, and before's rules must be as they were parsed.
func checkReuse(t *testing.T, before, after string) (prev, got *Ruleset) {
	t.Helper()
	prev, err := ParseSaveString(before, IPv4)
	if err != nil {
		t.Fatal(err)
	}
	got, err = ParseSaveReusing(after, IPv4, prev)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ParseSaveString(after, IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the parse sharing the earlier rules differs from a fresh one:\n%s\nwant\n%s", dumpRules(got), dumpRules(want))
	}
	if again, _ := ParseSaveString(before, IPv4); !reflect.DeepEqual(prev, again) {
		t.Errorf("the earlier parse changed:\n%s\nwas\n%s", dumpRules(prev), dumpRules(again))
	}
	return prev, got
}

func dumpRules(rs *Ruleset) string {
	var b strings.Builder
	for _, r := range rs.Rules() {
		fmt.Fprintf(&b, "%s #%d target %v %q: %s\n", r.Chain, r.Index, r.Target.Kind, r.Target.Chain, r.Text)
	}
	return b.String()
}

func TestParseSaveReusingParsesAsAFreshParse(t *testing.T) {
	for _, c := range reuseCases {
		t.Run(c.name, func(t *testing.T) { checkReuse(t, c.before, c.after) })
	}
}

// An unchanged rule is the earlier parse's own, not a copy: what a node's
// successive states share.
func TestParseSaveReusingSharesUnchangedRules(t *testing.T) {
	prev, got := checkReuse(t, busyRules(20, 0), busyRules(21, 0))
	shared, total := 0, 0
	for _, r := range got.Rules() {
		total++
		if slicesContainsPtr(prev.Rules(), r) {
			shared++
		}
	}
	// The 41 rules of the first 20 Services' chains and the jump to
	// KUBE-SERVICES keep their place; KUBE-SERVICES' 20 are unchanged too.
	if want := 61; shared != want {
		t.Errorf("%d of %d rules shared, want %d", shared, total, want)
	}
}

func slicesContainsPtr(rs []*Rule, r *Rule) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func FuzzParseSaveReusing(f *testing.F) {
	for _, c := range reuseCases {
		f.Add(c.before, c.after)
	}
	f.Add(readTestdata(f, "appended.save"), readTestdata(f, "prepended.save"))
	f.Fuzz(func(t *testing.T, before, after string) {
		prev, err := ParseSaveString(before, IPv4)
		if err != nil {
			return
		}
		got, err := ParseSaveReusing(after, IPv4, prev)
		want, wantErr := ParseSaveString(after, IPv4)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("errors differ: %v, fresh %v", err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("differs from a fresh parse:\n%s\nwant\n%s", dumpRules(got), dumpRules(want))
		}
		if again, _ := ParseSaveString(before, IPv4); !reflect.DeepEqual(prev, again) {
			t.Fatal("the earlier parse changed")
		}
	})
}

// BenchmarkParseSaveReusing parses kube-proxy's rules for 10,000 Services
// after a Service was added: afresh, and sharing the parse from before
// the change, as the node watcher does.
func BenchmarkParseSaveReusing(b *testing.B) {
	before, after := busyRules(10000, 0), busyRules(10001, 0)
	prev, err := ParseSaveString(before, IPv4)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParseSaveString(after, IPv4); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reusing", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParseSaveReusing(after, IPv4, prev); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// tokenizeByBuilder is tokenize as it was, copying every word: what the
// slicing tokenize must agree with.
func tokenizeByBuilder(line string) ([]string, error) {
	var toks []string
	var b strings.Builder
	inWord, inQuote := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case inQuote && ch == '\\' && i+1 < len(line):
			i++
			b.WriteByte(line[i])
		case ch == '"':
			inQuote = !inQuote
			inWord = true
		case !inQuote && (ch == ' ' || ch == '\t'):
			if inWord {
				toks = append(toks, b.String())
				b.Reset()
				inWord = false
			}
		default:
			b.WriteByte(ch)
			inWord = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote")
	}
	if inWord {
		toks = append(toks, b.String())
	}
	return toks, nil
}

func FuzzTokenize(f *testing.F) {
	for _, s := range []string{
		`-A X -m comment --comment "dnat name: \"cbr0\" id: \"abc\"" -j Y`,
		`-A X -m comment --comment ""`, `a"b c"d e`, `"unterminated`, `"\`, "a\tb  c ", `x\y "p\"q"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		got, err := tokenize(line)
		want, wantErr := tokenizeByBuilder(line)
		if (err == nil) != (wantErr == nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("tokenize(%q) = %q, %v; want %q, %v", line, got, err, want, wantErr)
		}
	})
}
