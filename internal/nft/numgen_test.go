package nft

import (
	"net/netip"
	"testing"

	"github.com/tracer-dev/tracer/internal/rules"
)

// testdata/numgen-dnat.* is what nft 1.0.6 lists for testdata/numgen-dnat-src.nft,
// written the way kube-proxy v1.37.2 writes a Service with two endpoints
// (proxier.go writeServiceToEndpointDNATs: no endpoint chains, one DNAT
// whose address comes from a numgen map) and a Local-policy NodePort
// without a local endpoint (a `drop` element of no-endpoint-nodeports).

func TestNumgenMapDNATIsCertain(t *testing.T) {
	rs := load(t, "numgen-dnat")
	for _, to := range []string{"10.180.0.4:80", "10.180.0.5:80"} {
		at, err := rs.Attribute(tcp("10.1.0.9:40000", "172.30.0.44:80"), rules.NewMemNode(),
			rules.KernelAction{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: netip.MustParseAddrPort(to)})
		if err != nil || at == nil {
			t.Fatalf("%s: attribute: %v %v", to, at, err)
		}
		o := at.Outcome
		if at.Uncertain || o.Rule == nil || o.Rule.Handle != 15 {
			t.Fatalf("%s: got %s, uncertain %v %v", to, o.String(), at.Uncertain, at.Reasons)
		}
		if el, set := o.Element(); el == nil || set == nil || set.Name != "service-ips" || el.KeyText() != "172.30.0.44 . tcp . 80" {
			t.Errorf("%s: element %v of %v", to, el, set)
		}
	}
}

func TestNumgenMapDNATElsewhereDisagrees(t *testing.T) {
	rs := load(t, "numgen-dnat")
	at, err := rs.Attribute(tcp("10.1.0.9:40000", "172.30.0.44:80"), rules.NewMemNode(),
		rules.KernelAction{Kind: rules.ActionDNAT, Hook: "PREROUTING", To: netip.MustParseAddrPort("10.180.0.9:80")})
	if err != nil {
		t.Fatal(err)
	}
	if at != nil {
		t.Fatalf("a DNAT to an address outside the numgen map was attributed to %s", at.Outcome.String())
	}
}

// A verdict map element whose own verdict decides (`drop`) names its map,
// as an element that sent the packet to a chain does: kube-proxy's
// Local-policy drop is told from its no-endpoint-nodeports map.
func TestDropElementNamesItsMap(t *testing.T) {
	rs := load(t, "numgen-dnat")
	node := rules.NewMemNode()
	at, err := rs.Attribute(tcp("192.168.0.100:40000", "192.168.0.2:3001"), node, rules.KernelAction{Kind: rules.ActionDrop, Hook: "INPUT"})
	if err != nil || at == nil {
		t.Fatalf("attribute: %v %v", at, err)
	}
	if at.Outcome.Rule == nil || at.Outcome.Rule.Handle != 10 {
		t.Fatalf("got %s", at.Outcome.String())
	}
	el, set := at.Outcome.Element()
	if el == nil || set == nil || set.Name != "no-endpoint-nodeports" || el.Comment != "ns2/svc2:p80" {
		t.Fatalf("element %+v of %+v: want the drop element of no-endpoint-nodeports", el, set)
	}
}
