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

func TestConsoleTailCrashWithoutOops(t *testing.T) {
	var tail consoleTail
	tail.add("a")
	tail.add("b")
	if got := tail.crash(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("crash() = %q, want every kept line", got)
	}
}
