package enrich

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/tracer-dev/tracer/internal/diagnose"
	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Enrich fills a flow's rule, pods, Service, verdict and explanation from
// its events and conntrack entry. It is the whole of re-diagnosis for a
// recorded flow: what the environment cannot tell (no rules, no metadata
// in an old trace) keeps its recorded value.
func Enrich(f *trace.Flow, env Env) { EnrichBetween(f, env, nil) }

// enrich is Enrich of a flow, its events in time order, whose addresses a
// holds.
func enrich(f *trace.Flow, a *flowAddrs, env Env) {
	// A recorded rule stays when the snapshot's rules cannot say which one
	// did it (the rules may have changed since; the kernel's event is fact).
	if r, known := attribute(f, a, env); known && (r != nil || f.Rule == nil) {
		f.Rule = r
	}
	names(f, a, env)
	r := diagnose.DiagnoseAddrs(f, a.Addrs, env)
	f.Verdict, f.Explanation = r.Verdict, r.Explanation
}

// EnrichBetween is Enrich for a flow decided between two readings of the
// node's rules: env, in force when the kernel decided, and next, the
// first read after (nil when none is yet). The rules are polled, so a
// rewrite between the two readings is in env's time but not in its
// rules: when env's rule disagrees with what the kernel did and next's
// agrees, the rules had changed before the decision and next's rule is
// the one that decided.
func EnrichBetween(f *trace.Flow, env, next Env) {
	slices.SortStableFunc(f.Events, func(a, b trace.Event) int { return a.Time.Compare(b.Time) })
	a := recordedAddrs(f)
	enrichBetween(f, &a, env, next)
}

// enrichBetween is EnrichBetween of a flow, its events in time order,
// whose addresses a holds.
func enrichBetween(f *trace.Flow, a *flowAddrs, env, next Env) {
	enrich(f, a, env)
	if next == nil || f.Rule == nil || f.Rule.Uncertain == "" {
		return
	}
	before := *f
	enrich(f, a, next)
	if f.Rule == nil || f.Rule.Uncertain != "" {
		*f = before
	}
}

// names adds the pods and the Service. src_pod owns orig.src; dst_pod owns
// where the connection really went (reply.src), or the addressed pod; the
// Service is the one the client addressed.
func names(f *trace.Flow, a *flowAddrs, env Env) {
	var n flowNames
	n.src, n.srcOK = env.PodByIP(a.src.Addr(), f.Time)
	n.dst, n.dstOK = env.PodByIP(a.Went.Addr(), f.Time)
	n.svc, n.svcOK = env.ServiceByAddr(a.Dst.Addr(), a.Dst.Port(), f.Proto, f.Time)
	if r := f.Rule; r != nil && r.Owner != nil && a.dnatTo.IsValid() {
		n.owner, n.ownerOK = env.PodByIP(a.dnatTo.Addr(), f.Time)
	}
	if !n.srcOK && !n.dstOK && !n.svcOK && !n.ownerOK {
		return
	}
	if c, ok := env.(interface{ names() *nameCache }); ok {
		c.names().set(f, &n)
		return
	}
	setOwn(f, n)
}

// parseRange reads event.Range's text form IP[-IP][:PORT[-PORT]] (IPv6 in
// brackets).
func parseRange(s string) (rules.NATRange, bool) {
	var r rules.NATRange
	if s == "" {
		return r, false
	}
	addrs, ports := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return r, false
		}
		addrs, ports = s[1:end], strings.TrimPrefix(s[end+1:], ":")
	} else if i := strings.LastIndex(s, ":"); i >= 0 {
		addrs, ports = s[:i], s[i+1:]
	}
	lo, hi, _ := strings.Cut(addrs, "-")
	var err error
	if r.MinAddr, err = netip.ParseAddr(lo); err != nil {
		return r, false
	}
	r.MaxAddr = r.MinAddr
	if hi != "" {
		if r.MaxAddr, err = netip.ParseAddr(hi); err != nil {
			return r, false
		}
	}
	if ports != "" {
		plo, phi, _ := strings.Cut(ports, "-")
		var ok bool
		if r.MinPort, ok = parsePort(plo); !ok {
			return r, false
		}
		r.MaxPort = r.MinPort
		if phi != "" {
			if r.MaxPort, ok = parsePort(phi); !ok {
				return r, false
			}
		}
	}
	return r, true
}

func parsePort(s string) (uint16, bool) {
	n, err := strconv.ParseUint(s, 10, 16)
	return uint16(n), err == nil
}
