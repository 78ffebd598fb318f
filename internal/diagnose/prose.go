package diagnose

import (
	"bytes"
	"strconv"
	"sync"

	"github.com/tracer-dev/tracer/internal/trace"
)

// prose is an explanation written sentence by sentence into one buffer,
// without a string per part: every flow is explained, so the common
// verdicts write their text here, and sentences joins its parts here too.
type prose struct {
	b []byte
	// texts holds the finished explanations: one allocation for many.
	texts trace.Arena
	// start is where the open sentence's text begins, after the space
	// that separates it from the one before (none for the first).
	start int
}

// proses are reused: done copies the text out, and a buffer per flow
// would be garbage at once.
var proses = sync.Pool{New: func() any { return &prose{b: make([]byte, 0, 512), texts: trace.Arena{BlockSize: 8192}} }}

func newProse() *prose {
	p := proses.Get().(*prose)
	p.b, p.start = p.b[:0], 0
	return p
}

// done returns the text and gives the buffer back; p is not used after.
func (p *prose) done() string {
	s := p.texts.String(p.b)
	if cap(p.b) <= 4096 {
		proses.Put(p)
	}
	return s
}

// begin opens a sentence.
func (p *prose) begin() {
	if len(p.b) > 0 {
		p.b = append(p.b, ' ')
	}
	p.start = len(p.b)
}

// end closes the open sentence: trimmed of spaces, dropped (with its
// separating space) when empty, ending in a full stop.
func (p *prose) end() {
	part := bytes.TrimSpace(p.b[p.start:])
	if len(part) == 0 {
		p.b = p.b[:max(p.start-1, 0)]
		return
	}
	n := copy(p.b[p.start:], part)
	p.b = p.b[:p.start+n]
	if p.b[len(p.b)-1] != '.' {
		p.b = append(p.b, '.')
	}
}

// sentence writes s as one sentence.
func (p *prose) sentence(s string) {
	p.begin()
	p.b = append(p.b, s...)
	p.end()
}

// add writes one sentence that write appends (evidence, which may be
// none).
func (p *prose) add(write func([]byte) []byte) {
	p.begin()
	p.b = write(p.b)
	p.end()
}

// appendTarget appends what the client addressed: "10.96.0.20:3306
// (Service ns/name)".
func (d *diagnosis) appendTarget(b []byte) []byte {
	b = append(b, d.f.Orig.Dst...)
	if sv := d.f.Service; sv != nil {
		b = appendNamed(b, "Service", sv.Namespace, sv.Name)
	}
	return b
}

// appendPod appends " (pod ns/name)", or nothing for no pod.
func appendPod(b []byte, pod *trace.PodRef) []byte {
	if pod != nil {
		b = appendNamed(b, "pod", pod.Namespace, pod.Name)
	}
	return b
}

// appendNamed appends " (what namespace/name)".
func appendNamed(b []byte, what, namespace, name string) []byte {
	b = append(append(append(b, " ("...), what...), ' ')
	return append(appendKey(b, namespace, name), ')')
}

// appendKey appends "namespace/name".
func appendKey(b []byte, namespace, name string) []byte {
	return append(append(append(b, namespace...), '/'), name...)
}

// appendRuleEvidence appends the rule that decided and its chain path;
// nothing when no rule was attributed.
func (d *diagnosis) appendRuleEvidence(b []byte) []byte {
	r := d.f.Rule
	if r == nil {
		return b
	}
	switch {
	case r.NFTables():
		b = append(b, "nftables rule `"...)
		b = append(b, r.Text...)
		b = append(b, "` (table "...)
		b = append(b, r.Family...)
		b = append(b, ' ')
		b = append(b, r.Table...)
		b = appendChainPath(append(b, ", chain path "...), r)
		b = append(b, ", handle "...)
		b = strconv.AppendUint(b, uint64(r.Handle), 10)
		b = append(b, ')')
		if e := r.Element; e != nil {
			b = append(b, ", reached through element "...)
			b = append(b, e.Key...)
			if e.Map != "" {
				b = append(b, " of map "...)
				b = append(b, e.Map...)
			}
			if e.Comment != "" {
				b = append(b, " (comment "...)
				b = strconv.AppendQuote(b, e.Comment)
				b = append(b, ')')
			}
		}
	default:
		if r.Family == "ip6" {
			// ip6tables-save prints rules just as iptables-save does, so
			// the text alone would pass for an IPv4 rule.
			b = append(b, "ip6tables rule `"...)
		} else {
			b = append(b, "Rule `"...)
		}
		b = append(b, r.Text...)
		b = append(b, "` (table "...)
		b = append(b, r.Table...)
		b = appendChainPath(append(b, ", chain path "...), r)
		b = append(b, ')')
	}
	if r.Uncertain != "" {
		b = append(b, "; attribution uncertain: "...)
		b = append(b, r.Uncertain...)
	}
	return b
}

func appendChainPath(b []byte, r *trace.Rule) []byte {
	if len(r.Path) > 0 {
		for i, c := range r.Path {
			if i > 0 {
				b = append(b, " → "...)
			}
			b = append(b, c...)
		}
		return b
	}
	if r.EntryChain != "" && r.EntryChain != r.Chain {
		b = append(b, r.EntryChain...)
		b = append(b, " → "...)
	}
	return append(b, r.Chain...)
}

// appendUnconfirmed appends that conntrack never had the connection, when
// its entry is a dropped packet's, unconfirmed; nothing otherwise.
func (d *diagnosis) appendUnconfirmed(b []byte) []byte {
	if ct := d.f.Conntrack; ct == nil || !ct.Unconfirmed {
		return b
	}
	return append(b, "Conntrack never confirmed the connection's entry: its packets were dropped before that, so the connection is in no conntrack table (conntrack -L and conntrack -E do not show it)"...)
}

// appendConntrackEvidence appends what the conntrack entry said; nothing
// without one.
func (d *diagnosis) appendConntrackEvidence(b []byte) []byte {
	ct := d.f.Conntrack
	if ct == nil {
		return b
	}
	if ct.Unconfirmed {
		return d.appendUnconfirmed(b)
	}
	b = append(b, "Conntrack entry "...)
	if ct.Replied {
		b = append(b, "replied"...)
	} else {
		b = append(b, "never replied (UNREPLIED)"...)
	}
	if ct.State != "" {
		b = append(b, ", state "...)
		b = append(b, ct.State...)
	}
	return b
}
