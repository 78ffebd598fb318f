// Package audit looks for the seeds' traps on a node before they bite:
// it walks, with internal/predict, every connection the node's Services,
// NodePorts, LB and external IPs and host listeners promise to answer,
// from a pod on the node, from the node itself and from outside, and
// reports each one that would not reach what its owner intends, with the
// verdict, rule and explanation a live trace of it would show.
package audit

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/predict"
	"github.com/tracer-dev/tracer/internal/trace"
)

// Severity says whether a finding breaks what its owner intends.
type Severity string

const (
	// Problem: the connection does not reach what its owner intends.
	Problem Severity = "problem"
	// Note: the node refuses the connection by design (ping to a
	// ClusterIP, an externalTrafficPolicy=Local port on a node without a
	// local endpoint), which still surprises people during incidents.
	Note Severity = "note"
)

// Finding is one connection the node would not deliver as intended.
type Finding struct {
	Severity Severity `json:"severity"`
	Verdict  string   `json:"verdict"`
	Proto    string   `json:"proto"`
	To       string   `json:"to"`
	// From lists the clients that meet it: pod, node, outside.
	From        []string    `json:"from"`
	Rule        *trace.Rule `json:"rule,omitempty"`
	Steps       []string    `json:"steps"`
	Explanation string      `json:"explanation"`
	Uncertain   []string    `json:"uncertain,omitempty"`
}

// Report is a node's audit.
type Report struct {
	Node string `json:"node"`
	// Walked is how many connections were walked.
	Walked   int       `json:"walked"`
	Findings []Finding `json:"findings"`
	// Notes say what the audit could not look at.
	Notes []string `json:"notes,omitempty"`
}

// Problems counts the findings that break what their owner intends.
func (r *Report) Problems() int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == Problem {
			n++
		}
	}
	return n
}

// Audit walks every connection the node's state promises (candidates)
// through it.
func Audit(node string, snap *trace.Snapshot, env enrich.Env) Report {
	r := Report{Node: node, Findings: []Finding{}}
	nftRules, _ := env.NFTRuleset()
	cands, notes := candidates(node, snap, nftRules)
	r.Notes = notes
	byKey := map[string]int{}
	for _, c := range cands {
		p, err := predict.Predict(env, c.conn)
		if err != nil {
			r.Notes = append(r.Notes, fmt.Sprintf("%s %s from %s: %v", c.conn.Proto, c.to, c.from, err))
			continue
		}
		r.Walked++
		if p.Verdict() == trace.VerdictOK {
			continue
		}
		r.add(byKey, c, p)
	}
	if len(snap.Pods) > 0 {
		r.Findings = append(r.Findings, staleHostPorts(snap, env)...)
	} else {
		r.Notes = append(r.Notes, "no pod metadata: stale hostPort rules (their pod gone) could not be looked for")
	}
	slices.SortStableFunc(r.Findings, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Severity, b.Severity)*-1, cmp.Compare(a.Verdict, b.Verdict), cmp.Compare(a.To, b.To))
	})
	return r
}

// add records a prediction, merged with the same decision met from
// another client.
func (r *Report) add(byKey map[string]int, c candidate, p *predict.Prediction) {
	rule := ""
	if p.Flow.Rule != nil {
		rule = p.Flow.Rule.Text
	}
	key := strings.Join([]string{p.Verdict(), p.Conn.Proto, c.to, rule}, "\x00")
	if i, ok := byKey[key]; ok {
		r.Findings[i].From = append(r.Findings[i].From, c.from)
		return
	}
	byKey[key] = len(r.Findings)
	r.Findings = append(r.Findings, Finding{
		Severity: severity(c, p), Verdict: p.Verdict(), Proto: p.Conn.Proto, To: c.to, From: []string{c.from},
		Rule: p.Flow.Rule, Steps: p.Steps, Explanation: p.Flow.Explanation, Uncertain: p.Uncertain,
	})
}

// severity: refusing ping to a Service address, and refusing outside
// clients of an externalTrafficPolicy=Local port on a node without a
// local endpoint, are what kube-proxy is meant to do.
func severity(c candidate, p *predict.Prediction) Severity {
	switch {
	case c.ping:
		return Note
	case c.outside && c.etpLocal && (p.Verdict() == trace.VerdictServiceNoEndpoint || p.Verdict() == trace.VerdictIPVSNoEndpoint):
		return Note
	}
	return Problem
}
