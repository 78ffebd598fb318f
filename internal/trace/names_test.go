package trace

import (
	"bufio"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestNamesMatchFormatDoc pins the verdict and kind names to
// docs/trace-format.md: the code uses the constants everywhere, so this is
// where a change to the public names shows.
func TestNamesMatchFormatDoc(t *testing.T) {
	f, err := os.Open("../../docs/trace-format.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The first column of the table after "Kinds:" and of the one under
	// "## Verdicts".
	var kinds, verdicts []string
	var section *[]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "Kinds:":
			section = &kinds
		case line == "## Verdicts":
			section = &verdicts
		case strings.HasPrefix(line, "## "):
			section = nil
		case section != nil && strings.HasPrefix(line, "| `"):
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
			*section = append(*section, name)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		doc, code []string
	}{{"kinds", kinds, Kinds}, {"verdicts", verdicts, Verdicts}} {
		doc, code := slices.Sorted(slices.Values(c.doc)), slices.Sorted(slices.Values(c.code))
		if !slices.Equal(doc, code) {
			t.Errorf("%s: docs/trace-format.md has %q, the code %q", c.what, doc, code)
		}
	}
}
