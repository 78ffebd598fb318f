package lab

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/tracer-dev/tracer/internal/netlab"
	"github.com/tracer-dev/tracer/internal/trace"
)

// attempt is one connection a scenario makes, with what it should show.
type attempt struct {
	from  netlab.Namespace
	srcIP string
	dst   string // "IP:PORT", ICMP: "IP"
	exp   Expectation
}

// tcp, udp and icmp describe attempts from a pod or an outside host.
func tcp(from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	return newAttempt("tcp", from, dst, m, exp)
}

func udp(from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	return newAttempt("udp", from, dst, m, exp)
}

func icmp(from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	return newAttempt("icmp", from, dst, m, exp)
}

// udp6 is udp over IPv6, from the endpoint's IPv6 address.
func udp6(from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	a := newAttempt("udp", from, dst, m, exp)
	a.srcIP = from.addr6()
	return a
}

// icmp6 is a ping over ICMPv6 from the endpoint's IPv6 address.
func icmp6(from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	a := newAttempt("icmpv6", from, dst, m, exp)
	a.srcIP = from.addr6()
	return a
}

// tcp6 is tcp over IPv6, from the endpoint's IPv6 address in a dual-stack
// cluster; dst is "[IP]:PORT".
func tcp6(from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	a := newAttempt("tcp", from, dst, m, exp)
	a.srcIP = from.addr6()
	return a
}

func newAttempt(proto string, from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	exp.Proto, exp.Mechanism = proto, m
	if exp.Verdict == "" {
		exp.Verdict = trace.VerdictOK
	}
	return attempt{from: from.netns(), srcIP: from.addr(), dst: dst, exp: exp}
}

// endpoint is where an attempt starts: a pod or an outside host.
type endpoint interface {
	netns() netlab.Namespace
	addr() string
	addr6() string
}

func (p *pod) netns() netlab.Namespace  { return p.ns }
func (p *pod) addr() string             { return p.ip }
func (p *pod) addr6() string            { return p.ip6 }
func (h *host) netns() netlab.Namespace { return h.ns }
func (h *host) addr() string            { return h.ip }
func (h *host) addr6() string           { return h.ip6 }

// run makes the attempts one after the other, so each flow stands alone in
// a trace and in the node's counters, fills in what the client saw, and
// reads what the node did (Proof) around each.
func (c *cluster) run(ctx context.Context, n *node, atts []attempt) ([]Expectation, error) {
	var out []Expectation
	ipvs := n.kp != nil && n.kp.ipvs
	nft := n.nftables()
	for _, a := range atts {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		// IPVS's tables are only read after: the attempt's own connection
		// is found by its source port, not by a difference.
		before, err := readCounters(n.ns, a.from, false, nft, c.dualStack)
		if err != nil {
			return out, fmt.Errorf("traffic: %w", err)
		}
		e := a.exp
		e.Dst = a.dst
		switch e.Proto {
		case "tcp":
			e.Src, e.Saw, err = dialTCP(ctx, a.from, a.srcIP, a.dst)
		case "udp":
			e.Src, e.Saw, err = exchangeUDP(ctx, a.from, a.srcIP, a.dst)
		case "icmp":
			e.Src = a.srcIP
			e.Saw, err = ping(ctx, a.from, a.srcIP, a.dst)
		case "icmpv6":
			e.Src = a.srcIP
			e.Saw, err = ping6(ctx, a.from, a.srcIP, a.dst)
		default:
			err = fmt.Errorf("unknown protocol %q", e.Proto)
		}
		if err != nil {
			return out, fmt.Errorf("traffic: %w", err)
		}
		e.narrow()
		after, err := readCounters(n.ns, a.from, ipvs, nft, c.dualStack)
		if err != nil {
			return out, fmt.Errorf("traffic: %w", err)
		}
		ct, err := conntrackEntry(n.ns, e.Proto, e.Src, e.Dst)
		if err != nil {
			return out, fmt.Errorf("traffic: %w", err)
		}
		c.prove(&e, before, after, ct)
		out = append(out, e)
	}
	return out, nil
}

// family is the address family a scenario's attempts use: IPv4, or IPv6
// in the dual-stack twin of a scenario, which builds the same cluster with
// addresses of both families (ip6Of) and makes its attempts over IPv6.
type family struct{ v6 bool }

var (
	ipv4Attempts = family{}
	ipv6Attempts = family{v6: true}
)

func (f family) tcp(from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	if f.v6 {
		return tcp6(from, dst, m, exp)
	}
	return tcp(from, dst, m, exp)
}

func (f family) udp(from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	if f.v6 {
		return udp6(from, dst, m, exp)
	}
	return udp(from, dst, m, exp)
}

func (f family) icmp(from endpoint, dst string, m Mechanism, exp Expectation) attempt {
	if f.v6 {
		return icmp6(from, dst, m, exp)
	}
	return icmp(from, dst, m, exp)
}

// ip is the address of f's family of an IPv4 address of the scenario: the
// address itself, or its IPv6 twin.
func (f family) ip(v4 string) string {
	if f.v6 {
		return ip6Of(v4)
	}
	return v4
}

// at is "IP:PORT" ("[IP]:PORT") for the IPv4 address v4 or its twin.
func (f family) at(v4 string, port int) string {
	return net.JoinHostPort(f.ip(v4), strconv.Itoa(port))
}

// pod and node are a pod's and a node's address of f's family.
func (f family) pod(p *pod) string {
	if f.v6 {
		return p.ip6
	}
	return p.ip
}

func (f family) podAt(p *pod, port int) string {
	return net.JoinHostPort(f.pod(p), strconv.Itoa(port))
}

func (f family) nodeAt(n *node, port int) string {
	ip := n.ip
	if f.v6 {
		ip = n.ip6
	}
	return net.JoinHostPort(ip, strconv.Itoa(port))
}
