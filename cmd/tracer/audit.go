package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/tracer-dev/tracer/internal/audit"
	"github.com/tracer-dev/tracer/internal/enrich"
	"github.com/tracer-dev/tracer/internal/trace"
)

func init() {
	commands["audit"] = command{
		summary: "find hostPort hijacks, refused Service ports and other traps on the node without sending traffic (exit 1 when found)",
		run:     runAudit,
	}
}

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var state stateSource
	var output string
	var allNodes bool
	fs := newFlagSet("audit", stderr)
	state.flags(fs)
	fs.StringVar(&output, "o", "text", "output format: text or json")
	fs.BoolVar(&allNodes, "all-nodes", false, "audit every node of the cluster through its agent (kubectl tracer audit --all-nodes; --kubeconfig picks the cluster)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if output != "text" && output != "json" {
		return usagef("-o %q: text or json", output)
	}
	if allNodes {
		if state.snapshot != "" || state.netns != "" || state.metadata != "" || state.node != "" {
			return usagef("--all-nodes asks each node's agent: --snapshot, --netns, --metadata and --node do not apply")
		}
		kargs := []string{"audit", "--all-nodes", "-o", output}
		if state.kubeconfig != "" {
			kargs = append(kargs, "--kubeconfig", state.kubeconfig)
		}
		return runKubectl(ctx, kargs, stdout, stderr)
	}
	name, snap, err := state.snap(ctx)
	if err != nil {
		return err
	}
	r, err := auditState(name, snap)
	if err != nil {
		return err
	}
	return writeAudit(stdout, output, r)
}

// auditState audits a node's state: `tracer audit` reads it, the agent
// holds it.
func auditState(name string, snap *trace.Snapshot) (audit.Report, error) {
	env, err := enrich.NewSnapshotEnv(name, snap)
	if err != nil {
		return audit.Report{}, usagef("node state: %v", err)
	}
	return audit.Audit(name, snap, env), nil
}

// writeAudit writes r, and says as an error that it found problems.
func writeAudit(stdout io.Writer, output string, r audit.Report) error {
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("write the audit: %w", err)
		}
	} else {
		writeAuditText(stdout, r)
	}
	if n := r.Problems(); n > 0 {
		return fmt.Errorf("audit: %d problem(s) on node %s", n, r.Node)
	}
	return nil
}

func writeAuditText(w io.Writer, r audit.Report) {
	fmt.Fprintf(w, "node %s: %d connections walked through the node's rules (no packet sent): %d problem(s), %d note(s)\n",
		r.Node, r.Walked, r.Problems(), len(r.Findings)-r.Problems())
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  (%s)\n", n)
	}
	for _, f := range r.Findings {
		fmt.Fprintf(w, "\n%s %s: %s %s, from %s\n", strings.ToUpper(string(f.Severity)), f.Verdict, f.Proto, f.To, strings.Join(f.From, ", "))
		for i, s := range f.Steps {
			fmt.Fprintf(w, "  %d. %s\n", i+1, s)
		}
		fmt.Fprintf(w, "  %s\n", f.Explanation)
		for _, u := range f.Uncertain {
			fmt.Fprintf(w, "  uncertain: %s\n", u)
		}
	}
}
