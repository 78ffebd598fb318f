package filter

import (
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// BenchmarkMatchKeyedIPv6 is one ip: or port: term over a DNAT'd IPv6
// flow with its Store keys: what a filter keystroke costs per IPv6 flow.
func BenchmarkMatchKeyedIPv6(b *testing.B) {
	fl := &trace.Flow{Proto: "tcp", Verdict: trace.VerdictOK,
		Orig:  trace.Tuple{Src: "[fd00:10:244:1::2]:40000", Dst: "[fd00:10:96::20]:3306"},
		Reply: &trace.Tuple{Src: "[fd00:10:244:2::5]:3306", Dst: "[fd00:10:244:1::2]:40000"},
		Events: []trace.Event{{Kind: trace.KindDNAT, To: "[fd00:10:244:2::5]:3306",
			Packet: &trace.Tuple{Src: "[fd00:10:244:1::2]:40000", Dst: "[fd00:10:96::20]:3306"}}}}
	k := trace.KeysOf(fl)
	for _, expr := range []string{"ip:fd00:10:244:2::5", "ip:fd00:10:96::/108", "ip:2001:db8::/32", "port:3306", "port:53"} {
		f := MustParse(expr)
		b.Run(expr, func(b *testing.B) {
			for b.Loop() {
				f.MatchKeyed(fl, &k)
			}
		})
	}
}
