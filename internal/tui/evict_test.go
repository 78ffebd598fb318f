package tui

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/golden"

	"github.com/tracer-dev/tracer/internal/trace"
)

// cappedIncidentSource is the incident trace in a store that keeps only
// its newest 8 of 11 flows.
func cappedIncidentSource(t *testing.T) Source {
	src := incidentSource(t)
	capped := trace.NewCappedStore(trace.Caps{Flows: 8})
	for i := range src.Store.Len() {
		capped.Append(src.Store.At(i))
	}
	src.Store = capped
	return src
}

// The header says how many flows the cap dropped, and the counts still
// count them by verdict: they are the file's, not the rows'.
func TestEvictedFlowsInHeader(t *testing.T) {
	tr, err := trace.ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	m := New(cappedIncidentSource(t), Options{Now: fixedNow})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 24})
	screen := ansi.Strip(m.Render())
	if !strings.Contains(screen, "11 flows · 3 older flows dropped (cap 8 flows)") || !strings.Contains(screen, "8 of 8") {
		t.Errorf("header lacks the 3 dropped flows:\n%s", screen)
	}
	if m.flows.count() != 8 || !reflect.DeepEqual(m.flows.verdicts, tr.Summary.Verdicts) {
		t.Errorf("%d rows, counts %v; want 8 rows and the trace's counts %v", m.flows.count(), m.flows.verdicts, tr.Summary.Verdicts)
	}
}

func TestScreensGoldenEvicted(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		t.Run(fmt.Sprintf("%dx%d", size[0], size[1]), func(t *testing.T) {
			m := drive(t, cappedIncidentSource(t), Options{ExportDir: t.TempDir()}, size[0], size[1])
			out := screenText(m)
			checkFits(t, out, size[0], size[1])
			golden.RequireEqual(t, out)
		})
	}
}

var synthStart = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

// synthFlow is flow i of a live feed: i seconds after synthStart, reset
// when i is odd.
func synthFlow(i int) *trace.Flow {
	v := trace.VerdictOK
	if i%2 == 1 {
		v = trace.VerdictReset
	}
	return &trace.Flow{Time: synthStart.Add(time.Duration(i) * time.Second), Proto: "tcp", Verdict: v,
		Orig: trace.Tuple{Src: fmt.Sprintf("10.0.0.%d:4000", i%250), Dst: "10.96.0.1:80"}}
}

// selected returns the feed index of the selected flow.
func selected(m *Model) int {
	return int(m.flows.view.At(m.rowFlow(m.cur)).Time.Sub(synthStart) / time.Second)
}

// While the store evicts under a scrolled or paused table, the selection
// stays on its flow; once that flow is evicted it moves to the oldest
// retained flow the filter shows.
func TestSelectionSurvivesEviction(t *testing.T) {
	for _, c := range []struct {
		name        string
		oldestFirst bool
		filter      string
		oldest      [2]int // oldest row shown after flows 0-39, and when paused at 40-49
	}{
		{"newest first", false, "", [2]int{20, 30}},
		{"oldest first", true, "", [2]int{20, 30}},
		{"filtered", false, "verdict:reset", [2]int{21, 31}},
		{"filtered oldest first", true, "verdict:reset", [2]int{21, 31}},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := trace.NewCappedStore(trace.Caps{Flows: 20})
			next := 0
			feed := func(n int) {
				for range n {
					store.Append(synthFlow(next))
					next++
				}
			}
			feed(20)
			m := New(Source{Store: store, Live: true}, Options{Now: fixedNow, Filter: c.filter})
			m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
			if c.oldestFirst {
				press(m, "o")
			}
			selectFlow(t, m, 13)
			feed(10) // evicts 0-9
			m.Update(refreshMsg{})
			if got := selected(m); got != 13 {
				t.Fatalf("after evicting flows 0-9 the selection is flow %d, want 13", got)
			}
			feed(10) // evicts 10-19, the selected flow among them
			m.Update(refreshMsg{})
			if got := selected(m); got != c.oldest[0] {
				t.Fatalf("after evicting flow 13 the selection is flow %d, want the oldest shown, %d", got, c.oldest[0])
			}
			press(m, " ")
			feed(10) // evicts 20-29 under the paused table
			m.Update(refreshMsg{})
			screen := ansi.Strip(m.Render())
			if got := selected(m); got != c.oldest[1] || m.flows.view.First() != 30 || m.flows.view.Len() != 40 {
				t.Fatalf("paused: selection %d, view [%d, %d); want %d in [30, 40)", got, m.flows.view.First(), m.flows.view.Len(), c.oldest[1])
			}
			if !strings.Contains(screen, "PAUSED (10 new)") || !strings.Contains(screen, "40 flows · 30 older flows dropped (cap 20 flows)") {
				t.Errorf("paused header:\n%s", screen)
			}
			want := map[string]int{trace.VerdictOK: 20, trace.VerdictReset: 20}
			if !reflect.DeepEqual(m.flows.verdicts, want) {
				t.Errorf("paused counts %v, want %v", m.flows.verdicts, want)
			}
			checkRows(t, m)
		})
	}
}

// selectFlow moves the cursor onto feed flow i.
func selectFlow(t *testing.T, m *Model, i int) {
	t.Helper()
	press(m, "g")
	for range m.flows.count() {
		if selected(m) == i {
			return
		}
		press(m, "j")
	}
	t.Fatalf("flow %d is not on a row", i)
}

// checkRows fails unless every row shows a retained flow, in order, that
// the filter passes.
func checkRows(t *testing.T, m *Model) {
	t.Helper()
	prev := -1
	for p := range m.flows.count() {
		i := m.flows.at(p)
		f := m.flows.view.At(i)
		if i < m.flows.view.First() || i <= prev || !m.flows.filter.Match(f) {
			t.Fatalf("row %d shows store flow %d (previous %d, first retained %d)", p, i, prev, m.flows.view.First())
		}
		prev = i
	}
}

// Rebasing the filter's matches, as a store past 2^31 flows needs, keeps
// every row on its flow, and leaves an export's copy of the rows alone.
func TestRebaseKeepsRows(t *testing.T) {
	store := trace.NewCappedStore(trace.Caps{Flows: 20})
	for i := range 50 {
		store.Append(synthFlow(i))
	}
	m := New(Source{Store: store, Live: true}, Options{Now: fixedNow, Filter: "verdict:reset"})
	for i := 50; i < 60; i++ {
		store.Append(synthFlow(i)) // evicts 30-39, so that the rebase moves
	}
	m.Update(refreshMsg{})
	if m.flows.base != 30 || m.flows.start() != 40 {
		t.Fatalf("matches from %d, rows from %d; want 30 and 40", m.flows.base, m.flows.start())
	}
	var before []int
	for p := range m.flows.count() {
		before = append(before, m.flows.at(p))
	}
	exporting := m.flows // what an export in progress reads
	m.flows.rebase()
	var after, exported []int
	for p := range m.flows.count() {
		after = append(after, m.flows.at(p))
		exported = append(exported, exporting.at(p))
	}
	if !reflect.DeepEqual(exported, before) {
		t.Fatalf("a rebase changed the rows an export reads to %v, from %v", exported, before)
	}
	if !reflect.DeepEqual(after, before) || m.flows.base != m.flows.start() || len(before) != 10 {
		t.Fatalf("rows %v after a rebase to %d, want %v", after, m.flows.base, before)
	}
	for i := 60; i < 75; i++ {
		store.Append(synthFlow(i))
	}
	m.Update(refreshMsg{})
	checkRows(t, m)
	if m.flows.count() != 10 || m.flows.at(0) != 55 {
		t.Errorf("%d rows from %d after the rebase and 15 more flows, want 10 from 55", m.flows.count(), m.flows.at(0))
	}
}

// A store that evicts by memory names its memory cap.
func TestEvictedByMemoryCap(t *testing.T) {
	store := trace.NewCappedStore(trace.Caps{Memory: trace.MinMemory})
	n := 0
	for ; store.Eviction().Evicted == 0; n++ {
		store.Append(synthFlow(n))
	}
	m := New(Source{Store: store}, Options{Now: fixedNow})
	m.Update(tea.WindowSizeMsg{Width: 160, Height: 24})
	want := fmt.Sprintf("%d flows · %d older flows dropped (cap 16 MiB)", n, store.Eviction().Evicted)
	if screen := ansi.Strip(m.Render()); !strings.Contains(screen, want) {
		t.Errorf("header lacks %q:\n%s", want, screen)
	}
	if m.flows.count() != store.Retained() {
		t.Errorf("%d rows, the store retains %d", m.flows.count(), store.Retained())
	}
}
