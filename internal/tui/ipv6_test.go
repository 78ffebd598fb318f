package tui

import (
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// ipv6Source is the incident trace's header over IPv6 flows as a
// dual-stack node records them, and one IPv4 flow: a Service DNAT, an
// ICMPv6 reject, a reset to an address written in full, and a dropped
// connection.
func ipv6Source(t *testing.T) Source {
	at := func(s int) time.Time { return time.Date(2026, 11, 30, 8, 42, s, 0, time.UTC) }
	checkout := &trace.PodRef{Namespace: "shop", Name: "checkout-6b7f9c-x2klp"}
	flows := []*trace.Flow{
		{Time: at(1), Proto: "tcp", Verdict: trace.VerdictOK,
			Orig:    trace.Tuple{Src: "10.244.1.9:41236", Dst: "10.96.0.21:80"},
			Reply:   &trace.Tuple{Src: "10.244.2.15:8080", Dst: "10.244.1.9:41236"},
			Service: &trace.ServiceRef{Namespace: "shop", Name: "api"}, SrcPod: checkout,
			DstPod: &trace.PodRef{Namespace: "shop", Name: "api-5d8"}},
		{Time: at(2), Proto: "tcp", Verdict: trace.VerdictOK,
			Orig:    trace.Tuple{Src: "[fd00:10:244:1::9]:41236", Dst: "[fd00:10:96::21]:80"},
			Reply:   &trace.Tuple{Src: "[fd00:10:244:2::f]:8080", Dst: "[fd00:10:244:1::9]:41236"},
			Service: &trace.ServiceRef{Namespace: "shop", Name: "api"}, SrcPod: checkout,
			DstPod: &trace.PodRef{Namespace: "shop", Name: "api-5d8"}},
		{Time: at(3), Proto: "icmpv6", Verdict: trace.VerdictIPVSFilterReject,
			Orig:    trace.Tuple{Src: "[fd00:10:244:1::c]:7", Dst: "[fd00:10:96::20]:7"},
			Service: &trace.ServiceRef{Namespace: "db", Name: "mysql-a"}, SrcPod: &trace.PodRef{Namespace: "shop", Name: "debug"}},
		{Time: at(4), Proto: "tcp", Verdict: trace.VerdictReset, SrcPod: checkout,
			Orig: trace.Tuple{Src: "[2001:db8:85a3:1234:5678:8a2e:370:7334]:39000", Dst: "[2001:db8:85a3:1234:5678:8a2e:370:9100]:9100"}},
		{Time: at(5), Proto: "tcp", Verdict: trace.VerdictDropped,
			Orig: trace.Tuple{Src: "[fd00:10:244:1::e]:33012", Dst: "[fd00:10:244:2::63]:5432"}},
	}
	store := trace.NewStore()
	for _, f := range flows {
		store.Append(f)
	}
	return Source{Header: incidentSource(t).Header, Title: "replay dual-stack flows", Store: store}
}

// The flow column grows to show IPv6 tuples whole on a wide enough
// terminal, leaving the pods column its minimum, and keeps its usual width
// for IPv4 ones.
func TestLayoutGrowsForLongFlows(t *testing.T) {
	for _, c := range []struct{ width, need, flow, pods int }{
		{160, 0, 57, 56}, {160, 50, 57, 56}, {160, 74, 74, 39}, {160, 200, 83, 30},
		{100, 46, 46, 18}, {100, 80, 52, 12}, {80, 46, 33, 11},
	} {
		l := layoutFor(c.width, c.need, 0)
		if l.flow != c.flow || l.pods != c.pods {
			t.Errorf("width %d, flow text %d: flow %d pods %d, want %d and %d", c.width, c.need, l.flow, l.pods, c.flow, c.pods)
		}
	}
}

func TestIPv6RowsReadable(t *testing.T) {
	m := drive(t, ipv6Source(t), Options{ExportDir: t.TempDir()}, 160, 24)
	out := screenText(m)
	for _, want := range []string{
		"icmpv6 ⊘ ipvs-filter-reject",
		"[fd00:10:244:1::9]:41236 → [fd00:10:96::21]:80 ⇒ [fd00:10:244:2::f]:8080 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("screen lacks %q:\n%s", want, out)
		}
	}
}
