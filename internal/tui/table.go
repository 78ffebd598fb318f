package tui

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/tracer-dev/tracer/internal/trace"
)

// layout is the table's column widths for one terminal width.
type layout struct {
	wide                 bool // room for milliseconds, full verdicts, sources
	time, verdict, flow  int
	node                 int // 0: one node's flows, no node column
	pods                 int
	timeFormat           string
	flowTitle, podsTitle string
}

const (
	markerWidth = 2
	protoWidth  = 6   // "icmpv6"
	wideFrom    = 120 // terminal width from which the wide layout is used
)

// The pods column keeps this many cells when the flow column grows.
const (
	minPodsWide   = 30
	minPodsNarrow = 12
)

// The node column, in flows merged from several nodes, shows at most
// this many cells of the node's name.
const (
	maxNodeWide   = 20
	maxNodeNarrow = 10
)

// layoutFor lays the columns out for a terminal width. flowNeed is the
// widest flow text on screen: IPv6 tuples are much longer than IPv4 ones,
// so the flow column grows past its usual width to show them whole, as
// far as the pods column keeps minPods cells. nodeNeed is the widest node
// name on screen, 0 for one node's flows (no node column).
func layoutFor(width, flowNeed, nodeNeed int) layout {
	l := layout{time: 8, verdict: 15, timeFormat: "15:04:05", flowTitle: "dst ⇒ went to", podsTitle: "service / pods"}
	if width >= wideFrom {
		l = layout{wide: true, time: 12, verdict: 22, timeFormat: "15:04:05.000", flowTitle: "orig src → dst ⇒ went to (reply src)", podsTitle: "service / pods / rule owner"}
	}
	rest := width - markerWidth - l.time - protoWidth - l.verdict - 4 // 4 gaps
	if nodeNeed > 0 {
		l.node = min(max(nodeNeed, len("node")), maxNodeNarrow)
		if l.wide {
			l.node = min(max(nodeNeed, len("node")), maxNodeWide)
		}
		rest -= l.node + 1
	}
	l.flow = min(max(rest*11/20, 10), 57)
	minPods := minPodsWide
	if !l.wide {
		l.flow = min(max(rest*3/4, 10), 33)
		minPods = minPodsNarrow
	}
	if flowNeed > l.flow {
		l.flow = max(l.flow, min(flowNeed, rest-1-minPods))
	}
	l.pods = max(rest-l.flow-1, 0)
	return l
}

func (m *Model) tableLines() []string {
	wide := m.width >= wideFrom
	var flows []*trace.Flow
	var texts []string
	need, nodeNeed := 0, 0
	for r := m.top; r < m.top+m.tableRows() && r < m.flows.count(); r++ {
		f := m.flows.view.At(m.rowFlow(r))
		flows, texts = append(flows, f), append(texts, flowText(f, wide))
		need = max(need, ansi.StringWidth(texts[len(texts)-1]))
		if m.src.Nodes {
			nodeNeed = max(nodeNeed, ansi.StringWidth(nodeText(f)), 1)
		}
	}
	l := layoutFor(m.width, need, nodeNeed)
	out := []string{styleColumns.Render(ansi.Truncate(
		strings.Repeat(" ", markerWidth)+pad("time", l.time)+" "+nodeCell("node", l)+pad("proto", protoWidth)+" "+
			pad("verdict", l.verdict)+" "+pad(l.flowTitle, l.flow)+" "+pad(l.podsTitle, l.pods), m.width, ""))}
	if m.flows.count() == 0 {
		return append(out, m.emptyLines()...)
	}
	for i, f := range flows {
		out = append(out, m.row(f, texts[i], l, m.top+i == m.cur))
	}
	return out
}

// row renders one flow. The selected row has a marker as well as reverse
// video, so it shows without colour too.
func (m *Model) row(f *trace.Flow, flow string, l layout, selected bool) string {
	look := lookOf(f.Verdict)
	verdict := look.symbol + " " + look.short
	if l.wide && f.Verdict != "" {
		verdict = look.symbol + " " + f.Verdict
	}
	marker := "  "
	if selected {
		marker = "▶ "
	}
	front := pad(f.Time.UTC().Format(l.timeFormat), l.time) + " " + nodeCell(nodeText(f), l) + pad(f.Proto, protoWidth) + " "
	verdictCell := pad(verdict, l.verdict)
	back := " " + pad(flow, l.flow) + " " + pad(podsText(f, l.wide), l.pods)
	if selected {
		return styleSelected.Render(marker + front + verdictCell + back)
	}
	return marker + front + verdictStyle(f.Verdict).Render(verdictCell) + back
}

// nodeText names the node that saw f, or the nodes of a joined flow.
func nodeText(f *trace.Flow) string {
	if len(f.Nodes) > 0 {
		return strings.Join(f.Nodes, "+")
	}
	return f.Node
}

// nodeCell is text in the node column and its gap, nothing without one.
func nodeCell(text string, l layout) string {
	if l.node == 0 {
		return ""
	}
	return pad(text, l.node) + " "
}

// flowText is where the client went and where the connection really went
// (reply.src) when a translation changed it.
func flowText(f *trace.Flow, wide bool) string {
	s := f.Orig.Dst
	if wide {
		s = f.Orig.Src + " → " + s
	}
	if f.Reply != nil && f.Reply.Src != f.Orig.Dst {
		s += " ⇒ " + f.Reply.Src
	}
	return s
}

// podsText names the Service addressed, then the pods at both ends, then,
// when it is someone else, the pod whose rule decided.
func podsText(f *trace.Flow, wide bool) string {
	var parts []string
	if f.Service != nil {
		parts = append(parts, "svc "+f.Service.Key())
	}
	podName := func(p *trace.PodRef) string {
		if wide {
			return p.Key()
		}
		return p.Name
	}
	switch {
	case f.SrcPod != nil && f.DstPod != nil:
		parts = append(parts, podName(f.SrcPod)+" → "+podName(f.DstPod))
	case f.SrcPod != nil:
		parts = append(parts, "from "+podName(f.SrcPod))
	case f.DstPod != nil:
		parts = append(parts, "to "+podName(f.DstPod))
	}
	if f.Rule != nil && f.Rule.Owner != nil && f.Rule.Owner.Pod != nil && (f.DstPod == nil || *f.Rule.Owner.Pod != *f.DstPod) {
		parts = append(parts, "rule of "+podName(f.Rule.Owner.Pod))
	}
	if !wide && f.Service != nil && f.DstPod != nil {
		// Narrow: where it went matters more than who sent it.
		parts = []string{"svc " + f.Service.Name + " → " + podName(f.DstPod)}
	}
	return strings.Join(parts, " · ")
}

func (m *Model) emptyLines() []string {
	switch {
	case m.flows.view.Len() > m.flows.start():
		return []string{"", fmt.Sprintf("  No flow matches %q.", m.flows.filter.String()),
			"  esc clears the filter; ? lists the filter terms."}
	case m.flows.from > 0:
		return []string{"", "  Cleared. New flows will appear here."}
	case m.src.live():
		where := "this node"
		if m.src.Nodes {
			where = "these nodes"
		}
		return []string{"", "  No flows yet: waiting for NAT, IPVS, REJECT, reset and drop decisions on " + where + "."}
	default:
		return []string{"", "  This trace has no flows."}
	}
}

// pad truncates or pads s to exactly w cells.
func pad(s string, w int) string {
	if w <= 0 {
		return ""
	}
	s = ansi.Truncate(s, w, "…")
	if n := ansi.StringWidth(s); n < w {
		s += strings.Repeat(" ", w-n)
	}
	return s
}
