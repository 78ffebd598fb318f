package tui

import (
	"fmt"
	"path/filepath"

	tea "charm.land/bubbletea/v2"

	"github.com/tracer-dev/tracer/internal/trace"
)

// export writes the rows shown (the filtered view, oldest first) as a
// trace file, in the background so a large view does not freeze the UI.
func (m *Model) export() tea.Cmd {
	name := "tracer-export-" + m.opts.Now().UTC().Format("20060102-150405") + ".ndjson"
	path := filepath.Join(m.opts.ExportDir, name)
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	header := m.src.Header
	header.Filter = m.flows.filter.String()
	rows := m.flows // a copy: later appends do not touch what it sees
	m.status = "exporting to " + path + " …"
	return func() tea.Msg {
		n, err := writeTrace(path, header, &rows)
		return exportDoneMsg{path: path, flows: n, err: err}
	}
}

func writeTrace(path string, h trace.Header, rows *flowIndex) (int, error) {
	w, err := trace.Create(path, h)
	if err != nil {
		return 0, err
	}
	n := rows.count()
	for p := range n {
		if err := w.WriteFlow(rows.view.At(rows.at(p))); err != nil {
			w.Abort()
			return 0, fmt.Errorf("export to %s: %w", path, err)
		}
	}
	return n, w.Close()
}
