package enrich

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/join"
	"github.com/tracer-dev/tracer/internal/trace"
)

// BenchmarkKubeProxyNFTFlows joins, attributes, diagnoses and writes
// (to io.Discard) one-event flows on a node whose rules are the real
// kube-proxy v1.37.2's nftables mode: per 5 flows, 2 DNATs of a ClusterIP
// to an endpoint, a connection to a Service without endpoints rejected by
// reject-chain, a NodePort of a Local Service without a local endpoint
// dropped by nodeport-endpoints-check, a ping to a ClusterIP rejected by
// cluster-ips-check. Events come 10 µs apart on one
// goroutine; ns/op is per event, flows are emitted after the linger.
// bench/mix's mix is an IPVS-mode node's; this is the mode users run now,
// whose Services without endpoints are refused as often as their clients
// retry.
func BenchmarkKubeProxyNFTFlows(b *testing.B) {
	// The check every test's flow gets (addrs_test.go) is the tests'
	// cost, not the pipeline's.
	defer func(hook func(*trace.Flow, flowAddrs)) { testHookJoinedAddrs = hook }(testHookJoinedAddrs)
	testHookJoinedAddrs = nil
	t := &testing.T{}
	snap, _ := kubeProxyNFTNode(t, "kube-proxy-v1.37.2.json", "kube-proxy-v1.37.2.nft")
	if t.Failed() {
		b.Fatal("kube-proxy's nftables node did not load")
	}
	env, err := NewNodeEnv("node-1", snap, NewSnapshotMetadata(snap.Pods, snap.Services))
	if err != nil {
		b.Fatal(err)
	}
	w, err := trace.NewWriter(io.Discard, trace.Header{})
	if err != nil {
		b.Fatal(err)
	}
	verdicts := map[string]int{}
	j := NewStages(&join.Joiner{Names: netfilterDrop{}, ReuseFlows: true}, &Enricher{Env: func(time.Time) Env { return env }, Emit: func(f *trace.Flow) {
		verdicts[f.Verdict]++
		if err := w.WriteFlow(f); err != nil {
			b.Fatal(err)
		}
	}})
	const n = 400_000
	evs := make([]event.Event, 0, n)
	for i := range n {
		src := fmt.Sprintf("10.180.%d.%d:%d", 1+i%3, 10+(i/3)%200, 10000+(i/600)%50000)
		switch i % 5 {
		case 0, 1:
			evs = append(evs, dnatTo(src, "172.30.0.44:80", "10.180.0.5:80"))
		case 2:
			evs = append(evs, rejectEvent(event.ViaTracepoint, event.NFHookNone, src, "172.30.0.46:80"))
		case 3:
			evs = append(evs, dropEvent(src, "198.51.100.10:30007"))
		default:
			// An echo request (type 8) whose id is the source port.
			ping := rejectEvent(event.ViaTracepoint, event.NFHookNone, src, "172.30.0.44:2048")
			ping.Packet.Proto = 1
			evs = append(evs, ping)
		}
	}
	now := time.Unix(1700000000, 0)
	next, i := now, 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		e := evs[i%len(evs)]
		e.Time = now
		j.Add(e, now)
		if now = now.Add(10 * time.Microsecond); now.After(next) {
			j.Expire(now)
			next = now.Add(100 * time.Millisecond)
		}
		i++
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	hits, misses := env.AttributionCacheStats()
	b.ReportMetric(float64(misses)/float64(max(hits+misses, 1)), "walks/attribution")
	if b.N >= 1_000_000 && (verdicts[trace.VerdictOK] == 0 || verdicts[trace.VerdictServiceNoEndpoint] == 0 || verdicts[trace.VerdictClusterIPReject] == 0 || len(verdicts) != 3) {
		b.Fatalf("verdicts %v, want ok, service-no-endpoint and clusterip-reject", verdicts)
	}
}
