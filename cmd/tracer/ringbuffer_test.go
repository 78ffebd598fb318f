package main

import (
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/loader"
)

// TestRingBufferFlag: --ring-buffer's default is the loader's, the bounds
// and powers of two pass, and a size the kernel would refuse is a usage
// error naming the flag, before anything attaches.
func TestRingBufferFlag(t *testing.T) {
	for _, c := range []struct {
		value string
		want  int
	}{
		{defaultRingBuffer, loader.DefaultRingBuffer},
		{"64KiB", loader.MinRingBuffer},
		{"1GiB", loader.MaxRingBuffer},
		{"4M", 4 << 20},
	} {
		o := traceOptions{ringBuffer: c.value}
		if got, err := o.ringBufferSize(); got != c.want || err != nil {
			t.Errorf("--ring-buffer %s: %d, %v; want %d", c.value, got, err, c.want)
		}
	}
	for _, v := range []string{"3MiB", "32KiB", "2GiB", "0", "16MB"} {
		code, _, stderr := runTracer("trace", "--ring-buffer", v)
		if code != 2 || !strings.Contains(stderr, "--ring-buffer") {
			t.Errorf("--ring-buffer %s: exit %d, stderr %q; want 2 naming the flag", v, code, stderr)
		}
	}
}
