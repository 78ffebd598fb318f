package filter

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// ipv6Flows: 0 a DNAT'd IPv6 connection whose addresses start with letter
// groups, 1 one to fd00::10 (which "fd00::1" as text would also find),
// 2 an IPv4 one.
func ipv6Flows() []*trace.Flow {
	return []*trace.Flow{
		{Proto: "tcp", Verdict: trace.VerdictOK, Orig: trace.Tuple{Src: "[cafe:1::2]:40000", Dst: "[fd00::1]:80"},
			Reply:  &trace.Tuple{Src: "[beef::1]:8080", Dst: "[cafe:1::2]:40000"},
			Events: []trace.Event{{Kind: trace.KindDNAT, To: "[beef::1]:8080"}}},
		{Proto: "tcp", Verdict: trace.VerdictOK, Orig: trace.Tuple{Src: "[fd00::2]:40000", Dst: "[fd00::10]:80"}},
		{Proto: "tcp", Verdict: trace.VerdictOK, Orig: trace.Tuple{Src: "10.0.0.1:40000", Dst: "10.0.0.2:80"}},
	}
}

func TestIPv6Terms(t *testing.T) {
	flows := ipv6Flows()
	for _, c := range []struct {
		expr string
		want []int
	}{
		{"beef::1", []int{0}},
		{"BEEF::1", []int{0}},
		{"cafe:1::2", []int{0}},
		{"!beef::1", []int{1, 2}},
		{"[beef::1]", []int{0}},
		{"fd00::1", []int{0}}, // an address, not the text of fd00::10
		{"fd00::/64", []int{0, 1}},
		{"ip:[fd00::1]", []int{0}},
		{"ip:[fd00::]/64", []int{0, 1}},
		{"ip:[fd00::/64]", []int{0, 1}},
		{"ip:fd00::/64", []int{0, 1}},
		{"ip:beef::/16 port:8080", []int{0}},
		{"[fd00::1]:80", []int{0}}, // an endpoint, as 10.0.0.2:80 is
		{"10.0.0.2:80", []int{2}},
		{"ip:::ffff:10.0.0.2", []int{2}},
	} {
		f, err := Parse(c.expr)
		if err != nil {
			t.Errorf("parse %q: %v", c.expr, err)
			continue
		}
		var got, gotKeyed []int
		for i, fl := range flows {
			k := trace.KeysOf(fl)
			if f.Match(fl) {
				got = append(got, i)
			}
			if f.MatchKeyed(fl, &k) {
				gotKeyed = append(gotKeyed, i)
			}
		}
		if !reflect.DeepEqual(got, c.want) || !reflect.DeepEqual(gotKeyed, c.want) {
			t.Errorf("%q matches %v (keyed %v), want %v", c.expr, got, gotKeyed, c.want)
		}
	}
}

func TestIPv6KernelTerms(t *testing.T) {
	_, pfx, _, ok := MustParse("beef::1 port:80").KernelTerms()
	if !ok || !reflect.DeepEqual(pfx, []netip.Prefix{netip.MustParsePrefix("beef::1/128")}) {
		t.Errorf("got %v %v", pfx, ok)
	}
}

func TestIPv6ParseErrors(t *testing.T) {
	for _, c := range []struct{ expr, want string }{
		{"beef:1", `unknown field "beef"`},
		{"dead:beef", `unknown field "dead"`},
		{"beef::1::2", `unknown field "beef"`},
		{"ip:[10.0.0.1]", "not an IP address or CIDR"},
		{"ip:[fd00::1", "not an IP address or CIDR"},
		{"ip:[fd00::1]:80", "not an IP address or CIDR"},
		{"ip:[fd00::/64]/64", "not an IP address or CIDR"},
	} {
		_, err := Parse(c.expr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) error %v, want %q", c.expr, err, c.want)
		}
	}
}

// The Store's keys answer ip: and port: terms for an IPv6 flow without its
// address strings.
func TestIPv6MatchedByKeys(t *testing.T) {
	k := trace.KeysOf(ipv6Flows()[0])
	bare := &trace.Flow{Proto: "tcp"}
	for _, expr := range []string{"ip:beef::1", "ip:cafe::/16", "port:8080", "fd00::1"} {
		if !MustParse(expr).MatchKeyed(bare, &k) {
			t.Errorf("%q: not matched by the keys %+v", expr, k)
		}
	}
	if MustParse("ip:10.0.0.0/8").MatchKeyed(bare, &k) || MustParse("ip:beef::2").MatchKeyed(bare, &k) {
		t.Error("matched an address the keys do not hold")
	}
}
