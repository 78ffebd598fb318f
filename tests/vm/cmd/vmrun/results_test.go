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
		{"TestPass", outcome{Status: "pass", Reason: ""}},
		{"TestSkipAfterLog", outcome{Status: "skip", Reason: "needs IPVS: modprobe ip_vs failed"}},
		{"TestFail", outcome{Status: "fail", Reason: "cphelper: tail of etcd.log:", Trail: []string{
			"fx_test.go:5: got 1, want 2",
			"cphelper.go:361: cphelper: tail of etcd.log:",
		}}},
		{"TestSub", outcome{Status: "pass", Reason: ""}},
		{"TestSub/b", outcome{Status: "pass", Reason: ""}},
		{"TestSub/a", outcome{Status: "skip", Reason: "sub a skipped"}},
		{"TestPanic", outcome{Status: "fail", Reason: "panic: assignment to entry in nil map [recovered, repanicked]"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseTestOutput:\n got %+v\nwant %+v", got, want)
	}
}

func TestMatrixWrite(t *testing.T) {
	m := newMatrix([]string{"5.10", "6.12"})
	m.add("5.10", "pkg.TestA", outcome{Status: "skip", Reason: "no fentry"})
	m.add("6.12", "pkg.TestA", outcome{Status: "pass", Reason: ""})
	m.add("5.10", "pkg.TestB", outcome{Status: "fail", Reason: "boom"})
	m.add("6.12", "pkg.TestB", outcome{Status: "skip", Reason: "no fentry"})
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

// A failed test's cleanups may log after its failure; the failure list
// shows the trail of entries, not just the last one.
func TestFailuresShowTrail(t *testing.T) {
	m := newMatrix([]string{"6.12"})
	m.add("6.12", "pkg.TestB", outcome{Status: "fail", Reason: "tail", Trail: []string{"b_test.go:3: boom", "h.go:9: tail"}})
	want := []string{"6.12 pkg.TestB, its last log entries:\n      b_test.go:3: boom\n      h.go:9: tail"}
	if got := m.failures(); !slices.Equal(got, want) {
		t.Errorf("failures = %q, want %q", got, want)
	}
}
