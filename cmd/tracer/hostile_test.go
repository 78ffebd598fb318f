package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hostileValues are values no flag of theirs accepts: each must be refused
// with a message and exit 2 before anything is attached, read or written.
var hostileValues = map[string][]string{
	"duration":    {"", "-1s", "abc", "9999999999999h", "1e9", "\x00"},
	"linger":      {"", "-1s", "abc", "9999999999999h"},
	"filter":      {"port:99999", "port:-1", "pod:", "verdict:nope", "proto:gre", "ip:300.1.1.1", "ip:10.0.0.0/99", "!", "\x00:x"},
	"netns":       {"/nonexistent/netns", "/", "\x00"},
	"kubeconfig":  {"/nonexistent/kubeconfig", "/"},
	"metadata":    {"/nonexistent/metadata.json", "/", "GARBAGE"},
	"o":           {"", "yaml", "json,text", strings.Repeat("x", 1<<16)},
	"only":        {"nope", ",", "fentry,,kprobe", "netfilter,netfilter,bogus"},
	"max-flows":   {"-1", "abc", "99999999999999999999999", "0x"},
	"max-memory":  {"-5", "1XB", "", "99999999999999999999GiB", "1.5.5MiB"},
	"ring-buffer": {"", "0", "-16MiB", "1000", "3MiB", "32KiB", "2GiB", "16MB", "99999999999999999999GiB"},
	"record":      {"/nonexistent-dir/trace.ndjson", "/"},
	"listen":      {"nohost", "127.0.0.1:99999", ":-1", "\x00", "192.0.2.1:4245"},
	"socket":      {"/nonexistent-dir/agent.sock", "/", "\x00"},
	"health":      {"nohost", "127.0.0.1:99999", "192.0.2.1:4246"},
	"window":      {"", "-1s", "abc"},
	"buffer":      {"-1", "abc", "2000000", "99999999999999999999"},
}

// garbage is a file that is no metadata, kubeconfig or trace.
func garbage(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(p, []byte("\x00\xff{not json: ["), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHostileFlagValues tries every command's flags with malformed,
// empty, huge and hostile values: each gets exit 2 and a message naming
// the problem, never a panic, a hang or a run.
func TestHostileFlagValues(t *testing.T) {
	if k := os.Getenv("TRACER_VM_KERNEL"); k != "" {
		// Flags are checked before anything touches the kernel: the
		// host's run covers every kernel (11 s a guest under TCG).
		t.Skipf("flag validation: runs on the host tier, not in the %s VM", k)
	}
	junk := garbage(t)
	trace := "../../internal/predict/testdata/ipvs-node.ndjson"
	commands := map[string][]string{
		"trace":   {"duration", "linger", "filter", "netns", "kubeconfig", "metadata", "o", "only", "record", "ring-buffer"},
		"ui":      {"duration", "linger", "filter", "netns", "kubeconfig", "metadata", "only", "max-flows", "max-memory", "record", "ring-buffer"},
		"replay":  {"filter", "max-flows", "max-memory", "o"},
		"doctor":  {"o", "only"},
		"lab":     {"linger", "max-flows", "max-memory", "o", "record"},
		"explain": {"netns", "kubeconfig", "metadata", "o"},
		"audit":   {"netns", "kubeconfig", "metadata", "o"},
		"agent":   {"duration", "linger", "filter", "netns", "kubeconfig", "metadata", "only", "record", "listen", "socket", "health", "ring-buffer"},
		"connect": {"o", "filter", "duration", "window", "buffer"},
	}
	tried := 0
	defer func() { t.Logf("%d hostile flag values tried over %d commands", tried, len(commands)) }()
	for cmd, flags := range commands {
		for _, flag := range flags {
			for _, v := range hostileValues[flag] {
				tried++
				if v == "GARBAGE" {
					v = junk
				}
				args := []string{cmd, "--" + flag + "=" + v}
				switch cmd {
				case "replay":
					args = append(args, trace)
				case "explain":
					args = append(args, "10.244.1.7", "10.96.0.20:3306")
				case "lab":
					args = append(args, "no-such-scenario")
				case "connect":
					args = append(args, "127.0.0.1:1")
				}
				checkRefused(t, args, flag)
			}
		}
	}
}

func checkRefused(t *testing.T, args []string, flag string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	var code int
	var out, errs strings.Builder
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("%q: panic: %v", args, r)
				code = -1
			}
		}()
		code = dispatch(ctx, args, &out, &errs)
	}()
	<-done
	short := shorten(args)
	switch {
	case code == -1:
	case code != 2:
		t.Errorf("%q: exit %d, want 2; stderr %q", short, code, shorten([]string{errs.String()}))
	case !strings.Contains(errs.String(), "tracer: "):
		t.Errorf("%q: exit 2 without a message; stderr %q", short, errs.String())
	case flag != "" && !strings.Contains(errs.String(), flag):
		t.Errorf("%q: exit 2, but the message does not name --%s: %q", short, flag, shorten([]string{errs.String()}))
	}
}

func shorten(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		if len(s) > 80 {
			s = s[:80] + "…"
		}
		out[i] = s
	}
	return out
}

// A bad flag next to --record FILE leaves an existing FILE as it was.
func TestBadFlagKeepsExistingRecording(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "kept.ndjson")
	const before = "what was written before\n"
	if err := os.WriteFile(rec, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"trace", "--record", rec, "--filter", "port:99999"},
		{"trace", "--record", rec, "--only", "nope"},
		{"ui", "--record", rec, "--max-memory", "-5"},
		{"lab", "--record", rec, "--linger", "-1s", "no-such-scenario"},
	} {
		checkRefused(t, args, "")
		b, err := os.ReadFile(rec)
		if err != nil || string(b) != before {
			t.Fatalf("%q: the recording is now %q (%v)", args, b, err)
		}
	}
}
