package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// The two ends of seed 004's return path: the client's node resets the
// pod's answer, node-1 DNAT'd the connection to the pod without SNAT.
func returnPathParts(at time.Time) (client, dnat *trace.Flow) {
	client = &trace.Flow{Type: trace.TypeFlow, Node: "outside", Time: at.Add(2 * time.Millisecond), Proto: "tcp",
		Orig:  trace.Tuple{Src: "172.18.0.99:40000", Dst: "192.168.1.200:80"},
		Reply: &trace.Tuple{Src: "192.168.1.200:80", Dst: "172.18.0.99:40000"},
		Events: []trace.Event{{Kind: trace.KindReset, Time: at.Add(2 * time.Millisecond), Hook: "tcp_send_reset", Via: "fentry", By: trace.ResetByStack,
			Packet: &trace.Tuple{Src: "10.244.2.7:8080", Dst: "172.18.0.99:40000"}}},
		Conntrack: &trace.Conntrack{State: "SYN_SENT"},
		Verdict:   trace.VerdictReturnPathMismatch, Explanation: "return path: the client reset an answer from 10.244.2.7:8080."}
	dnat = &trace.Flow{Type: trace.TypeFlow, Node: "node-1", Time: at, Proto: "tcp",
		Orig:      trace.Tuple{Src: "172.18.0.99:40000", Dst: "192.168.1.200:80"},
		Reply:     &trace.Tuple{Src: "10.244.2.7:8080", Dst: "172.18.0.99:40000"},
		Events:    []trace.Event{{Kind: trace.KindDNAT, Time: at, Hook: "nf_nat", Via: "fentry", To: "10.244.2.7:8080"}},
		Rule:      &trace.Rule{Table: "nat", Chain: "KUBE-SEP-ABC", Text: "-A KUBE-SEP-ABC -p tcp -j DNAT --to-destination 10.244.2.7:8080"},
		Conntrack: &trace.Conntrack{State: "SYN_RECV"},
		DstPod:    &trace.PodRef{Namespace: "shop", Name: "web"},
		Verdict:   trace.VerdictOK, Explanation: "ok: DNAT'd to 10.244.2.7:8080."}
	return client, dnat
}

func TestMergerJoinsReturnPathFromBothEnds(t *testing.T) {
	client, dnat := returnPathParts(t0)
	m := &Merger{Window: time.Second}
	m.Add(dnat, t0.Add(1500*time.Millisecond))
	m.Add(client, t0.Add(1600*time.Millisecond)) // arrives second, precedes on the path
	out := m.Drain(nil)
	if len(out) != 1 || m.Joined != 1 {
		t.Fatalf("%d flows out, %d joined: want the two joined into one", len(out), m.Joined)
	}
	f := out[0]
	if strings.Join(f.Nodes, ",") != "outside,node-1" || f.Node != "" {
		t.Errorf("nodes %v (node %q), want outside then node-1", f.Nodes, f.Node)
	}
	if f.Verdict != trace.VerdictReturnPathMismatch || !strings.Contains(f.Explanation, "seen from both ends") ||
		!strings.Contains(f.Explanation, "node node-1 sent 192.168.1.200:80 from 172.18.0.99:40000 to 10.244.2.7:8080 without SNAT") ||
		!strings.Contains(f.Explanation, "on node outside the client's stack reset") {
		t.Errorf("verdict %s: %s", f.Verdict, f.Explanation)
	}
	if len(f.Events) != 2 || f.Events[0].Node != "node-1" || f.Events[1].Node != "outside" || f.Events[0].Kind != trace.KindDNAT {
		t.Errorf("events %+v: want node-1's DNAT then outside's reset, each naming its node", f.Events)
	}
	if !f.Time.Equal(t0) || f.Rule != dnat.Rule || f.Conntrack != dnat.Conntrack || f.DstPod != dnat.DstPod || *f.Reply != *dnat.Reply {
		t.Errorf("joined flow %+v: want node-1's time, rule, conntrack, pod and reply", f)
	}
	if _, err := trace.ParseFlow(mustAppend(t, f)); err != nil {
		t.Errorf("the joined flow does not read back: %v", err)
	}
}

// Near misses: the same tuple from the same node, or too far apart in
// time, is another connection; a reset of an answer from elsewhere joins
// but is no return path seen from both ends.
func TestMergerJoinNearMisses(t *testing.T) {
	client, dnat := returnPathParts(t0)
	sameNode := *client
	sameNode.Node = "node-1"
	late := *client
	late.Time = t0.Add(5 * time.Second)
	for name, second := range map[string]*trace.Flow{"same node": &sameNode, "5s later": &late} {
		m := &Merger{Window: time.Second}
		m.Add(dnat, t0)
		m.Add(second, t0)
		if out := m.Drain(nil); len(out) != 2 || m.Joined != 0 {
			t.Errorf("%s: %d flows out, %d joined: want two apart", name, len(out), m.Joined)
		}
	}
	other := *client
	other.Events = []trace.Event{client.Events[0]}
	other.Events[0].Packet = &trace.Tuple{Src: "10.244.9.9:8080", Dst: "172.18.0.99:40000"}
	m := &Merger{Window: time.Second}
	m.Add(dnat, t0)
	m.Add(&other, t0)
	out := m.Drain(nil)
	if len(out) != 1 || out[0].Verdict != trace.VerdictReturnPathMismatch || strings.Contains(out[0].Explanation, "both ends") ||
		!strings.HasPrefix(out[0].Explanation, "On node outside: return path") || !strings.Contains(out[0].Explanation, "On node node-1: ok") {
		t.Errorf("got %d flows, %+v", len(out), out[0])
	}
}

func mustAppend(t *testing.T, f *trace.Flow) []byte {
	t.Helper()
	b, err := trace.AppendFlow(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A client host that tracks no connections sees only the answer it
// resets: its flow is that stray packet, once per retransmission. Each
// joins node-1's flow, whose conntrack expected that answer.
func TestMergerJoinsStrayAnswers(t *testing.T) {
	_, dnat := returnPathParts(t0)
	stray := func(at time.Time) *trace.Flow {
		pkt := &trace.Tuple{Src: "10.244.2.7:8080", Dst: "172.18.0.99:40000"}
		return &trace.Flow{Type: trace.TypeFlow, Node: "outside", Time: at, Proto: "tcp", Orig: *pkt,
			Events:  []trace.Event{{Kind: trace.KindReset, Time: at, Hook: "tcp_send_reset", Via: "fentry", By: trace.ResetByStack, Packet: pkt}},
			Verdict: trace.VerdictReset, Explanation: "reset: no socket listens on 172.18.0.99:40000."}
	}
	m := &Merger{Window: 3 * time.Second}
	m.Add(dnat, t0)
	m.Add(stray(t0.Add(time.Millisecond)), t0)
	m.Add(stray(t0.Add(time.Second)), t0)
	out := m.Drain(nil)
	if len(out) != 1 {
		t.Fatalf("%d flows out, want one", len(out))
	}
	f := out[0]
	if strings.Join(f.Nodes, ",") != "node-1,outside" || len(f.Events) != 3 || f.Verdict != trace.VerdictReturnPathMismatch ||
		!strings.Contains(f.Explanation, "seen from both ends") || f.Orig != dnat.Orig {
		t.Errorf("joined %+v", f)
	}
	// A second connection of node-1's tuple (its own DNAT) is not joined
	// to the first.
	again := *dnat
	m.Add(dnat, t0)
	m.Add(&again, t0)
	if out := m.Drain(nil); len(out) != 2 {
		t.Errorf("two connections of one tuple on one node: %d flows out, want 2", len(out))
	}
}

// The IPv6 twin of seed 004's return path: endpoints in brackets join as
// IPv4 ones do.
func TestMergerJoinsIPv6ReturnPath(t *testing.T) {
	v6 := strings.NewReplacer("172.18.0.99:", "[fd00:18::99]:", "192.168.1.200:", "[fd00:1::200]:", "10.244.2.7:", "[fd44:2::7]:")
	tuple := func(tu *trace.Tuple) *trace.Tuple {
		if tu == nil {
			return nil
		}
		return &trace.Tuple{Src: v6.Replace(tu.Src), Dst: v6.Replace(tu.Dst)}
	}
	twin := func(f *trace.Flow) *trace.Flow {
		g := *f
		g.Orig, g.Reply = *tuple(&f.Orig), tuple(f.Reply)
		g.Events = nil
		for _, e := range f.Events {
			e.Packet, e.To = tuple(e.Packet), v6.Replace(e.To)
			g.Events = append(g.Events, e)
		}
		if f.Rule != nil {
			r := *f.Rule
			r.Family, r.Text = "ip6", v6.Replace(r.Text)
			g.Rule = &r
		}
		g.Explanation = v6.Replace(f.Explanation)
		return &g
	}
	client, dnat := returnPathParts(t0)
	client, dnat = twin(client), twin(dnat)
	m := &Merger{Window: time.Second}
	m.Add(dnat, t0.Add(1500*time.Millisecond))
	m.Add(client, t0.Add(1600*time.Millisecond))
	out := m.Drain(nil)
	if len(out) != 1 || m.Joined != 1 {
		t.Fatalf("%d flows out, %d joined: want the two joined into one", len(out), m.Joined)
	}
	f := out[0]
	if f.Verdict != trace.VerdictReturnPathMismatch || !strings.Contains(f.Explanation, "node node-1 sent [fd00:1::200]:80 from [fd00:18::99]:40000 to [fd44:2::7]:8080 without SNAT") {
		t.Errorf("verdict %s: %s", f.Verdict, f.Explanation)
	}
	if _, err := trace.ParseFlow(mustAppend(t, f)); err != nil {
		t.Errorf("the joined flow does not read back: %v", err)
	}
}
