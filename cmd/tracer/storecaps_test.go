package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

func TestStoreCapsFlags(t *testing.T) {
	for _, c := range []struct {
		flows  int
		memory string
		want   trace.Caps
	}{
		{trace.DefaultCaps.Flows, defaultMaxMemory, trace.DefaultCaps},
		{1000, "1GiB", trace.Caps{Flows: 1000, Memory: 1 << 30}},
		{0, "512M", trace.Caps{Memory: 512 << 20}},
		{5, "0", trace.Caps{Flows: 5}},
		{5, "16777216", trace.Caps{Flows: 5, Memory: 16 << 20}},
		{5, " 20 MiB ", trace.Caps{Flows: 5, Memory: 20 << 20}},
	} {
		got, err := (&storeCaps{flows: c.flows, memory: c.memory}).caps()
		if err != nil || got != c.want {
			t.Errorf("--max-flows %d --max-memory %q: %+v, %v; want %+v", c.flows, c.memory, got, err, c.want)
		}
	}
}

func TestStoreCapsBadValuesExitTwo(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "--max-flows", "-1", incidentTrace}, "--max-flows -1: must not be negative"},
		{[]string{"replay", "--max-flows", "many", incidentTrace}, `invalid value "many" for flag -max-flows`},
		{[]string{"replay", "--max-memory", "1TB", incidentTrace}, `--max-memory "1TB": want a whole number of bytes`},
		{[]string{"replay", "--max-memory", "1.5GiB", incidentTrace}, `--max-memory "1.5GiB": want a whole number`},
		{[]string{"replay", "--max-memory", "1MiB", incidentTrace}, "--max-memory 1MiB: must be at least 16MiB"},
		{[]string{"replay", "--max-memory", "99999999999GiB", incidentTrace}, "is too large"},
		{[]string{"ui", "--max-memory", "-5M"}, `--max-memory "-5M": want a whole number`},
		{[]string{"lab", "--max-flows", "-3"}, "--max-flows -3: must not be negative"},
	} {
		code, _, stderr := runTracer(c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
}

// FuzzParseSize: a --max-memory value is a size or an error;
// every size it takes is non-negative and reads back from its bytes.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"256MiB", "0", "16M", " 1 GiB", "9223372036854775807", "4611686018427387904K", "-1", "1.5G", "KiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("parseSize(%q) = %d", s, n)
		}
		if back, err := parseSize(strconv.FormatInt(n, 10)); err != nil || back != n {
			t.Fatalf("parseSize(%q) = %d, which reads back as %d, %v", s, n, back, err)
		}
	})
}
