package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/tracer-dev/tracer/internal/predict"
	"github.com/tracer-dev/tracer/internal/trace"
)

func init() {
	commands["explain"] = command{
		summary: "walk one connection through the node's rules without sending it: where it goes and why",
		run:     runExplain,
	}
}

type explainOptions struct {
	state  stateSource
	proto  string
	v6     bool
	output string
}

func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o explainOptions
	fs := newFlagSet("explain", stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: tracer explain [FLAGS] FROM TO\n\n"+
			"FROM and TO: IP, IP:PORT, [IPv6]:PORT, pod/NS/NAME, svc/NS/NAME[:PORT], node, outside\n\n")
		fs.PrintDefaults()
	}
	o.state.flags(fs)
	fs.StringVar(&o.proto, "proto", "tcp", "protocol: tcp, udp, sctp, icmp (ping) or icmpv6")
	fs.BoolVar(&o.v6, "6", false, "use the IPv6 addresses of pods, Services and the node")
	fs.StringVar(&o.output, "o", "text", "output format: text or json")
	from, to, err := parseExplainArgs(fs, args)
	if err != nil {
		return err
	}
	if o.output != "text" && o.output != "json" {
		return usagef("-o %q: text or json", o.output)
	}
	_, snap, env, err := o.state.read(ctx)
	if err != nil {
		return err
	}
	c, src, dst, err := explainConn(o, from, to, snap)
	if err != nil {
		return err
	}
	p, err := predict.Predict(env, c)
	if err != nil {
		return usageError{err}
	}
	if o.output == "json" {
		return writeExplainJSON(stdout, src, dst, p)
	}
	writeExplainText(stdout, src, dst, p)
	return nil
}

// parseExplainArgs takes the flags before and after FROM and TO.
func parseExplainArgs(fs *flag.FlagSet, args []string) (from, to string, err error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return "", "", err
	}
	if len(pos) != 2 {
		return "", "", usagef("explain takes FROM and TO, got %d argument(s): %q", len(pos), pos)
	}
	return pos[0], pos[1], nil
}

func explainConn(o explainOptions, from, to string, snap *trace.Snapshot) (predict.Conn, predict.Endpoint, predict.Endpoint, error) {
	src, err := predict.ParseEndpoint(from, snap, o.v6)
	if err != nil {
		return predict.Conn{}, src, predict.Endpoint{}, usagef("FROM: %v", err)
	}
	dst, err := predict.ParseEndpoint(to, snap, o.v6)
	if err != nil {
		return predict.Conn{}, src, dst, usagef("TO: %v", err)
	}
	c := predict.Conn{Proto: strings.ToLower(o.proto), Src: src.Addr.Addr(), Dst: dst.Addr}
	return c, src, dst, nil
}

func writeExplainText(w io.Writer, src, dst predict.Endpoint, p *predict.Prediction) {
	fmt.Fprintf(w, "%s %s → %s\n", p.Conn.Proto, src, dst)
	for i, s := range p.Steps {
		fmt.Fprintf(w, "  %d. %s\n", i+1, s)
	}
	fmt.Fprintf(w, "verdict: %s\n", p.Verdict())
	if p.Flow.Explanation != "" {
		fmt.Fprintf(w, "%s\n", p.Flow.Explanation)
	}
	for _, u := range p.Uncertain {
		fmt.Fprintf(w, "uncertain: %s\n", u)
	}
	fmt.Fprintln(w, "(predicted from the node's rules and state: no packet was sent)")
}

// explainJSON is `tracer explain -o json`: the prediction, with the flow
// the kernel's decisions would make in the trace format.
type explainJSON struct {
	From      string      `json:"from"`
	To        string      `json:"to"`
	Proto     string      `json:"proto"`
	Verdict   string      `json:"verdict"`
	Steps     []string    `json:"steps"`
	Uncertain []string    `json:"uncertain,omitempty"`
	Flow      *trace.Flow `json:"flow"`
}

func writeExplainJSON(w io.Writer, src, dst predict.Endpoint, p *predict.Prediction) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(explainJSON{From: src.String(), To: dst.String(), Proto: p.Conn.Proto, Verdict: p.Verdict(),
		Steps: p.Steps, Uncertain: p.Uncertain, Flow: p.Flow})
}
