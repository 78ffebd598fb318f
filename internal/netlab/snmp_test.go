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
