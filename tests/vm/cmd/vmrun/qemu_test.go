package main

import (
	"fmt"
	"reflect"
	"testing"
)

func TestConsoleTailCrash(t *testing.T) {
	var tail consoleTail
	for i := range 100 {
		tail.add(fmt.Sprintf("=== RUN   Test%d", i))
	}
	report := []string{
		"BUG: kernel NULL pointer dereference, address: 0000000000000010",
		"#PF: supervisor read access in kernel mode",
		"RIP: 0010:nf_send_reset6+0x2a/0x3f0",
		"Call Trace:",
		"Kernel panic - not syncing: Fatal exception in interrupt",
	}
	for _, l := range report {
		tail.add(l)
	}
	if got := tail.crash(); !reflect.DeepEqual(got, report) {
		t.Errorf("crash() = %q, want %q", got, report)
	}
	if n := len(tail.lines); n != consoleTailLines {
		t.Errorf("kept %d lines, want %d", n, consoleTailLines)
	}
}

// TestConsoleTailLongReport: a report longer than the tail (CI's 6.12
// int3 Oops was 82 lines) is kept from its header, and the tail goes back
// to its length once a report is more than maxCrashLines behind.
func TestConsoleTailLongReport(t *testing.T) {
	var tail consoleTail
	for i := range 100 {
		tail.add(fmt.Sprintf("=== RUN   Test%d", i))
	}
	report := []string{"Oops: int3: 0000 [#1] PREEMPT SMP NOPTI", "RIP: 0010:ip_local_deliver+0x61/0x120", "Call Trace:"}
	for i := range 100 {
		report = append(report, fmt.Sprintf(" frame%d+0x10/0x20", i))
	}
	report = append(report, "Kernel panic - not syncing: Fatal exception in interrupt")
	for _, l := range report {
		tail.add(l)
	}
	if got := tail.crash(); !reflect.DeepEqual(got, report) {
		t.Errorf("crash() kept %d lines from %q, want the %d of the report from its header", len(got), got[0], len(report))
	}
	for i := range maxCrashLines {
		tail.add(fmt.Sprintf("after %d", i))
	}
	if n := len(tail.lines); n != consoleTailLines {
		t.Errorf("kept %d lines long after the report, want %d", n, consoleTailLines)
	}
}

func TestConsoleTailCrashWithoutOops(t *testing.T) {
	var tail consoleTail
	tail.add("a")
	tail.add("b")
	if got := tail.crash(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("crash() = %q, want every kept line", got)
	}
}

func TestMayBootAgain(t *testing.T) {
	emulator := []string{
		"int3: 0000 [#1] PREEMPT SMP NOPTI",
		"RIP: 0010:nf_hook_slow+0x3c/0xb0",
		"Kernel panic - not syncing: Fatal exception in interrupt",
	}
	ours := []string{
		"BUG: unable to handle page fault for address: ffffc90000d3a000",
		"RIP: 0010:bpf_prog_6deef7357e7b4530_tr_drop_tp3+0x4f/0x1a4",
		"Kernel panic - not syncing: Fatal exception in interrupt",
	}
	cases := []struct {
		name string
		r    bootResult
		want bool
	}{
		{"a panic naming no BPF code", bootResult{Panicked: true, Crash: emulator}, true},
		{"a panic in a BPF program", bootResult{Panicked: true, Crash: ours}, false},
		{"a panic without a report", bootResult{Panicked: true}, false},
		{"a failing run", bootResult{HaveStatus: true, ExitStatus: 1}, false},
	}
	for _, c := range cases {
		if got := mayBootAgain(c.r); got != c.want {
			t.Errorf("%s: mayBootAgain = %v, want %v", c.name, got, c.want)
		}
	}
}
