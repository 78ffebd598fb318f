package node

import (
	"net/netip"
	"os"
	"testing"

	"github.com/cloudflare/ipvs"
)

// ipvsClient answers readIPVS as cloudflare/ipvs does: a virtual server
// without real servers is an empty dump, which it reports as
// os.ErrNotExist.
type ipvsClient struct {
	ipvs.Client
	svcs  []ipvs.ServiceExtended
	dests map[netip.Addr][]ipvs.DestinationExtended
}

func (c ipvsClient) Services() ([]ipvs.ServiceExtended, error) { return c.svcs, nil }

func (c ipvsClient) Destinations(s ipvs.Service) ([]ipvs.DestinationExtended, error) {
	d, ok := c.dests[s.Address]
	if !ok {
		return nil, os.ErrNotExist
	}
	return d, nil
}

// A virtual server without real servers is read as one, not as a failure
// to read IPVS: the 6.12 guest's ipvs-no-endpoint scenario had every
// virtual server missing from the trace header.
func TestReadIPVSServerWithoutReals(t *testing.T) {
	full, empty := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("192.168.1.201")
	c := ipvsClient{
		svcs: []ipvs.ServiceExtended{
			{Service: ipvs.Service{Address: full, Port: 80, Protocol: ipvs.TCP, Scheduler: "rr", Family: ipvs.INET}},
			{Service: ipvs.Service{Address: empty, Port: 80, Protocol: ipvs.TCP, Scheduler: "rr", Family: ipvs.INET}},
		},
		dests: map[netip.Addr][]ipvs.DestinationExtended{full: {{Destination: ipvs.Destination{Address: netip.MustParseAddr("10.244.1.2"), Port: 8080, Weight: 1}}}},
	}
	got, err := readIPVS(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got[0].Reals)+len(got[1].Reals) != 1 {
		t.Fatalf("read %+v, want both virtual servers, one with a real server", got)
	}
}
