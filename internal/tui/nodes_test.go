package tui

import (
	"fmt"
	"testing"
	"time"

	"github.com/charmbracelet/x/exp/golden"

	"github.com/tracer-dev/tracer/internal/trace"
)

// nodesSource is a merged stream of three nodes (kubectl tracer): each
// flow names its node, the return path is one flow joined from two, and
// the title says one node's agent is gone.
func nodesSource(t *testing.T) Source {
	at := func(s int) time.Time { return time.Date(2026, 12, 3, 6, 10, s, 0, time.UTC) }
	flows := []*trace.Flow{
		{Node: "node-1", Time: at(1), Proto: "tcp", Verdict: trace.VerdictOK,
			Orig:    trace.Tuple{Src: "172.18.0.100:40312", Dst: "192.168.1.202:80"},
			Reply:   &trace.Tuple{Src: "10.244.2.2:8080", Dst: "172.18.0.2:7728"},
			Service: &trace.ServiceRef{Namespace: "shop", Name: "shop-cluster"}, DstPod: &trace.PodRef{Namespace: "shop", Name: "shop"}},
		{Nodes: []string{"node-1", "outside"}, Time: at(2), Proto: "tcp", Verdict: trace.VerdictReturnPathMismatch,
			Orig:    trace.Tuple{Src: "172.18.0.100:44977", Dst: "192.168.1.200:80"},
			Reply:   &trace.Tuple{Src: "10.244.2.2:8080", Dst: "172.18.0.100:44977"},
			Service: &trace.ServiceRef{Namespace: "shop", Name: "shop"}, DstPod: &trace.PodRef{Namespace: "shop", Name: "shop"}},
		{Node: "ip-10-0-12-201.eu-west-1.compute.internal", Time: at(3), Proto: "udp", Verdict: trace.VerdictOK,
			Orig:  trace.Tuple{Src: "10.244.3.7:53211", Dst: "10.96.0.10:53"},
			Reply: &trace.Tuple{Src: "10.244.1.3:53", Dst: "10.244.3.7:53211"}},
	}
	store := trace.NewStore()
	for _, f := range flows {
		f.Type = trace.TypeFlow
		store.Append(f)
	}
	return Source{Header: trace.Header{Node: "3 nodes", Kernel: "agents"}, Title: "kubectl tracer", Store: store, Nodes: true,
		Status: func() (string, bool) { return "outside: the agent, or the way to it, is gone", true }}
}

func TestNodesGolden(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		t.Run(fmt.Sprintf("%dx%d", size[0], size[1]), func(t *testing.T) {
			m := drive(t, nodesSource(t), Options{ExportDir: t.TempDir()}, size[0], size[1])
			out := screenText(m)
			checkFits(t, out, size[0], size[1])
			golden.RequireEqual(t, out)
		})
	}
}
