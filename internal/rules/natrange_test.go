package rules

import "testing"

// NAT ranges are written as iptables and the event decoder write them: an
// IPv6 range is bracketed whole, so the port cannot be read into it, and
// the text reads back to the same range.
func TestNATRangeString(t *testing.T) {
	for _, want := range []string{
		"10.0.0.1", "10.0.0.1:80", "10.0.0.1-10.0.0.9:80-90", ":1024-65535",
		"[fd00::1]", "[fd00::1]:80", "[fd00::1-fd00::9]", "[fd00::1-fd00::9]:80-90",
	} {
		nr, err := parseNATRange(want)
		if err != nil {
			t.Fatalf("%s: %v", want, err)
		}
		if got := nr.String(); got != want {
			t.Errorf("%+v: got %q, want %q", nr, got, want)
		}
	}
}
