package loader

import (
	"bufio"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
)

// allFunctions is kallsyms read as the loader read it before it kept only
// the ladders' targets: every function, by strings.Fields.
func allFunctions(t *testing.T, text string) map[string]string {
	t.Helper()
	syms := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && (fields[1] == "t" || fields[1] == "T") {
			mod := ""
			if len(fields) >= 4 {
				mod = strings.Trim(fields[3], "[]")
			}
			syms[fields[2]] = mod
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reference read of kallsyms: %v", err)
	}
	return syms
}

// only is syms restricted to the names wanted.
func only(syms map[string]string, wanted map[string]bool) map[string]string {
	out := map[string]string{}
	for name, mod := range syms {
		if wanted[name] {
			out[name] = mod
		}
	}
	return out
}

func checkKallsyms(t *testing.T, text string, wanted map[string]bool) {
	t.Helper()
	got, err := parseKallsyms(strings.NewReader(text), wanted)
	if err != nil {
		t.Fatalf("parseKallsyms: %v", err)
	}
	if want := only(allFunctions(t, text), wanted); !maps.Equal(got, want) {
		t.Fatalf("parseKallsyms of %q\n got %v\nwant %v", text, got, want)
	}
}

func TestParseKallsyms(t *testing.T) {
	text := strings.Join([]string{
		"ffffffff81000000 T _text",
		"ffffffff81a1b2c0 T __icmp_send",
		"ffffffff81a1b300 t tcp_send_active_reset",
		"ffffffffc0a01000 t nf_nat_setup_info\t[nf_nat]",
		"ffffffffc0b02000 T ip_vs_conn_new  \t[ip_vs]",
		"ffffffff82000000 D nf_nat_hook",    // data, not a function
		"ffffffff82000100 b ip_vs_leave",    // bss
		"ffffffff82000200 r __ksymtab_x",    // read-only data
		"0000000000000000 t",                // no name
		"ffffffff81b00000 t  nf_send_reset", // two spaces
		"ffffffff81c00000 tt kfree_skb",     // not one letter
		"ffffffff81d00000 T unwanted_function",
		"ffffffff81e00000 T nf_send_reset6 [nf_reject_ipv6]", // last line, no newline
	}, "\n")
	wanted := map[string]bool{"_text": true, "__icmp_send": true, "tcp_send_active_reset": true,
		"nf_nat_setup_info": true, "ip_vs_conn_new": true, "nf_nat_hook": true, "ip_vs_leave": true,
		"__ksymtab_x": true, "nf_send_reset": true, "kfree_skb": true, "nf_send_reset6": true, "absent": true}
	checkKallsyms(t, text, wanted)

	got, _ := parseKallsyms(strings.NewReader(text), wanted)
	for name, mod := range map[string]string{"nf_nat_setup_info": "nf_nat", "ip_vs_conn_new": "ip_vs", "__icmp_send": "", "nf_send_reset6": "nf_reject_ipv6"} {
		if m, ok := got[name]; !ok || m != mod {
			t.Errorf("%s: module %q, found %v; want %q", name, m, ok, mod)
		}
	}
	for _, name := range []string{"nf_nat_hook", "ip_vs_leave", "__ksymtab_x", "kfree_skb", "unwanted_function", "absent"} {
		if _, ok := got[name]; ok {
			t.Errorf("%s kept; it is not a wanted function", name)
		}
	}
}

// A line longer than the reader's buffer is skipped whole; the lines
// after it still count.
func TestParseKallsymsLongLine(t *testing.T) {
	text := "ffffffff81000000 T " + strings.Repeat("x", 100<<10) + "\nffffffff81a1b2c0 T __icmp_send\n"
	got, err := parseKallsyms(strings.NewReader(text), map[string]bool{"__icmp_send": true})
	if err != nil || got["__icmp_send"] != "" || len(got) != 1 {
		t.Fatalf("parseKallsyms after a long line: %v, %v; want __icmp_send alone", got, err)
	}
}

func FuzzParseKallsyms(f *testing.F) {
	f.Add("ffffffffc0a01000 t nf_nat_setup_info\t[nf_nat]\nffffffff81a1b2c0 T __icmp_send\n")
	f.Add("0 T a [b]\n0 t a\n0 D c\n")
	f.Fuzz(func(t *testing.T, text string) {
		for _, c := range []byte(text) {
			if c >= 0x80 {
				return // strings.Fields also splits at Unicode spaces, which kallsyms never has
			}
		}
		for line := range strings.SplitSeq(text, "\n") {
			if len(line) >= 60<<10 {
				return // the reference's Scanner stops at 64 KiB
			}
		}
		wanted := map[string]bool{}
		for line := range strings.SplitSeq(text, "\n") {
			if fields := strings.Fields(line); len(fields) >= 3 && len(wanted)%2 == 0 {
				wanted[fields[2]] = true
			} else if len(fields) >= 3 {
				wanted[fields[2]+"x"] = true
			}
		}
		checkKallsyms(t, text, wanted)
	})
}

// On this machine: every ladder target is found where the full read of
// kallsyms finds it, and so is a function no ladder names.
func TestKernelSymbolMatchesFullRead(t *testing.T) {
	b, err := os.ReadFile("/proc/kallsyms")
	if err != nil {
		t.Skipf("cannot read /proc/kallsyms: %v", err)
	}
	all := allFunctions(t, string(b))
	names := slices.Sorted(maps.Keys(ladderTargets()))
	names = append(names, "tcp_v4_connect", "no_such_function_anywhere")
	for _, name := range names {
		mod, ok, readable := kernelSymbol(name)
		wantMod, want := all[name]
		if !readable || ok != want || mod != wantMod {
			t.Errorf("kernelSymbol(%q) = %q, %v, readable %v; the full read says %q, %v", name, mod, ok, readable, wantMod, want)
		}
	}
	if _, ok := all["tcp_v4_connect"]; !ok {
		t.Errorf("the full read has no tcp_v4_connect: the comparison above checked nothing found")
	}
	if n := len(targetSymbols()); n > len(ladderTargets()) {
		t.Errorf("kept %d symbols for %d targets", n, len(ladderTargets()))
	}
}
