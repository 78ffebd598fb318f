package tui

import (
	"context"
	"errors"
	"fmt"
	"os"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/term"
)

// ErrNotTerminal is returned by Run when stdin or stdout is not a
// terminal: the UI needs one, and a script wants `tracer trace` instead.
var ErrNotTerminal = errors.New("the UI needs a terminal, but stdout is not one: use `tracer trace -o json` (or `tracer replay -o json FILE`) to stream flows to a pipe or file")

// Run shows the UI on the terminal until the user quits or ctx ends.
func Run(ctx context.Context, src Source, opts Options) error {
	if !term.IsTerminal(os.Stdout.Fd()) || !term.IsTerminal(os.Stdin.Fd()) {
		return ErrNotTerminal
	}
	p := tea.NewProgram(New(src, opts), tea.WithContext(ctx))
	_, err := p.Run()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("run the terminal UI: %w", err)
	}
	return nil
}
