package diagnose

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

// A connection to a DNAT'd address whose endpoint does not answer ARP: the
// kernel drops its SYN (NEIGH_FAILED) 3 s after the DNAT and answers the
// client with host-unreachable itself. The flow, as the tracer recorded it
// in a namespace whose DNAT target's address nothing held (the client got
// "No route to host"), says so, and names the endpoint.
func TestRejectForAnUnansweredNeighbour(t *testing.T) {
	f := recordedFlow(t, "testdata/neigh-failed.json")
	r := Diagnose(f, &fakeEnv{})
	const want = "rejected: 10.96.0.10:80 from 10.0.0.1:43334 was answered with icmp-host-unreachable. the kernel sent it itself: nothing answered ARP or neighbour discovery for 10.245.0.9, the address the connection was DNAT'd to (10.245.0.9:8080): the endpoint is down or gone, or its address is stale."
	if r.Verdict != trace.VerdictRejected || r.Explanation != want {
		t.Errorf("got %s: %q\nwant %q", r.Verdict, r.Explanation, want)
	}

	// Not translated: the address itself has no host.
	f.Orig.Dst, f.Reply = "10.245.0.9:8080", nil
	r = Diagnose(f, &fakeEnv{})
	if !strings.HasSuffix(r.Explanation, "nothing answered ARP or neighbour discovery for 10.245.0.9: no host there is up.") {
		t.Errorf("untranslated: %q", r.Explanation)
	}
}

// The same connection as one flow (join.UnansweredLinger): the DNAT, then
// three SYNs rejected as the kernel gave up on 10.245.0.9, recorded by
// TestPrivUnansweredEndpointIsOneFlow. Without the kfree_skb drops (a tier
// without that hook) the time from the DNAT to the rejection, 3.06 s,
// points at the neighbour; a host-unreachable at once (an unreachable
// route) does not.
func TestRejectForAnUnansweredNeighbourHeld(t *testing.T) {
	f := recordedFlow(t, "testdata/neigh-failed-held.json")
	r := Diagnose(f, &fakeEnv{})
	const sure = "rejected: 10.96.0.10:80 from 10.0.0.2:23224 was answered with icmp-host-unreachable. the kernel sent it itself: nothing answered ARP or neighbour discovery for 10.245.0.9, the address the connection was DNAT'd to (10.245.0.9:8080): the endpoint is down or gone, or its address is stale."
	if r.Verdict != trace.VerdictRejected || r.Explanation != sure {
		t.Errorf("got %s: %q\nwant %q", r.Verdict, r.Explanation, sure)
	}

	var noDrops []trace.Event
	for _, e := range f.Events {
		if e.Kind != trace.KindDrop {
			noDrops = append(noDrops, e)
		}
	}
	f.Events = noDrops
	r = Diagnose(f, &fakeEnv{})
	const likely = "rejected: 10.96.0.10:80 from 10.0.0.2:23224 was answered with icmp-host-unreachable. the kernel sent it itself 3.06s after the connection's first packet, the time it takes to give up on a neighbour: most likely nothing answered ARP or neighbour discovery for 10.245.0.9, the address the connection was DNAT'd to (10.245.0.9:8080): the endpoint is down or gone, or its address is stale."
	if r.Explanation != likely {
		t.Errorf("without the drops: %q\nwant %q", r.Explanation, likely)
	}

	for i := 1; i < len(f.Events); i++ {
		f.Events[i].Time = f.Events[0].Time.Add(2 * time.Millisecond)
	}
	r = Diagnose(f, &fakeEnv{})
	if strings.Contains(r.Explanation, "neighbour") || !strings.Contains(r.Explanation, "no netfilter rule explains it") {
		t.Errorf("host-unreachable at once: %q", r.Explanation)
	}
}

// recordedFlow is the flow the tracer recorded in path (one trace line).
func recordedFlow(t *testing.T, path string) *trace.Flow {
	t.Helper()
	line, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := trace.ParseFlow(line)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
