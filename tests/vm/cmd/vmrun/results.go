package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
)

// outcome of one test on one kernel.
type outcome struct {
	Status string // "pass", "skip", "fail"
	Reason string // first line of the skip message (or failure message)
	// Trail is a failed test's last log entries, "file.go:N: first line",
	// oldest first. The failure is among them even when cleanups log after
	// it (the control-plane helpers print their logs' tails last), and
	// go test's output does not tell an error from a log line.
	Trail []string
}

// maxTrail is how many of a failed test's last log entries are kept.
const maxTrail = 6

// testResult is one test (or subtest) of one package.
type testResult struct {
	Name string
	outcome
}

var (
	reState = regexp.MustCompile(`^=== (RUN|CONT|NAME|PAUSE)\s+(\S+)`)
	reEnd   = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+) \(`)
	// A log entry from t.Log/t.Skip/t.Error: "    file_test.go:12: message".
	reLog = regexp.MustCompile(`^\s+([^\s:]+\.go:\d+): (.*)$`)
)

// parseTestOutput reads `-test.v` output of one test binary and returns the
// tests in the order they finished. The reason of a skipped or failed test is
// the first line of the last log entry it wrote (for a skip: the t.Skip
// message).
func parseTestOutput(r io.Reader) ([]testResult, error) {
	var (
		out      []testResult
		current  string
		lastLog  = map[string]string{}
		trail    = map[string][]string{}
		lastFail = -1 // index in out of the last failed test
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := reState.FindStringSubmatch(line); m != nil {
			current = m[2]
			continue
		}
		if m := reEnd.FindStringSubmatch(line); m != nil {
			name := m[2]
			res := testResult{Name: name, outcome: outcome{Status: strings.ToLower(m[1])}}
			if res.Status != "pass" {
				res.Reason = lastLog[name]
			}
			if res.Status == "fail" {
				res.Trail = trail[name]
			}
			out = append(out, res)
			if res.Status == "fail" {
				lastFail = len(out) - 1
			}
			continue
		}
		if strings.HasPrefix(line, "panic: ") && lastFail >= 0 && out[lastFail].Reason == "" {
			// A panicking test prints its --- FAIL line before the panic.
			out[lastFail].Reason = line
			continue
		}
		if m := reLog.FindStringSubmatch(line); m != nil && current != "" {
			msg := strings.TrimSpace(m[2])
			lastLog[current] = msg
			t := append(trail[current], m[1]+": "+truncate(msg, maxReason))
			if len(t) > maxTrail {
				t = t[1:]
			}
			trail[current] = t
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read test output: %w", err)
	}
	return out, nil
}

// matrix collects outcomes per test row and kernel column.
type matrix struct {
	kernels []string
	rows    []string
	cells   map[string]map[string]outcome // row -> kernel -> outcome
	notes   []string                      // kernel-level problems (timeouts, panics, package failures)
}

func newMatrix(kernels []string) *matrix {
	return &matrix{kernels: kernels, cells: map[string]map[string]outcome{}}
}

func (m *matrix) add(kernel, row string, o outcome) {
	if _, ok := m.cells[row]; !ok {
		m.cells[row] = map[string]outcome{}
		m.rows = append(m.rows, row)
	}
	m.cells[row][kernel] = o
}

func (m *matrix) note(format string, args ...any) {
	m.notes = append(m.notes, fmt.Sprintf(format, args...))
}

// counts returns the number of passed, failed and skipped cells.
func (m *matrix) counts() (pass, fail, skip int) {
	for _, r := range m.cells {
		for _, o := range r {
			switch o.Status {
			case "pass":
				pass++
			case "fail":
				fail++
			case "skip":
				skip++
			}
		}
	}
	return
}

// failures lists every failed cell as "kernel test: reason", sorted, so
// the last lines of a run (all a CI excerpt may keep) name what failed.
func (m *matrix) failures() []string {
	var out []string
	for row, byKernel := range m.cells {
		for kernel, o := range byKernel {
			if o.Status != "fail" {
				continue
			}
			line := kernel + " " + row
			if len(o.Trail) > 0 {
				line += ", its last log entries:\n      " + strings.Join(o.Trail, "\n      ")
			} else if o.Reason != "" {
				line += ": " + truncate(o.Reason, maxReason)
			}
			out = append(out, line)
		}
	}
	sort.Strings(out)
	return out
}

// truncate cuts s to n bytes and marks the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// maxReason caps a reason printed under the table; the full text is in the
// console output and the package log.
const maxReason = 240

// write prints the table: one row per test, one column per kernel. Skip and
// failure reasons are numbered below the table so columns stay narrow.
func (m *matrix) write(w io.Writer) {
	rows := append([]string(nil), m.rows...)
	sort.Strings(rows)
	var reasons []string
	reasonID := map[string]int{}
	cell := func(o outcome, ok bool) string {
		if !ok {
			return "-"
		}
		s := strings.ToUpper(o.Status)
		if o.Status == "pass" {
			s = "pass"
		}
		if o.Reason != "" {
			id, seen := reasonID[o.Reason]
			if !seen {
				reasons = append(reasons, o.Reason)
				id = len(reasons)
				reasonID[o.Reason] = id
			}
			s += fmt.Sprintf(" [%d]", id)
		}
		return s
	}
	table := [][]string{append([]string{"test"}, m.kernels...)}
	for _, r := range rows {
		line := []string{r}
		for _, k := range m.kernels {
			o, ok := m.cells[r][k]
			line = append(line, cell(o, ok))
		}
		table = append(table, line)
	}
	widths := make([]int, len(table[0]))
	for _, l := range table {
		for i, c := range l {
			widths[i] = max(widths[i], len(c))
		}
	}
	for i, l := range table {
		for j, c := range l {
			fmt.Fprintf(w, "%-*s", widths[j]+2, c)
		}
		fmt.Fprintln(w)
		if i == 0 {
			for j := range l {
				fmt.Fprintf(w, "%s  ", strings.Repeat("-", widths[j]))
			}
			fmt.Fprintln(w)
		}
	}
	for i, r := range reasons {
		fmt.Fprintf(w, "[%d] %s\n", i+1, truncate(r, maxReason))
	}
	for _, n := range m.notes {
		fmt.Fprintf(w, "!! %s\n", n)
	}
}
