package tui

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
)

// detailsLines is the details view of one flow: the explanation first,
// then the decision chain in kernel order, the rule, conntrack, and the
// pods and Service.
func (m *Model) detailsLines() []string {
	f := m.detail
	look := lookOf(f.Verdict)
	verdict := f.Verdict
	if verdict == "" {
		verdict = "undiagnosed"
	}
	title := verdictStyle(f.Verdict).Render(look.symbol+" "+strings.ToUpper(verdict)) +
		fmt.Sprintf("  %s %s  %s", f.Proto, flowText(f, true), f.Time.UTC().Format("2006-01-02 15:04:05.000 UTC"))
	body := []string{}
	if f.Explanation != "" {
		body = append(body, wrap(f.Explanation, m.width-2, "  ")...)
	} else {
		body = append(body, "  No explanation: the flow was not diagnosed.")
	}
	body = append(body, "")
	body = append(body, chainLines(f)...)
	body = append(body, ruleLines(f, m.width)...)
	body = append(body, conntrackLines(f)...)
	body = append(body, podLines(f)...)

	height := m.bodyHeight() - 1
	m.detailScroll = min(m.detailScroll, max(len(body)-height, 0))
	body = body[m.detailScroll:]
	m.moreLines = max(len(body)-height, 0)
	if len(body) > height {
		body = body[:height]
	}
	return append([]string{title}, body...)
}

// chainLines lists the flow's events in the order the kernel made them.
func chainLines(f *trace.Flow) []string {
	out := []string{styleSection.Render("Decision chain") + " (kernel order)"}
	if len(f.Events) == 0 {
		return append(out, "  no events recorded", "")
	}
	events := make([]*trace.Event, len(f.Events))
	for i := range f.Events {
		events[i] = &f.Events[i]
	}
	sort.SliceStable(events, func(i, j int) bool { return events[i].Time.Before(events[j].Time) })
	for i, e := range events {
		line := fmt.Sprintf("  %d. %s %s  hook %s via %s", i+1, e.Time.UTC().Format("15:04:05.000000"), e.Kind, e.Hook, e.Via)
		if e.Node != "" {
			line = fmt.Sprintf("  %d. %s %s  on node %s, hook %s via %s", i+1, e.Time.UTC().Format("15:04:05.000000"), e.Kind, e.Node, e.Hook, e.Via)
		}
		if e.NFHook != "" {
			line += " at " + e.NFHook
		}
		out = append(out, line)
		if d := eventDetail(e); d != "" {
			out = append(out, "     "+d)
		}
	}
	return append(out, "")
}

func eventDetail(e *trace.Event) string {
	var parts []string
	if e.Packet != nil {
		parts = append(parts, "packet "+e.Packet.Src+" → "+e.Packet.Dst)
	}
	if e.Virtual != "" {
		parts = append(parts, "virtual "+e.Virtual)
	}
	if e.To != "" {
		parts = append(parts, "to "+e.To)
	}
	if e.Forward != "" {
		parts = append(parts, "forward "+e.Forward)
	}
	if e.ICMPType != nil && e.ICMPCode != nil {
		parts = append(parts, fmt.Sprintf("icmp %d/%d", *e.ICMPType, *e.ICMPCode))
	}
	if e.Reason != "" {
		parts = append(parts, "reason "+e.Reason)
	}
	if e.By != "" {
		parts = append(parts, "by "+e.By)
	}
	if len(e.CTStatus) > 0 {
		parts = append(parts, "ct "+strings.Join(e.CTStatus, ","))
	}
	return strings.Join(parts, "  ")
}

func ruleLines(f *trace.Flow, width int) []string {
	out := []string{styleSection.Render("Rule")}
	r := f.Rule
	if r == nil {
		return append(out, "  no netfilter rule made this decision (or it is unknown)", "")
	}
	path := r.Path
	if len(path) == 0 {
		path = []string{r.EntryChain, r.Chain}
		if r.EntryChain == "" || r.EntryChain == r.Chain {
			path = []string{r.Chain}
		}
	}
	if r.NFTables() {
		out = append(out, fmt.Sprintf("  nftables table %s %s: %s (handle %d)", r.Family, r.Table, strings.Join(path, " → "), r.Handle))
	} else if r.Family == "ip6" {
		out = append(out, "  ip6tables table "+r.Table+": "+strings.Join(path, " → "))
	} else {
		out = append(out, "  table "+r.Table+": "+strings.Join(path, " → "))
	}
	out = append(out, wrap(r.Text, width-4, "    ")...)
	if e := r.Element; e != nil {
		el := "  via element " + e.Key
		if e.Map != "" {
			el += " of map " + e.Map
		}
		if e.Comment != "" {
			el += fmt.Sprintf(" (%q)", e.Comment)
		}
		out = append(out, wrap(el, width-2, "    ")...)
	}
	if r.Owner != nil {
		owner := "  owner:"
		if r.Owner.Pod != nil {
			owner += " pod " + r.Owner.Pod.Key()
		}
		if r.Owner.ContainerID != "" {
			owner += " (container " + shortID(r.Owner.ContainerID) + ")"
		}
		out = append(out, owner)
	}
	if r.Uncertain != "" {
		out = append(out, styleWarn.Render("  uncertain: "+r.Uncertain))
	}
	return append(out, "")
}

func conntrackLines(f *trace.Flow) []string {
	out := []string{styleSection.Render("Conntrack")}
	if ct := f.Conntrack; ct != nil {
		state := ct.State
		if state == "" {
			state = "-"
		}
		replied := "UNREPLIED"
		if ct.Replied {
			replied = "replied"
		}
		line := "  state " + state + "  " + replied
		if ct.Unconfirmed {
			line += "  never confirmed (in no conntrack table)"
		}
		if ct.Mark != 0 {
			line += fmt.Sprintf("  mark 0x%x", ct.Mark)
		}
		out = append(out, line)
		if len(ct.Status) > 0 {
			out = append(out, "  status "+strings.Join(ct.Status, " "))
		}
	} else {
		out = append(out, "  no conntrack entry")
	}
	out = append(out, "  orig  "+f.Orig.Src+" → "+f.Orig.Dst)
	if f.Reply != nil {
		out = append(out, "  reply "+f.Reply.Src+" → "+f.Reply.Dst)
	}
	return append(out, "")
}

func podLines(f *trace.Flow) []string {
	out := []string{styleSection.Render("Pods and Service")}
	ref := func(p *trace.PodRef) string {
		if p == nil {
			return "-"
		}
		return p.Key()
	}
	out = append(out, "  source pod       "+ref(f.SrcPod), "  destination pod  "+ref(f.DstPod))
	svc := "-"
	if s := f.Service; s != nil {
		svc = s.Key()
		if s.Port != "" {
			svc += " port " + s.Port
		}
	}
	return append(out, "  service          "+svc)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// wrap breaks text into lines of at most width cells, each starting with
// indent; words longer than a line are cut by the final truncation.
func wrap(text string, width int, indent string) []string {
	width -= len(indent)
	if width < 10 {
		width = 10
	}
	var out []string
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len([]rune(line))+1+len([]rune(w)) > width {
			out = append(out, indent+line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		out = append(out, indent+line)
	}
	return out
}
