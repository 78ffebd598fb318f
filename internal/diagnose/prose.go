package diagnose

import (
	"bytes"
	"strconv"
	"sync"

	"github.com/tracer-dev/tracer/internal/trace"
)

// prose is an explanation written into one buffer: what sentences makes of
// its parts, without a string per part. Every flow is explained, so the
// common verdicts write their text here.
type prose struct {
	b []byte
	// start is where the open sentence's text begins; sep whether a space
	// precedes it.
	start int
	sep   bool
}

// proses are reused: the text is copied out by String, and a buffer per
// flow would be garbage at once.
var proses = sync.Pool{New: func() any { return &prose{b: make([]byte, 0, 512)} }}

func newProse() *prose {
	p := proses.Get().(*prose)
	p.b, p.start, p.sep = p.b[:0], 0, false
	return p
}

// done returns the text and gives the buffer back; p is not used after.
func (p *prose) done() string {
	s := string(p.b)
	if cap(p.b) <= 4096 {
		proses.Put(p)
	}
	return s
}

// begin opens a sentence.
func (p *prose) begin() {
	p.sep = len(p.b) > 0
	if p.sep {
		p.b = append(p.b, ' ')
	}
	p.start = len(p.b)
}

// end closes the open sentence as sentences does a part: trimmed of
// spaces, dropped when empty, ending in a full stop.
func (p *prose) end() {
	part := bytes.TrimSpace(p.b[p.start:])
	if len(part) == 0 {
		p.b = p.b[:p.start]
		if p.sep {
			p.b = p.b[:p.start-1]
		}
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

// appendTarget appends what the client addressed: "10.96.0.20:3306
// (Service ns/name)".
func (d *diagnosis) appendTarget(b []byte) []byte {
	b = append(b, d.f.Orig.Dst...)
	if sv := d.f.Service; sv != nil {
		b = append(b, " (Service "...)
		b = append(b, sv.Namespace...)
		b = append(b, '/')
		b = append(b, sv.Name...)
		b = append(b, ')')
	}
	return b
}

// appendWhere appends an endpoint with its pod when known.
func appendWhere(b []byte, ap string, pod *trace.PodRef) []byte {
	return appendPod(append(b, ap...), pod)
}

// appendPod appends " (pod ns/name)", or nothing for no pod.
func appendPod(b []byte, pod *trace.PodRef) []byte {
	if pod != nil {
		b = append(b, " (pod "...)
		b = appendPodKey(b, pod)
		b = append(b, ')')
	}
	return b
}

func appendPodKey(b []byte, p *trace.PodRef) []byte {
	b = append(b, p.Namespace...)
	b = append(b, '/')
	return append(b, p.Name...)
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

// appendConntrackEvidence appends what the conntrack entry said; nothing
// without one.
func (d *diagnosis) appendConntrackEvidence(b []byte) []byte {
	ct := d.f.Conntrack
	if ct == nil {
		return b
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
