package lab

import (
	"context"
	"fmt"

	"github.com/tracer-dev/tracer/internal/netlab"
)

// attempt is one connection a scenario makes, with what it should show.
type attempt struct {
	from  netlab.Namespace
	srcIP string
	dst   string // "IP:PORT", ICMP: "IP"
	exp   Expectation
}

// tcp, udp and icmp describe attempts from a pod or an outside host.
func tcp(from endpoint, dst string, exp Expectation) attempt {
	exp.Proto = "tcp"
	return attempt{from: from.netns(), srcIP: from.addr(), dst: dst, exp: exp}
}

func udp(from endpoint, dst string, exp Expectation) attempt {
	exp.Proto = "udp"
	return attempt{from: from.netns(), srcIP: from.addr(), dst: dst, exp: exp}
}

func icmp(from endpoint, dst string, exp Expectation) attempt {
	exp.Proto = "icmp"
	return attempt{from: from.netns(), srcIP: from.addr(), dst: dst, exp: exp}
}

// endpoint is where an attempt starts: a pod or an outside host.
type endpoint interface {
	netns() netlab.Namespace
	addr() string
}

func (p *pod) netns() netlab.Namespace  { return p.ns }
func (p *pod) addr() string             { return p.ip }
func (h *host) netns() netlab.Namespace { return h.ns }
func (h *host) addr() string            { return h.ip }

// run makes the attempts one after the other, so each flow stands alone in
// a trace, and fills in what the client saw.
func run(ctx context.Context, atts []attempt) ([]Expectation, error) {
	var out []Expectation
	for _, a := range atts {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		e := a.exp
		e.Dst = a.dst
		var err error
		switch e.Proto {
		case "tcp":
			e.Src, e.Saw, err = dialTCP(ctx, a.from, a.srcIP, a.dst)
		case "udp":
			e.Src, e.Saw, err = exchangeUDP(ctx, a.from, a.srcIP, a.dst)
		case "icmp":
			e.Src = a.srcIP
			e.Saw, err = ping(ctx, a.from, a.srcIP, a.dst)
		default:
			err = fmt.Errorf("unknown protocol %q", e.Proto)
		}
		if err != nil {
			return out, fmt.Errorf("traffic: %w", err)
		}
		if e.Baseline && e.Verdict == "" {
			e.Verdict = VerdictOK
		}
		out = append(out, e)
	}
	return out, nil
}

func traffic(atts ...attempt) func(context.Context) ([]Expectation, error) {
	return func(ctx context.Context) ([]Expectation, error) { return run(ctx, atts) }
}
