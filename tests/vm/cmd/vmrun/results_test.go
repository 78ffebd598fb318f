package main

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseTestOutput(t *testing.T) {
	f, err := os.Open("testdata/verbose.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := parseTestOutput(f)
	if err != nil {
		t.Fatalf("parseTestOutput: %v", err)
	}
	want := []testResult{
		{"TestPass", outcome{"pass", ""}},
		{"TestSkipAfterLog", outcome{"skip", "needs IPVS: modprobe ip_vs failed"}},
		{"TestFail", outcome{"fail", "got 1, want 2"}},
		{"TestSub", outcome{"pass", ""}},
		{"TestSub/b", outcome{"pass", ""}},
		{"TestSub/a", outcome{"skip", "sub a skipped"}},
		{"TestPanic", outcome{"fail", "panic: assignment to entry in nil map [recovered, repanicked]"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseTestOutput:\n got %+v\nwant %+v", got, want)
	}
}

func TestMatrixWrite(t *testing.T) {
	m := newMatrix([]string{"5.10", "6.12"})
	m.add("5.10", "pkg.TestA", outcome{"skip", "no fentry"})
	m.add("6.12", "pkg.TestA", outcome{"pass", ""})
	m.add("5.10", "pkg.TestB", outcome{"fail", "boom"})
	m.add("6.12", "pkg.TestB", outcome{"skip", "no fentry"})
	m.note("kernel 6.12: timed out after 20m0s")
	var b strings.Builder
	m.write(&b)
	out := b.String()
	for _, want := range []string{
		"pkg.TestA  SKIP [1]  pass",
		"pkg.TestB  FAIL [2]  SKIP [1]",
		"[1] no fentry\n",
		"[2] boom\n",
		"!! kernel 6.12: timed out after 20m0s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if p, f, s := m.counts(); p != 1 || f != 1 || s != 2 {
		t.Errorf("counts = %d passed, %d failed, %d skipped; want 1, 1, 2", p, f, s)
	}
	if got, want := m.failures(), []string{"5.10 pkg.TestB: boom"}; !slices.Equal(got, want) {
		t.Errorf("failures = %q, want %q", got, want)
	}
}
