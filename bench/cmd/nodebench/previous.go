package main

import (
	"bufio"
	"strings"
)

// previousRun is what the last BENCHMARKS.md said of each target, so a new
// run shows the old figures beside its own: an improvement or a regression
// is read off the table, not remembered.
type previousRun struct {
	When    string            // the "run" row of its machine table
	Speed   string            // its speedRow, "" before it had one
	Results map[string]string // target "what" -> "verdict: result"
}

// readPrevious parses the machine table's run row and the Targets table
// of a report this program wrote. Anything else, or nothing, gives an
// empty previousRun: the first run has no previous figures.
func readPrevious(md string) previousRun {
	prev := previousRun{Results: map[string]string{}}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(md))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			section = strings.TrimPrefix(line, "## ")
			continue
		}
		cells := tableCells(line)
		switch {
		case section == "Machine" && len(cells) == 2 && cells[0] == "run":
			prev.When = cells[1]
		case section == "Machine" && len(cells) == 2 && cells[0] == speedRow:
			prev.Speed = cells[1]
		case section == "Targets" && len(cells) >= 4 && cells[0] != "what" && !strings.HasPrefix(cells[0], "---"):
			prev.Results[cells[0]] = cells[3] + ": " + cells[2]
		}
	}
	return prev
}

// tableCells splits a markdown table row into its trimmed cells, or nil.
func tableCells(line string) []string {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") {
		return nil
	}
	parts := strings.Split(line[1:len(line)-1], "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}
