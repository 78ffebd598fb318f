package tui

import (
	"fmt"

	"github.com/tracer-dev/tracer/internal/trace"
)

// keyHelp lists every key; the help screen and docs are generated from it.
var keyHelp = [][2]string{
	{"↑ ↓  k j", "move the selection (stops following)"},
	{"pgup pgdown", "move a screen"},
	{"home g / end G", "newest / oldest flow"},
	{"mouse wheel", "scroll"},
	{"enter", "details of the selected flow (esc back)"},
	{"/", "edit the filter; it applies as you type (enter keep, esc cancel, ctrl+u clear)"},
	{"esc", "clear the filter"},
	{"x", "problems only (!verdict:ok)"},
	{"v", "ok flows only (verdict:ok)"},
	{"0", "any verdict (drop verdict terms)"},
	{"space", "pause / resume (flows keep being recorded)"},
	{"f", "follow the newest flow on/off"},
	{"o", "newest first / oldest first"},
	{"c", "clear the table (new flows only)"},
	{"e", "export the filtered flows to ./tracer-export-<time>.ndjson"},
	{"?", "this help"},
	{"q ctrl+c", "quit"},
}

var filterHelp = [][2]string{
	{"pod:NS/NAME pod:NAME", "source, destination or rule-owner pod (NAME also matches NAME-*)"},
	{"ns:NS", "any pod's namespace or the Service's"},
	{"port:N", "any port of the tuples, NAT target or IPVS virtual server"},
	{"ip:ADDR ip:CIDR", "any address, likewise"},
	{"verdict:ID", "one verdict"},
	{"proto:tcp|udp|icmp", "protocol"},
	{"word \"two words\"", "text in pods, Service, rule, explanation, addresses"},
	{"!term", "exclude; terms AND together"},
}

func (m *Model) helpLines() []string {
	lines := []string{styleTitle.Render("tracer: keys"), ""}
	for _, k := range keyHelp {
		lines = append(lines, fmt.Sprintf("  %s  %s", styleKey.Render(pad(k[0], 16)), k[1]))
	}
	lines = append(lines, "", styleSection.Render("Verdict keys"))
	for i, v := range problemVerdicts() {
		l := lookOf(v)
		lines = append(lines, fmt.Sprintf("  %s  %s %s", styleKey.Render(pad(keyOfVerdict(i, v), 16)), l.symbol, v))
	}
	lines = append(lines, fmt.Sprintf("  %s  %s %s", styleKey.Render(pad("v", 16)), lookOf(trace.VerdictOK).symbol, trace.VerdictOK))
	lines = append(lines, "", styleSection.Render("Filter terms"))
	for _, k := range filterHelp {
		lines = append(lines, fmt.Sprintf("  %s  %s", styleKey.Render(pad(k[0], 22)), k[1]))
	}
	lines = append(lines, "", "  Times are UTC.")
	height := m.bodyHeight()
	m.helpScroll = min(m.helpScroll, max(len(lines)-height, 0))
	lines = lines[m.helpScroll:]
	m.moreLines = max(len(lines)-height, 0)
	if len(lines) > height {
		lines = lines[:height]
	}
	return lines
}
