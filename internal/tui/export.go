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
	states := m.src.States
	m.status = "exporting to " + path + " …"
	return func() tea.Msg {
		n, err := writeTrace(path, header, states, &rows)
		return exportDoneMsg{path: path, flows: n, err: err}
	}
}

// writeTrace writes the rows, after the state in force when the first of
// them was decided and the state changes since.
func writeTrace(path string, h trace.Header, states *trace.StateLog, rows *flowIndex) (int, error) {
	n := rows.count()
	var changes []*trace.StateChange
	var sf trace.StoredFlow // each flow is written before the next is read
	if states != nil && n > 0 {
		rows.view.Load(rows.at(0), &sf)
		first := sf.Time()
		for p := range n {
			if rows.view.Load(rows.at(p), &sf); sf.Time().Before(first) {
				first = sf.Time()
			}
		}
		h.Snapshot, changes = states.From(first)
	}
	w, err := trace.Create(path, h)
	if err != nil {
		return 0, err
	}
	for _, c := range changes {
		if err := w.WriteState(c); err != nil {
			w.Abort()
			return 0, fmt.Errorf("export to %s: %w", path, err)
		}
	}
	for p := range n {
		rows.view.Load(rows.at(p), &sf)
		if err := w.WriteFlow(sf.Flow()); err != nil {
			w.Abort()
			return 0, fmt.Errorf("export to %s: %w", path, err)
		}
	}
	return n, w.Close()
}
