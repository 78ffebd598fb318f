package tui

import (
	"fmt"
	"sort"
	"strings"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/tracer-dev/tracer/internal/trace"
)

// headerLines is the height of the header plus the filter bar.
const headerLines = 4

// View renders the screen.
func (m *Model) View() tea.View {
	v := tea.NewView(m.Render())
	v.AltScreen = true
	v.MouseMode = tea.MouseModeCellMotion
	v.WindowTitle = "tracer " + m.src.Header.Node
	return v
}

// Render returns the screen as styled text, height lines of at most width
// cells.
func (m *Model) Render() string {
	var lines []string
	switch m.screen {
	case screenHelp:
		lines = m.helpLines()
	case screenDetails:
		lines = m.detailsLines()
	default:
		lines = append(m.headerLines(), m.tableLines()...)
	}
	lines = append(lines, m.footer())
	for i, l := range lines {
		lines[i] = ansi.Truncate(l, m.width, "…")
	}
	return strings.Join(lines, "\n")
}

// bodyHeight is the number of lines between the top and the footer.
func (m *Model) bodyHeight() int { return m.height - 1 }

// tableRows is the number of flow rows that fit.
func (m *Model) tableRows() int { return max(m.height-headerLines-2, 1) }

func (m *Model) headerLines() []string {
	h := &m.src.Header
	title := styleTitle.Render("tracer")
	if m.paused {
		// First, so that a narrow terminal never truncates it away.
		title += "  " + styleWarn.Render(fmt.Sprintf("PAUSED (%d new)", m.src.Store.Len()-m.flows.view.Len()))
	}
	if m.src.Status != nil {
		if text, alert := m.src.Status(); alert {
			title += "  " + styleWarn.Render(text)
		} else if text != "" {
			title += "  " + text
		}
	}
	title += "  node " + orDash(h.Node) + "  kernel " + orDash(h.Kernel)
	if m.src.Title != "" {
		title += "  " + styleFaint.Render(m.src.Title)
	}
	return []string{title, m.hooksLine(), m.countsLine(), m.filterBar()}
}

// hooksLine is the hook plan in one line: how many hooks by which method,
// which are missing, the event rate and lost events.
func (m *Model) hooksLine() string {
	byVia := map[string]int{}
	var missing []string
	for _, hk := range m.src.Header.Hooks {
		if hk.Via == "none" || hk.Via == "" {
			missing = append(missing, hk.Hook)
			continue
		}
		byVia[hk.Via]++
	}
	vias := make([]string, 0, len(byVia))
	for v := range byVia {
		vias = append(vias, v)
	}
	sort.Strings(vias)
	parts := make([]string, 0, len(vias))
	for _, v := range vias {
		parts = append(parts, fmt.Sprintf("%d %s", byVia[v], v))
	}
	attached := len(m.src.Header.Hooks) - len(missing)
	line := fmt.Sprintf("hooks %d/%d: %s", attached, len(m.src.Header.Hooks), strings.Join(parts, " "))
	if len(missing) > 0 {
		line += styleWarn.Render(" · missing " + strings.Join(missing, ","))
	}
	st := Stats{EventsPerSec: m.rate, LostEvents: m.src.LostEvents}
	if m.src.Stats != nil {
		st = m.src.Stats()
	}
	stats := fmt.Sprintf(" · %.0f ev/s · lost %d", st.EventsPerSec, st.LostEvents)
	if st.LostEvents > 0 {
		stats = styleWarn.Render(stats)
	}
	if st.ConntrackOverruns > 0 {
		stats += styleWarn.Render(fmt.Sprintf(" · conntrack overruns %d", st.ConntrackOverruns))
	}
	if st.ConntrackEndsEvicted > 0 {
		stats += styleWarn.Render(fmt.Sprintf(" · conntrack ends evicted %d", st.ConntrackEndsEvicted))
	}
	if st.ConntrackDrops > 0 {
		stats += styleError.Render(fmt.Sprintf(" · conntrack dropped %d", st.ConntrackDrops))
	}
	if st.TracerRSS > 0 {
		stats += fmt.Sprintf(" · tracer %.1f%% CPU %d MiB", 100*st.TracerCPU, st.TracerRSS>>20)
	}
	return line + stats
}

// countsLine counts the flows shown (since the last clear) per verdict,
// problems first. When the names do not fit, the symbols alone stand for
// them (? lists them).
func (m *Model) countsLine() string {
	total := fmt.Sprintf("%d flows", m.flows.seen())
	if d := m.droppedText(); d != "" {
		total += styleWarn.Render(" · " + d)
	}
	for _, form := range []string{"%[1]s %[2]s %[3]d", "%[2]s %[3]d", "%[1]s%[3]d"} {
		parts := []string{total}
		for _, v := range trace.Verdicts {
			if n := m.flows.verdicts[v]; n > 0 {
				l := lookOf(v)
				parts = append(parts, verdictStyle(v).Render(fmt.Sprintf(form, l.symbol, l.short, n)))
			}
		}
		if n := m.flows.verdicts[""]; n > 0 {
			parts = append(parts, fmt.Sprintf(form, "?", "undiagnosed", n))
		}
		line := strings.Join(parts, "  ")
		if ansi.StringWidth(line) <= m.width {
			return line
		}
		if form == "%[1]s%[3]d" {
			return strings.Join(parts, " ")
		}
	}
	return total
}

// droppedText says how many of the flows counted the store evicted, and
// under which cap: the counts line still counts them by verdict.
func (m *Model) droppedText() string {
	n := m.flows.dropped()
	if n == 0 {
		return ""
	}
	ev := m.src.Store.Eviction()
	limit := fmt.Sprintf("%d flows", ev.Caps.Flows)
	if ev.Cause == "memory" {
		limit = sizeText(ev.Caps.Memory)
	}
	return fmt.Sprintf("%d older flows dropped (cap %s)", n, limit)
}

// sizeText writes a byte count in the largest binary unit it fills.
func sizeText(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

func (m *Model) filterBar() string {
	bar := "/ " + m.input
	switch {
	case m.editing:
		bar = styleTitle.Render("/ ") + m.input + "█"
	case m.input == "":
		bar = styleFaint.Render("/ filter (? for help)")
	}
	shown := fmt.Sprintf("  %d of %d", m.flows.count(), m.flows.seen()-m.flows.dropped())
	if m.filterErr != nil {
		return bar + "  " + styleError.Render("✗ "+m.filterErr.Error())
	}
	return bar + styleFaint.Render(shown)
}

func (m *Model) footer() string {
	if m.status != "" {
		return m.status
	}
	if m.editing {
		return styleFaint.Render("enter keep · esc cancel · ctrl+u clear · e.g. port:3306 pod:db/mysql-0 !verdict:ok")
	}
	more := ""
	if m.moreLines > 0 {
		more = fmt.Sprintf(" (%d more)", m.moreLines)
	}
	switch m.screen {
	case screenDetails:
		return styleFaint.Render("esc back · ↑↓ scroll" + more + " · e export · q quit")
	case screenHelp:
		return styleFaint.Render("↑↓ scroll" + more + " · any other key: back · q quit")
	}
	mode := "newest first"
	if m.oldestFirst {
		mode = "oldest first"
	}
	if m.follow {
		mode += ", following"
	}
	keys := fmt.Sprintf("1-%d verdict", min(len(problemVerdicts())-len(letterVerdicts), 9))
	return styleFaint.Render("? help · / filter · enter details · " + keys + " · space pause · e export · q quit · " + mode)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
