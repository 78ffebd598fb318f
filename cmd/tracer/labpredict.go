package main

import (
	"net/netip"

	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/lab"
	"github.com/tracer-dev/tracer/internal/predict"
	"github.com/tracer-dev/tracer/internal/trace"
)

// labPrediction is what `tracer explain` said of an attempt from the
// node's state read at attach time, before the attempt was made.
type labPrediction struct {
	Proto     string   `json:"proto"`
	Src       string   `json:"src"`
	Dst       string   `json:"dst"`
	Verdict   string   `json:"verdict,omitempty"`
	Steps     []string `json:"steps,omitempty"`
	Uncertain []string `json:"uncertain,omitempty"`
	Error     string   `json:"error,omitempty"`
}

// labAudit is `tracer audit` of the scenario's node before its traffic.
type labAudit struct {
	Walked   int             `json:"walked"`
	Problems int             `json:"problems"`
	Findings []audit.Finding `json:"findings"`
	Error    string          `json:"error,omitempty"`
}

// predictLab walks the scenario's planned attempts and audits its node,
// from the trace header's snapshot: the state the tracer attached to,
// before any traffic.
func predictLab(h trace.Header, planned []lab.Planned) ([]labPrediction, *labAudit) {
	snap := h.Snapshot
	if snap == nil {
		return nil, &labAudit{Error: "the trace header has no node state"}
	}
	env, err := enrich.NewSnapshotEnv(h.Node, snap)
	if err != nil {
		return nil, &labAudit{Error: err.Error()}
	}
	out := make([]labPrediction, len(planned))
	for i, pl := range planned {
		out[i] = predictPlanned(env, pl)
	}
	r := audit.Audit(h.Node, snap, env)
	return out, &labAudit{Walked: r.Walked, Problems: r.Problems(), Findings: r.Findings}
}

func predictPlanned(env enrich.Env, pl lab.Planned) labPrediction {
	lp := labPrediction{Proto: pl.Proto, Src: pl.Src, Dst: pl.Dst}
	src, err := netip.ParseAddr(pl.Src)
	if err != nil {
		lp.Error = err.Error()
		return lp
	}
	p, err := predict.Predict(env, predict.Conn{Proto: pl.Proto, Src: src, Dst: trace.ParseEndpoint(pl.Dst)})
	if err != nil {
		lp.Error = err.Error()
		return lp
	}
	lp.Verdict, lp.Steps, lp.Uncertain = p.Verdict(), p.Steps, p.Uncertain
	return lp
}
