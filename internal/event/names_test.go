package event

import "testing"

func TestICMPName(t *testing.T) {
	tests := []struct {
		v4        bool
		typ, code uint8
		want      string
	}{
		{true, 3, 3, "icmp-port-unreachable"},
		{true, 3, 13, "icmp-admin-prohibited"},
		{true, 11, 0, "icmp-time-exceeded"},
		{true, 3, 7, "icmp type 3 code 7"},
		{true, 1, 4, "icmp type 1 code 4"},
		{false, 1, 0, "icmp6-no-route"},
		{false, 1, 1, "icmp6-adm-prohibited"},
		{false, 1, 3, "icmp6-addr-unreachable"},
		{false, 1, 4, "icmp6-port-unreachable"},
		{false, 1, 5, "icmp6-policy-fail"},
		{false, 1, 6, "icmp6-reject-route"},
		{false, 3, 0, "icmp6-time-exceeded"},
		{false, 3, 1, "icmp6-time-exceeded"},
		{false, 1, 2, "icmp6-beyond-scope"},
		{false, 2, 0, "icmp6-packet-too-big"},
		{false, 4, 1, "icmp6-parameter-problem"},
		{true, 3, 4, "icmp-frag-needed"},
		{false, 11, 0, "icmp type 11 code 0"},
	}
	for _, tt := range tests {
		if got := ICMPName(tt.v4, tt.typ, tt.code); got != tt.want {
			t.Errorf("ICMPName(%v, %d, %d) = %q, want %q", tt.v4, tt.typ, tt.code, got, tt.want)
		}
	}
}
