package enrich

import (
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/event/eventtest"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// node2 is node-2 of INCIDENTS.md as a snapshot: kube-proxy IPVS mode with
// portmap appended (the rules and ipsets the rules package captured from
// real iptables-save), kube-ipvs0 holding the VIPs.
func node2(t *testing.T) *trace.Snapshot {
	t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	return &trace.Snapshot{
		Addresses: []trace.Address{
			{Interface: "eth0", Address: "172.18.0.2/16", Up: true},
			{Interface: "kube-ipvs0", Address: "10.96.0.10/32"},
			{Interface: "kube-ipvs0", Address: "10.96.0.20/32"},
			{Interface: "kube-ipvs0", Address: "10.96.0.30/32"},
			{Interface: "kube-ipvs0", Address: "192.168.1.200/32"},
		},
		Rules:  map[string]string{"all": read("../rules/testdata/appended.save")},
		Ipsets: read("../rules/testdata/ipsets.save"),
		IPVS:   []trace.IPVSService{{Proto: "tcp", Address: "10.96.0.10:80", Reals: []string{"10.244.1.5:8080", "10.244.2.7:8080"}}},
		Pods: []trace.Pod{
			{Namespace: "ns-b", Name: "mysql-b", IPs: []string{"10.244.1.5"}, Node: "node-2", HostPorts: []string{"tcp/3306"}},
			{Namespace: "ns-c", Name: "client", IPs: []string{"10.244.1.7"}, Node: "node-2"},
			{Namespace: "ns-a", Name: "mysql-a", IPs: []string{"10.244.2.7"}, Node: "node-1"},
		},
		Services: []trace.Service{
			{Namespace: "ns-a", Name: "svc-b", Type: "ClusterIP", ClusterIPs: []string{"10.96.0.20"}, Ports: []trace.ServicePort{{Proto: "TCP", Port: 80}}},
			{Namespace: "default", Name: "web", Type: "ClusterIP", ClusterIPs: []string{"10.96.0.10"}, Ports: []trace.ServicePort{{Proto: "TCP", Port: 80}}},
		},
	}
}

func joinEnriched(t *testing.T, evs ...event.Event) []*trace.Flow {
	t.Helper()
	return joinOnNode(t, "node-2", node2(t), nil, evs...)
}

// joinOnNode joins evs on the named node of snap, with names for their
// reasons, and checks the flows wait out their linger and then all close.
func joinOnNode(t *testing.T, node string, snap *trace.Snapshot, names event.ReasonNamer, evs ...event.Event) []*trace.Flow {
	t.Helper()
	env, err := NewNodeEnv(node, snap, NewSnapshotMetadata(snap.Pods, snap.Services))
	if err != nil {
		t.Fatal(err)
	}
	var out []*trace.Flow
	j := NewStages(&join.Joiner{Names: names}, &Enricher{Env: func(time.Time) Env { return env }, Emit: func(f *trace.Flow) { out = append(out, f) }})
	now := time.Unix(1700000000, 0)
	for _, e := range evs {
		e.Time = now
		j.Add(e, now)
	}
	j.Expire(now.Add(time.Second))
	if len(out) != 0 {
		t.Fatalf("flows finished before their linger: %d", len(out))
	}
	j.Expire(now.Add(2 * time.Second))
	if j.Open() != 0 {
		t.Fatalf("%d flows still open", j.Open())
	}
	return out
}

func TestJoinHostportHijack(t *testing.T) {
	dnat := event.Event{Kind: event.KindDNAT, Hook: event.HookNFNat, Via: event.ViaNetfilter, NFHook: 0,
		Orig:  tuple(6, "10.244.1.7:40000", "10.96.0.20:3306"),
		Reply: tuple(6, "10.244.1.5:3306", "10.244.1.7:40000"),
		To:    event.Range{MinAddr: netip.MustParseAddr("10.244.1.5"), MaxAddr: netip.MustParseAddr("10.244.1.5"), MinPort: 3306, MaxPort: 3306}}
	flows := joinEnriched(t, dnat)
	if len(flows) != 1 {
		t.Fatalf("%d flows", len(flows))
	}
	f := flows[0]
	if f.Verdict != trace.VerdictHostportHijack {
		t.Fatalf("verdict %s: %s", f.Verdict, f.Explanation)
	}
	r := f.Rule
	if r == nil || r.Chain != "CNI-DN-8b747bf054247edf07ca9" || r.EntryChain != "CNI-HOSTPORT-DNAT" ||
		!strings.Contains(r.Text, "--to-destination 10.244.1.5:3306") {
		t.Fatalf("rule %+v", r)
	}
	if r.Owner == nil || r.Owner.ContainerID != "4b1c0f6de2a94b3f8c1e7a5d9e0b2c3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d" ||
		r.Owner.Pod == nil || r.Owner.Pod.Name != "mysql-b" {
		t.Errorf("owner %+v", r.Owner)
	}
	if f.SrcPod == nil || f.SrcPod.Name != "client" || f.DstPod == nil || f.DstPod.Name != "mysql-b" {
		t.Errorf("pods %+v %+v", f.SrcPod, f.DstPod)
	}
	if f.Service == nil || f.Service.Name != "svc-b" {
		t.Errorf("service %+v", f.Service)
	}
	if f.Reply == nil || f.Reply.Src != "10.244.1.5:3306" {
		t.Errorf("reply %+v", f.Reply)
	}
}

func TestJoinPingRejectedByIPVSFilter(t *testing.T) {
	icmp := func(kind event.Kind, hook event.Hook) event.Event {
		return event.Event{Kind: kind, Hook: hook, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
			Packet: tuple(1, "10.244.1.7:7", "10.96.0.10:2048"), ICMPType: 3, ICMPCode: 3,
			HasReason: kind == event.KindDrop, Reason: 12}
	}
	flows := joinEnriched(t, icmp(event.KindReject, event.HookICMPSend), icmp(event.KindDrop, event.HookKfreeSkb))
	if len(flows) != 1 {
		t.Fatalf("%d flows", len(flows))
	}
	f := flows[0]
	if len(f.Events) != 2 {
		t.Errorf("events %d, want reject and drop in one flow", len(f.Events))
	}
	if f.Verdict != trace.VerdictIPVSFilterReject {
		t.Fatalf("verdict %s: %s", f.Verdict, f.Explanation)
	}
	if f.Rule == nil || f.Rule.Chain != "KUBE-IPVS-FILTER" || !strings.Contains(f.Rule.Text, "KUBE-IPVS-IPS dst -j REJECT") {
		t.Fatalf("rule %+v", f.Rule)
	}
	if f.Orig.Dst != "10.96.0.10" || f.Proto != "icmp" {
		t.Errorf("orig %+v proto %s", f.Orig, f.Proto)
	}
}

// Near miss: TCP to a service ip,port passes KUBE-IPVS-FILTER: a stack
// reset there is not the filter's doing.
func TestJoinServicePortIsNotFilter(t *testing.T) {
	rst := event.Event{Kind: event.KindReset, Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
		Packet: tuple(6, "10.244.1.7:40000", "10.96.0.10:80")}
	flows := joinEnriched(t, rst)
	if f := flows[0]; f.Verdict != trace.VerdictReset {
		t.Fatalf("verdict %s: %s", f.Verdict, f.Explanation)
	}
}

func TestParseRange(t *testing.T) {
	for s, want := range map[string]string{
		"10.0.0.1:80":             "10.0.0.1:80",
		"10.0.0.1-10.0.0.9:80-90": "10.0.0.1-10.0.0.9:80-90",
		"[fd00::1]:53":            "[fd00::1]:53",
		"10.0.0.1":                "10.0.0.1",
	} {
		r, ok := parseRange(s)
		if !ok || r.String() != want {
			t.Errorf("%s: %v %q", s, ok, r.String())
		}
	}
	if _, ok := parseRange("nope"); ok {
		t.Error("parsed garbage")
	}
}

var (
	tuple       = eventtest.Tuple
	dnatTo      = eventtest.DNAT
	rejectEvent = eventtest.Reject
	dropEvent   = eventtest.Drop
)
