// Package predict walks a connection that has not been made through a
// node's recorded state, the way the kernel would take its first packet:
// the NAT hooks (iptables and native nftables, in priority order), IPVS,
// the filter hooks and the local stack. It writes down the decisions the
// kernel would report as the events the tracer captures, and lets
// internal/enrich attribute and diagnose that flow, so a prediction gets
// the verdict, rule and explanation a live trace of the same connection
// would get. `tracer explain` and `tracer audit` are built on it.
//
// What the walk cannot know is said, not guessed: a match on state it has
// not been given, a random endpoint choice, a reply's route.
package predict

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Conn is a connection that has not been made.
type Conn struct {
	Proto string // tcp, udp, icmp, icmpv6
	Src   netip.Addr
	// Dst is the address and port the client connects to; port 0 for
	// ICMP.
	Dst netip.AddrPort
}

// Via is the value predicted events carry in their via field: no program
// saw them.
const Via = "predicted"

// Prediction is where a connection would go and what the tracer would say
// of it.
type Prediction struct {
	Conn Conn
	// Flow is the flow the kernel's decisions would make, enriched as a
	// live flow is: verdict, explanation, rule, pods and Service.
	Flow *trace.Flow
	// Steps are the decisions on the way, in order, in plain words.
	Steps []string
	// Uncertain says what the walk could not decide; the verdict holds
	// for the branch it took.
	Uncertain []string
}

// Verdict is the verdict the tracer would give the connection: ok when
// nothing on the node decided anything.
func (p *Prediction) Verdict() string {
	if p.Flow.Verdict == "" {
		return trace.VerdictOK
	}
	return p.Flow.Verdict
}

// Predict walks c through the node env describes.
func Predict(env enrich.Env, c Conn) (*Prediction, error) {
	c = c.normal()
	if err := c.validate(); err != nil {
		return nil, err
	}
	w := newWalk(env, c)
	w.run()
	f := w.flow()
	enrich.Enrich(f, env)
	p := &Prediction{Conn: c, Flow: f, Steps: w.steps, Uncertain: w.uncertain}
	p.checkRule(w.decided)
	return p, nil
}

// normal is c as the kernel sees it: a ping to an IPv6 address is ICMPv6,
// and ICMP has no port.
func (c Conn) normal() Conn {
	if c.Proto == "icmp" && c.Dst.Addr().Unmap().Is6() {
		c.Proto = "icmpv6"
	}
	if c.Proto == "icmp" || c.Proto == "icmpv6" {
		c.Dst = netip.AddrPortFrom(c.Dst.Addr(), 0)
	}
	return c
}

func (c Conn) validate() error {
	switch c.Proto {
	case "tcp", "udp", "sctp":
		if c.Dst.Port() == 0 {
			return fmt.Errorf("predict %s to %s: a destination port is needed", c.Proto, c.Dst.Addr())
		}
	case "icmp", "icmpv6":
	default:
		return fmt.Errorf("predict: unknown protocol %q (tcp, udp, sctp, icmp, icmpv6)", c.Proto)
	}
	if !c.Src.IsValid() || !c.Dst.Addr().IsValid() {
		return fmt.Errorf("predict %s: source and destination addresses are needed", c.Proto)
	}
	if c.Src.Unmap().Is4() != c.Dst.Addr().Unmap().Is4() {
		return fmt.Errorf("predict %s from %s to %s: the addresses are of different families", c.Proto, c.Src, c.Dst.Addr())
	}
	return nil
}

// checkRule notes when the rule enrich attributed to the predicted events
// is not the one the walk found deciding: the two walks take different
// ways through a rule they cannot decide.
func (p *Prediction) checkRule(decided string) {
	r := p.Flow.Rule
	if decided == "" || r == nil || r.Text == decided {
		return
	}
	p.Uncertain = append(p.Uncertain, fmt.Sprintf("the walk ended at `%s`, the attribution of its decision at `%s`", decided, r.Text))
}

// flow is the flow the walk's events make, as the joiner would build it.
func (w *walk) flow() *trace.Flow {
	f := &trace.Flow{
		Type:   "flow",
		Time:   w.at,
		Proto:  w.c.Proto,
		Orig:   trace.Tuple{Src: endpoint(w.src), Dst: endpoint(w.c.Dst)},
		Events: w.events,
	}
	if w.dst != w.c.Dst {
		f.Reply = &trace.Tuple{Src: endpoint(w.dst), Dst: endpoint(w.src)}
	}
	if w.replyBypasses {
		// What conntrack on this node will say of it: never replied.
		f.Conntrack = &trace.Conntrack{State: "SYN_SENT", Replied: false}
	}
	return f
}

// endpoint writes an address as the trace does: IP:PORT, or the bare IP
// for a port-less protocol.
func endpoint(ap netip.AddrPort) string {
	if ap.Port() == 0 {
		return ap.Addr().String()
	}
	return ap.String()
}

// packet is the trace tuple of the packet at the current hook.
func (w *walk) packet() *trace.Tuple {
	return &trace.Tuple{Src: endpoint(w.src), Dst: endpoint(w.dst)}
}

func (w *walk) event(kind, hook string) trace.Event {
	return trace.Event{Kind: kind, Time: w.at, Hook: hook, Via: Via, Proto: w.c.Proto}
}

func (w *walk) note(format string, args ...any) {
	w.steps = append(w.steps, fmt.Sprintf(format, args...))
}

// doubt notes what the walk could not decide, once: the same reason met
// at several hooks (an unreadable ruleset) is one doubt.
func (w *walk) doubt(format string, args ...any) {
	if d := fmt.Sprintf(format, args...); !slices.Contains(w.uncertain, d) {
		w.uncertain = append(w.uncertain, d)
	}
}

// now is the time predicted events carry; a variable so that tests pin it.
var now = time.Now
