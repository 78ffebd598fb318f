// Package mix generates the synthetic event mix the userspace benchmarks
// replay: raw ring buffer records laid out as bpf/tracer.h writes them,
// made up here in a fixed rotation of flow shapes (not recorded from a
// node), the node snapshot they are diagnosed against, and the decode ->
// join -> diagnose -> encode pipeline the live tracer runs, without the
// kernel.
package mix

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Copies of internal/rules/testdata: what the real iptables-save and ipset
// save printed for kube-proxy (IPVS mode) with CNI portmap appended
// (internal/rules/testdata/gen.sh).
var (
	//go:embed testdata/appended.save
	rulesSave string
	//go:embed testdata/ipsets.save
	ipsetsSave string
)

// Node is the node the generated mix happens on.
const Node = "node-2"

// Snapshot is node-2 of INCIDENTS.md with a cluster's worth of pods and
// Services: pods 10.244.{1,2,3}.{2..201}, one ClusterIP Service per 10 pods.
func Snapshot() *trace.Snapshot {
	s := &trace.Snapshot{
		Addresses: []trace.Address{
			{Interface: "eth0", Address: "172.18.0.2/16", Up: true},
			{Interface: "kube-ipvs0", Address: "10.96.0.10/32"},
			{Interface: "kube-ipvs0", Address: "10.96.0.20/32"},
			{Interface: "kube-ipvs0", Address: "10.96.0.30/32"},
			{Interface: "kube-ipvs0", Address: "192.168.1.200/32"},
		},
		Rules:     map[string]string{"all": rulesSave},
		Ipsets:    ipsetsSave,
		IPVS:      []trace.IPVSService{{Proto: "tcp", Address: "10.96.0.10:80", Reals: []string{"10.244.1.5:8080", "10.244.2.7:8080"}}},
		Listeners: []trace.Listener{{Proto: "tcp", Address: "0.0.0.0:22", Process: "sshd"}},
		Pods: []trace.Pod{
			{Namespace: "ns-b", Name: "mysql-b", IPs: []string{"10.244.1.5"}, Node: Node, HostPorts: []string{"tcp/3306"}},
			{Namespace: "ns-w", Name: "web", IPs: []string{"10.244.1.6"}, Node: Node, HostPorts: []string{"tcp/80"}},
			{Namespace: "ns-a", Name: "mysql-a", IPs: []string{"10.244.2.7"}, Node: "node-1"},
		},
		Services: []trace.Service{
			{Namespace: "ns-a", Name: "svc-b", Type: "ClusterIP", ClusterIPs: []string{"10.96.0.20"}, Ports: []trace.ServicePort{{Proto: "TCP", Port: 80}}},
			{Namespace: "default", Name: "web", Type: "ClusterIP", ClusterIPs: []string{"10.96.0.10"}, Ports: []trace.ServicePort{{Proto: "TCP", Port: 80}}},
		},
	}
	for n := 1; n <= 3; n++ {
		for h := 10; h <= 209; h++ {
			s.Pods = append(s.Pods, trace.Pod{Namespace: fmt.Sprintf("team-%d", h%10), Name: fmt.Sprintf("app-%d-%d", n, h),
				IPs: []string{fmt.Sprintf("10.244.%d.%d", n, h)}, Node: fmt.Sprintf("node-%d", n)})
			if h%10 == 0 {
				s.Services = append(s.Services, trace.Service{Namespace: fmt.Sprintf("team-%d", h%10), Name: fmt.Sprintf("svc-%d-%d", n, h),
					Type: "ClusterIP", ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", 10+n, h)},
					Ports: []trace.ServicePort{{Proto: "TCP", Port: 80, Target: "8080"}}})
			}
		}
	}
	return s
}

// Env is the enrichment environment of Snapshot.
func Env() (*enrich.NodeEnv, error) {
	s := Snapshot()
	env, err := enrich.NewNodeEnv(Node, s, enrich.NewSnapshotMetadata(s.Pods, s.Services))
	if err != nil {
		return nil, fmt.Errorf("mix environment: %w", err)
	}
	return env, nil
}

// Names stands in for the kernel's BTF reason names.
type Names struct{}

func (Names) DropReason(r uint32) string {
	if r == DropNetfilter {
		return "NETFILTER_DROP"
	}
	return fmt.Sprintf("DROP_%d", r)
}

func (Names) ResetReason(r uint32) string {
	if r == 2 {
		return "NO_SOCKET"
	}
	return fmt.Sprintf("RST_%d", r)
}

// DropNetfilter is the drop reason number the generated mix uses for
// netfilter drops.
const DropNetfilter = 12

// Kernel ct status bits the generated mix sets.
const (
	ctSeenReply = 1 << 1
	ctAssured   = 1 << 2
	ctConfirmed = 1 << 3
	ctSrcNAT    = 1 << 4
	ctDstNAT    = 1 << 5
)

func tuple(proto uint8, src, dst netip.Addr, sport, dport uint16) event.Tuple {
	return event.Tuple{Src: src, Dst: dst, SrcPort: sport, DstPort: dport, Proto: proto}
}

// Shapes is the length of the rotation of flow shapes: flow i of the
// generated mix has shape i % Shapes (see ShapeName and Generate).
const Shapes = 10

// shapeNames says what Generate makes for each shape.
var shapeNames = [Shapes]string{
	"a pod's connection to a hostPort of the node, DNAT'd, with its reply",
	"a pod's connection to a hostPort of the node, DNAT'd, with its reply",
	"a pod's connection to a hostPort of the node, DNAT'd, with its reply",
	"a pod's connection to a hostPort of the node, DNAT'd, with its reply",
	"a connection to a ClusterIP on a port a pod's hostPort also uses, DNAT'd to that pod",
	"a connection to a ClusterIP on a port a pod's hostPort also uses, DNAT'd to that pod",
	"an external client's connection to a hostPort of the node, DNAT'd then SNAT'd",
	"a ping to a ClusterIP answered with ICMP port unreachable and dropped by netfilter",
	"a TCP connection to a kube-ipvs0 address on a port no Service has, answered with ICMP port unreachable and dropped by netfilter",
	"a TCP connection to a node port without a socket, answered with the stack's reset",
}

// ShapeName says what flows of a shape (0 <= shape < Shapes) are.
func ShapeName(shape int) string { return shapeNames[shape] }

// Generate returns the events of flow i of the generated mix (distinct
// five-tuples for distinct i up to 3*200*50000). Times are left zero.
func Generate(i int) []event.Event {
	client := netip.AddrFrom4([4]byte{10, 244, byte(1 + i%3), byte(10 + (i/3)%200)})
	sport := uint16(10000 + (i/600)%50000)
	node := netip.MustParseAddr("172.18.0.2")
	nf := func(k event.Kind, orig, reply event.Tuple, to netip.AddrPort, status uint32, hook uint8) event.Event {
		return event.Event{Kind: k, Hook: event.HookNFNat, Via: event.ViaNetfilter, NFHook: hook, Netns: 4026531840,
			Packet: orig, Orig: orig, Reply: reply, CTStatus: status, CTInfo: 2,
			To: event.Range{MinAddr: to.Addr(), MaxAddr: to.Addr(), MinPort: to.Port(), MaxPort: to.Port(), Flags: 3}}
	}
	switch i % Shapes {
	case 0, 1, 2, 3:
		web := netip.MustParseAddr("10.244.1.6")
		orig := tuple(6, client, node, sport, 80)
		return []event.Event{nf(event.KindDNAT, orig, tuple(6, web, client, 80, sport), netip.AddrPortFrom(web, 80),
			ctSeenReply|ctAssured|ctConfirmed|ctDstNAT, 0)}
	case 4, 5:
		b := netip.MustParseAddr("10.244.1.5")
		orig := tuple(6, client, netip.MustParseAddr("10.96.0.20"), sport, 3306)
		return []event.Event{nf(event.KindDNAT, orig, tuple(6, b, client, 3306, sport), netip.AddrPortFrom(b, 3306),
			ctSeenReply|ctConfirmed|ctDstNAT, 0)}
	case 6:
		web := netip.MustParseAddr("10.244.1.6")
		ext := netip.AddrFrom4([4]byte{192, 168, byte(i % 250), byte(1 + (i/250)%250)})
		orig := tuple(6, ext, node, sport, 80)
		reply := tuple(6, web, node, 80, sport)
		return []event.Event{
			nf(event.KindDNAT, orig, reply, netip.AddrPortFrom(web, 80), ctConfirmed|ctDstNAT, 0),
			nf(event.KindSNAT, orig, reply, netip.AddrPortFrom(node, 0), ctConfirmed|ctDstNAT|ctSrcNAT, 4),
		}
	case 7:
		pkt := tuple(1, client, netip.MustParseAddr("10.96.0.10"), uint16(i), 8<<8)
		rej := event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
			Packet: pkt, ICMPType: 3, ICMPCode: 3}
		drop := event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
			Packet: pkt, Reason: DropNetfilter, HasReason: true}
		return []event.Event{rej, drop}
	case 8:
		pkt := tuple(6, client, netip.MustParseAddr("10.96.0.30"), sport, 8443)
		rej := event.Event{Kind: event.KindReject, Hook: event.HookICMPSend, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
			Packet: pkt, ICMPType: 3, ICMPCode: 3}
		drop := event.Event{Kind: event.KindDrop, Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
			Packet: pkt, Reason: DropNetfilter, HasReason: true}
		return []event.Event{rej, drop}
	default:
		pkt := tuple(6, client, node, sport, 9000)
		return []event.Event{{Kind: event.KindReset, Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, NFHook: event.NFHookNone,
			Packet: pkt, Reason: 2, HasReason: true}}
	}
}

// EventsPerCycle is the number of events in Shapes consecutive flows.
// TestPipelineVerdicts checks it against Generate.
const EventsPerCycle = 4 + 2 + 2 + 2 + 2 + 1

// OrigOf is the original tuple a flow's trace record names: the conntrack
// original tuple of its first event, or that event's packet when
// conntrack had none.
func OrigOf(evs []event.Event) trace.Tuple {
	t := evs[0].Orig
	if !t.Valid() {
		t = evs[0].Packet
	}
	return *trace.TupleOf(t)
}

// Clock is the boot clock the raw records are decoded with.
var Clock = event.Clock{BootWall: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)}

// Encode lays e out as bpf/tracer.h's struct event, the inverse of
// event.Decode; ts is the kernel's monotonic nanoseconds.
func Encode(b []byte, e event.Event, ts uint64) []byte {
	if cap(b) < event.Size {
		b = make([]byte, event.Size)
	}
	b = b[:event.Size]
	clear(b)
	le := binary.LittleEndian
	le.PutUint64(b[event.OffTsNs:], ts)
	le.PutUint32(b[event.OffNetns:], e.Netns)
	le.PutUint32(b[event.OffReason:], e.Reason)
	le.PutUint32(b[event.OffCTStatus:], e.CTStatus)
	le.PutUint32(b[event.OffCTMark:], e.CTMark)
	le.PutUint32(b[event.OffRangeFlags:], e.To.Flags)
	le.PutUint16(b[event.OffCTZone:], e.CTZone)
	b[event.OffKind] = byte(e.Kind)
	b[event.OffHook] = byte(e.Hook)
	b[event.OffVia] = byte(e.Via)
	b[event.OffICMPType] = e.ICMPType
	b[event.OffICMPCode] = e.ICMPCode
	b[event.OffNFHook] = e.NFHook
	b[event.OffCTInfo] = e.CTInfo
	if e.HasReason {
		b[event.OffHasReason] = 1
	}
	putTuple(b[event.OffPkt:], e.Packet)
	putTuple(b[event.OffOrig:], e.Orig)
	putTuple(b[event.OffReply:], e.Reply)
	putTuple(b[event.OffTo:], event.Tuple{Src: e.To.MinAddr, Dst: e.To.MaxAddr, SrcPort: e.To.MinPort, DstPort: e.To.MaxPort,
		Proto: e.Orig.Proto})
	return b
}

func putTuple(b []byte, t event.Tuple) {
	if !t.Src.IsValid() {
		return
	}
	if t.Src.Is4() {
		b[event.TupleOffFamily] = 2
		a, d := t.Src.As4(), t.Dst.As4()
		copy(b[event.TupleOffSrc:], a[:])
		copy(b[event.TupleOffDst:], d[:])
	} else {
		b[event.TupleOffFamily] = 10
		a, d := t.Src.As16(), t.Dst.As16()
		copy(b[event.TupleOffSrc:], a[:])
		copy(b[event.TupleOffDst:], d[:])
	}
	binary.BigEndian.PutUint16(b[event.TupleOffSport:], t.SrcPort)
	binary.BigEndian.PutUint16(b[event.TupleOffDport:], t.DstPort)
	b[event.TupleOffProto] = t.Proto
}

// Records is the raw records of generated flows 0..flows-1, spaced gap
// apart in kernel time, the events of one flow back to back.
func Records(flows int, gap time.Duration) [][]byte {
	var out [][]byte
	ts := uint64(time.Second)
	for i := range flows {
		for _, e := range Generate(i) {
			out = append(out, Encode(nil, e, ts))
			ts += uint64(gap)
		}
	}
	return out
}

// Replay hands out records over and over, each stamped gap after the
// one before in kernel time, so a run lasts as long as it needs while
// its clock only moves on.
type Replay struct {
	recs [][]byte
	gap  uint64
	ts   uint64
	i    int
}

// NewReplay replays recs (Records spaced gap apart) from their start.
func NewReplay(recs [][]byte, gap time.Duration) *Replay {
	return &Replay{recs: recs, gap: uint64(gap), ts: uint64(time.Second)}
}

// Next is the next record, stamped; it is the same slice as recs' and
// changes when its turn comes again.
func (r *Replay) Next() []byte {
	rec := r.recs[r.i]
	binary.LittleEndian.PutUint64(rec[event.OffTsNs:], r.ts)
	r.ts += r.gap
	if r.i++; r.i == len(r.recs) {
		r.i = 0
	}
	return rec
}

// Events are Records decoded, as the pipeline reads them.
func Events(flows int, gap time.Duration) ([]event.Event, error) {
	var out []event.Event
	for _, r := range Records(flows, gap) {
		e, err := event.Decode(r, Clock)
		if err != nil {
			return nil, fmt.Errorf("decode a generated record: %w", err)
		}
		out = append(out, e)
	}
	return out, nil
}

// ExpireEvery is how often, in the events' own clock, Pipeline expires the
// joiner's quiet flows, as internal/live does on its ticker.
const ExpireEvery = 100 * time.Millisecond

// Stages are what Feeder feeds: the join and the stages after it, on
// one goroutine (enrich.Stages) or handing the joined flows to another
// (internal/live).
type Stages interface {
	Add(ev event.Event, now time.Time)
	Expire(now time.Time)
}

// Feeder decodes raw records into Stages on the events' own clock, so a
// run is reproducible, expiring their quiet flows every ExpireEvery of it.
type Feeder struct {
	Events   int
	Errors   int
	nextTick time.Time
}

// Feed runs one raw record through s.
func (f *Feeder) Feed(raw []byte, s Stages) {
	ev, err := event.Decode(raw, Clock)
	if err != nil {
		f.Errors++
		return
	}
	f.Events++
	now := ev.Time
	if now.After(f.nextTick) {
		s.Expire(now)
		f.nextTick = now.Add(ExpireEvery)
	}
	s.Add(ev, now)
}

// Pipeline is what live.Pipeline.Run does per event, without the kernel
// and on one goroutine: decode, join, and (when a flow finishes) enrich +
// diagnose and encode to the trace writer. Run hands the finished flows
// to a goroutine of their own (internal/live's BenchmarkStages).
type Pipeline struct {
	Feeder
	Stages *enrich.Stages
	W      *trace.Writer
	Flows  int
}

// NewPipeline encodes to w (io.Discard to measure).
func NewPipeline(w io.Writer, env enrich.Env) (*Pipeline, error) {
	tw, err := trace.NewWriter(w, trace.Header{Node: Node})
	if err != nil {
		return nil, fmt.Errorf("trace writer: %w", err)
	}
	p := &Pipeline{W: tw}
	p.Stages = enrich.NewStages(&join.Joiner{Linger: join.DefaultLinger, Names: Names{}, ReuseFlows: true},
		&enrich.Enricher{Env: func(time.Time) enrich.Env { return env }, Emit: func(f *trace.Flow) {
			p.Flows++
			if err := tw.WriteFlow(f); err != nil {
				p.Errors++
			}
		}})
	return p, nil
}

// Feed runs one raw record through the pipeline.
func (p *Pipeline) Feed(raw []byte) { p.Feeder.Feed(raw, p.Stages) }

// Finish flushes the open flows.
func (p *Pipeline) Finish() { p.Stages.Flush() }
