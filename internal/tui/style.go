package tui

import (
	"image/color"

	"charm.land/lipgloss/v2"

	"github.com/tracer-dev/tracer/internal/trace"
)

// verdictLook is how a verdict is shown: a symbol and a short name so it
// reads without colour, and a colour for when there is some.
type verdictLook struct {
	symbol string
	short  string
	color  color.Color
}

var verdictLooks = map[string]verdictLook{
	trace.VerdictHostportHijack:     {"!", "hijack", lipgloss.Magenta},
	trace.VerdictIPVSFilterReject:   {"⊘", "filter-reject", lipgloss.Red},
	trace.VerdictIPVSNoEndpoint:     {"∅", "no-endpoint", lipgloss.Red},
	trace.VerdictServiceNoEndpoint:  {"∄", "svc-no-endpt", lipgloss.Red}, // "there exists no" endpoint; short enough for the narrow column
	trace.VerdictClusterIPReject:    {"⊗", "clusterip-rej", lipgloss.Red},
	trace.VerdictReturnPathMismatch: {"↩", "return-path", lipgloss.Yellow},
	trace.VerdictConntrackTableFull: {"▣", "ct-full", lipgloss.Red},
	trace.VerdictRejected:           {"✗", trace.VerdictRejected, lipgloss.Red},
	trace.VerdictReset:              {"⟂", trace.VerdictReset, lipgloss.Yellow},
	trace.VerdictDropped:            {"↓", trace.VerdictDropped, lipgloss.Red},
	trace.VerdictOK:                 {"✓", trace.VerdictOK, lipgloss.Green},
}

func lookOf(verdict string) verdictLook {
	if l, ok := verdictLooks[verdict]; ok {
		return l
	}
	if verdict == "" {
		return verdictLook{"?", "undiagnosed", lipgloss.BrightBlack}
	}
	return verdictLook{"?", verdict, lipgloss.BrightBlack}
}

var (
	styleTitle    = lipgloss.NewStyle().Bold(true)
	styleFaint    = lipgloss.NewStyle().Faint(true)
	styleColumns  = lipgloss.NewStyle().Bold(true).Underline(true)
	styleSelected = lipgloss.NewStyle().Reverse(true)
	styleError    = lipgloss.NewStyle().Foreground(lipgloss.Red).Bold(true)
	styleWarn     = lipgloss.NewStyle().Foreground(lipgloss.Yellow)
	styleSection  = lipgloss.NewStyle().Bold(true).Underline(true)
	styleKey      = lipgloss.NewStyle().Bold(true)
)

func verdictStyle(v string) lipgloss.Style {
	return lipgloss.NewStyle().Foreground(lookOf(v).color).Bold(v != trace.VerdictOK)
}
