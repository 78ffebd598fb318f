package event_test

import (
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/rules"
)

// A reject seen on the wire is compared with the rule's --reject-with, so
// every ICMPv6 error name must be one the rules package maps back to the
// same type and code.
func TestICMPNameAgreesWithRejectWith(t *testing.T) {
	for _, code := range []uint8{0, 1, 3, 4, 5, 6} {
		name := event.ICMPName(false, 1, code)
		typ, c, ok := rules.RejectICMP(name, rules.IPv6)
		if !ok || typ != 1 || c != code {
			t.Errorf("ICMPName(false, 1, %d) = %q, which rules.RejectICMP reads as %d/%d ok=%v", code, name, typ, c, ok)
		}
	}
}
