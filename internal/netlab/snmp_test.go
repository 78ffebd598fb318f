package netlab

import "testing"

func TestParseSNMP(t *testing.T) {
	out := "Icmp: InMsgs OutDestUnreachs\nIcmp: 4 2\nIcmpMsg: OutType3\nIcmpMsg: 2\nTcp: RtoAlgorithm OutRsts\nTcp: 1 7\n"
	m := parseSNMP(out)
	if m["Tcp:OutRsts"] != 7 || m["Icmp:OutDestUnreachs"] != 2 || m["IcmpMsg:OutType3"] != 2 {
		t.Errorf("got %v", m)
	}
}

func FuzzParseSNMP(f *testing.F) {
	f.Add("Tcp: OutRsts\nTcp: 3\n")
	f.Fuzz(func(t *testing.T, s string) { parseSNMP(s) })
}

func TestParseSNMP6(t *testing.T) {
	out := "Ip6InReceives                   \t12\nIcmp6OutDestUnreachs            \t3\nIcmp6OutType1                   \t3\nUdp6InDatagrams                 \t5\nUdpLite6InDatagrams             \t0\nIcmp6 7\n"
	m := parseSNMP6(out)
	want := map[string]int64{"Ip6:InReceives": 12, "Icmp6:OutDestUnreachs": 3, "Icmp6:OutType1": 3, "Udp6:InDatagrams": 5, "UdpLite6:InDatagrams": 0}
	if len(m) != len(want) {
		t.Errorf("got %v, want %v", m, want)
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, m[k], v, m)
		}
	}
}

func FuzzParseSNMP6(f *testing.F) {
	f.Add("Icmp6OutDestUnreachs 3\n")
	f.Fuzz(func(t *testing.T, s string) { parseSNMP6(s) })
}
