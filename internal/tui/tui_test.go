package tui

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/golden"
	"github.com/charmbracelet/x/exp/teatest/v2"

	"github.com/tracer-dev/tracer/internal/trace"
)

const incidentTrace = "../../testdata/traces/node2-incident.ndjson"

// fixedNow makes export names and rates deterministic.
func fixedNow() time.Time { return time.Date(2026, 11, 30, 8, 45, 0, 0, time.UTC) }

func incidentSource(t testing.TB) Source {
	tr, err := trace.ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	store := trace.NewStore()
	for _, f := range tr.Flows {
		store.Append(f)
	}
	return Source{Header: tr.Header, Title: "replay node2-incident.ndjson", Store: store, LostEvents: tr.Summary.LostEvents}
}

// keys turns a string into key presses; "\n" is enter, "\x1b" esc.
func keys(s string) []tea.Msg {
	var out []tea.Msg
	for _, r := range s {
		switch r {
		case '\n':
			out = append(out, tea.KeyPressMsg{Code: tea.KeyEnter})
		case '\x1b':
			out = append(out, tea.KeyPressMsg{Code: tea.KeyEscape})
		case ' ':
			out = append(out, tea.KeyPressMsg{Code: tea.KeySpace, Text: " "})
		default:
			out = append(out, tea.KeyPressMsg{Code: r, Text: string(r)})
		}
	}
	return out
}

// drive runs the model in a real Bubble Tea program (teatest) at the given
// size, sends msgs, quits, and returns the final model.
func drive(t *testing.T, src Source, opts Options, w, h int, msgs ...tea.Msg) *Model {
	t.Helper()
	if opts.Now == nil {
		opts.Now = fixedNow
	}
	tm := teatest.NewTestModel(t, New(src, opts),
		teatest.WithInitialTermSize(w, h),
		teatest.WithProgramOptions(tea.WithColorProfile(colorprofile.Ascii), tea.WithEnvironment([]string{"TERM=dumb", "NO_COLOR=1"})))
	for _, m := range msgs {
		tm.Send(m)
	}
	teatest.WaitFor(t, tm.Output(), func(b []byte) bool { return len(b) > 0 }, teatest.WithDuration(5*time.Second))
	if err := tm.Quit(); err != nil {
		t.Fatal(err)
	}
	return tm.FinalModel(t, teatest.WithFinalTimeout(5*time.Second)).(*Model)
}

// screenText is what a person sees: the rendered screen without styles.
func screenText(m *Model) string { return ansi.Strip(m.Render()) + "\n" }

func TestScreensGolden(t *testing.T) {
	screens := []struct {
		name string
		src  func(t *testing.T) Source
		keys string
	}{
		{"table", func(t *testing.T) Source { return incidentSource(t) }, ""},
		{"filtered", func(t *testing.T) Source { return incidentSource(t) }, "/port:3306\n"},
		{"details", func(t *testing.T) Source { return incidentSource(t) }, "/verdict:hostport-hijack\n\n"},
		{"help", func(t *testing.T) Source { return incidentSource(t) }, "?"},
		{"empty", func(t *testing.T) Source { return Source{Header: incidentSource(t).Header, Live: true} }, ""},
		{"no-match", func(t *testing.T) Source { return incidentSource(t) }, "/port:1\n"},
		{"filter-error", func(t *testing.T) Source { return incidentSource(t) }, "/port:abc"},
		{"ipv6", ipv6Source, ""},
	}
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		for _, s := range screens {
			t.Run(fmt.Sprintf("%s-%dx%d", s.name, size[0], size[1]), func(t *testing.T) {
				m := drive(t, s.src(t), Options{ExportDir: t.TempDir()}, size[0], size[1], keys(s.keys)...)
				out := screenText(m)
				checkFits(t, out, size[0], size[1])
				golden.RequireEqual(t, out)
			})
		}
	}
}

func checkFits(t *testing.T, screen string, w, h int) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(screen, "\n"), "\n")
	if len(lines) > h {
		t.Errorf("%d lines on a %d-line terminal", len(lines), h)
	}
	for i, l := range lines {
		if ansi.StringWidth(l) > w {
			t.Errorf("line %d is %d cells wide on a %d-cell terminal: %q", i+1, ansi.StringWidth(l), w, l)
		}
	}
}

func TestExportWritesTheFilteredView(t *testing.T) {
	dir := t.TempDir()
	drive(t, incidentSource(t), Options{ExportDir: dir}, 80, 24, keys("/port:3306\ne")...)
	got := waitExport(t, filepath.Join(dir, "tracer-export-20261130-084500.ndjson"))
	if got.Header.Filter != "port:3306" || got.Header.Snapshot == nil || got.Summary == nil || len(got.Flows) != 2 {
		t.Fatalf("export: filter %q, snapshot %v, summary %v, %d flows", got.Header.Filter, got.Header.Snapshot != nil, got.Summary, len(got.Flows))
	}
	want, _ := trace.ReadFile(incidentTrace)
	if !reflect.DeepEqual(got.Flows, []*trace.Flow{want.Flows[1], want.Flows[9]}) {
		t.Error("exported flows differ from the trace's port:3306 flows")
	}
}

// An export carries the state changes: its header holds the state in
// force when its first flow was decided, and each later change follows,
// so a replay of it finds for each flow the state the live trace had.
func TestExportCarriesStateChanges(t *testing.T) {
	src := incidentSource(t)
	tr, _ := trace.ReadFile(incidentTrace)
	first, second := tr.Flows[1], tr.Flows[9] // the port:3306 flows
	if !first.Time.Before(second.Time) {
		t.Fatalf("fixture: flows at %s and %s", first.Time, second.Time)
	}
	mark := func(at time.Time, ipsets string) *trace.StateChange {
		return &trace.StateChange{Type: trace.TypeState, Time: at, Changed: []string{trace.PartIpsets}, Snapshot: trace.Snapshot{Ipsets: ipsets}}
	}
	src.States = trace.NewStateLog(src.Header.Snapshot)
	for _, c := range []*trace.StateChange{
		mark(first.Time.Add(-2*time.Second), "before the first"),
		mark(first.Time.Add(-time.Second), "in force at the first"),
		mark(second.Time.Add(-time.Millisecond), "in force at the second"),
	} {
		src.States.Add(c, time.Time{})
	}
	dir := t.TempDir()
	drive(t, src, Options{ExportDir: dir}, 80, 24, keys("/port:3306\ne")...)
	got := waitExport(t, filepath.Join(dir, "tracer-export-20261130-084500.ndjson"))
	if len(got.Flows) != 2 || len(got.States) != 1 {
		t.Fatalf("export: %d flows, %d state lines; want 2 and the one change after the first flow", len(got.Flows), len(got.States))
	}
	tl := trace.NewTimeline(got.Header.Snapshot)
	for _, c := range got.States {
		tl.Add(c)
	}
	for _, f := range []struct {
		at   time.Time
		want string
	}{{first.Time, "in force at the first"}, {second.Time, "in force at the second"}} {
		if _, snap := tl.At(f.at); snap.Ipsets != f.want {
			t.Errorf("replayed export: the state at %s is %q, want %q", f.at, snap.Ipsets, f.want)
		}
	}
	if len(got.Header.Snapshot.Pods) != len(src.Header.Snapshot.Pods) {
		t.Errorf("the export's header lost the pods: %d, want %d", len(got.Header.Snapshot.Pods), len(src.Header.Snapshot.Pods))
	}
}

// waitExport reads an export once it is complete: the export runs as a
// command, and the program may quit before it reports.
func waitExport(t *testing.T, path string) *trace.File {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := trace.ReadFile(path)
		if err == nil && got.Summary != nil {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("export is not a complete trace: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestVerdictQuickKeys(t *testing.T) {
	m := New(incidentSource(t), Options{Now: fixedNow})
	press(m, "1")
	if m.input != "verdict:hostport-hijack" || m.flows.count() != 2 {
		t.Fatalf("1: filter %q, %d rows", m.input, m.flows.count())
	}
	press(m, "/proto:tcp\n9")
	if m.input != "proto:tcp verdict:dropped" || m.flows.count() != 1 {
		t.Fatalf("9: filter %q, %d rows", m.input, m.flows.count())
	}
	press(m, "x")
	if m.input != "proto:tcp !verdict:ok" || m.flows.count() != 6 {
		t.Fatalf("x: filter %q, %d rows", m.input, m.flows.count())
	}
	press(m, "0\x1b")
	if m.input != "" || m.flows.count() != 11 {
		t.Fatalf("0, esc: filter %q, %d rows", m.input, m.flows.count())
	}
}

func TestFilterErrorKeepsLastGoodRows(t *testing.T) {
	m := New(incidentSource(t), Options{Now: fixedNow})
	press(m, "/port:3306 port:")
	if m.filterErr == nil || m.flows.count() != 2 {
		t.Fatalf("error %v, %d rows", m.filterErr, m.flows.count())
	}
	if !strings.Contains(ansi.Strip(m.Render()), "✗ port:: empty value after port: (column 11)") {
		t.Errorf("error not shown inline:\n%s", ansi.Strip(m.Render()))
	}
	press(m, "\x1b")
	if m.input != "" || m.filterErr != nil || m.flows.count() != 11 {
		t.Errorf("esc restores the filter before editing: %q %v %d", m.input, m.filterErr, m.flows.count())
	}
}

func TestLiveFlowsPauseClearAndSelection(t *testing.T) {
	src := incidentSource(t)
	all := src.Store
	src.Store = trace.NewStore()
	src.Live = true
	m := New(src, Options{Now: fixedNow})
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	for i := range 3 {
		src.Store.Append(all.At(i))
	}
	m.Update(refreshMsg{})
	if m.flows.count() != 3 || m.rowFlow(m.cur) != 2 {
		t.Fatalf("%d rows, selected %d: following selects the newest", m.flows.count(), m.rowFlow(m.cur))
	}
	press(m, "j") // select flow 1 and stop following
	src.Store.Append(all.At(3))
	m.Update(refreshMsg{})
	if m.rowFlow(m.cur) != 1 {
		t.Errorf("a new flow moved the selection to %d", m.rowFlow(m.cur))
	}
	press(m, " ")
	src.Store.Append(all.At(4))
	m.Update(refreshMsg{})
	if m.flows.count() != 4 || !strings.Contains(ansi.Strip(m.Render()), "PAUSED (1 new)") {
		t.Errorf("paused: %d rows", m.flows.count())
	}
	press(m, " ")
	if m.flows.count() != 5 {
		t.Errorf("resumed: %d rows", m.flows.count())
	}
	press(m, "c")
	if m.flows.count() != 0 || !strings.Contains(ansi.Strip(m.Render()), "Cleared") {
		t.Errorf("cleared: %d rows", m.flows.count())
	}
	src.Store.Append(all.At(5))
	m.Update(refreshMsg{})
	if m.flows.count() != 1 || m.flows.verdicts[trace.VerdictReturnPathMismatch] != 1 || len(m.flows.verdicts) != 1 {
		t.Errorf("after clear: %d rows, counts %v", m.flows.count(), m.flows.verdicts)
	}
}

func TestFlowsFromChannel(t *testing.T) {
	src := incidentSource(t)
	ch := make(chan *trace.Flow, 11)
	for i := range src.Store.Len() {
		ch <- src.Store.At(i)
	}
	close(ch)
	src.Store, src.Flows = nil, ch
	m := drive(t, src, Options{RefreshEvery: 10 * time.Millisecond}, 80, 24)
	if m.src.Store.Len() != 11 {
		t.Errorf("%d flows drained from the channel", m.src.Store.Len())
	}
}

func TestMouseWheelScrolls(t *testing.T) {
	m := New(incidentSource(t), Options{Now: fixedNow})
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 10})
	m.Update(tea.MouseWheelMsg{Button: tea.MouseWheelDown})
	if m.top != 3 || m.follow {
		t.Errorf("wheel down: top %d, follow %v", m.top, m.follow)
	}
	m.Update(tea.MouseWheelMsg{Button: tea.MouseWheelUp})
	if m.top != 0 {
		t.Errorf("wheel up: top %d", m.top)
	}
}

func TestRowsFitEveryWidth(t *testing.T) {
	m := New(incidentSource(t), Options{Now: fixedNow})
	for _, w := range []int{20, 40, 80, 119, 120, 200} {
		for _, scr := range []string{"", "\n", "?"} {
			m.screen = screenTable
			m.Update(tea.WindowSizeMsg{Width: w, Height: 24})
			press(m, scr)
			checkFits(t, ansi.Strip(m.Render()), w, 24)
		}
	}
}

func press(m *Model, s string) {
	for _, k := range keys(s) {
		m.Update(k)
	}
}

// The lab's status line sits in the title, where a narrow terminal keeps it.
func TestStatusInTitle(t *testing.T) {
	src := incidentSource(t)
	src.Status = func() (string, bool) { return "lab 3/8: 2 passed, 1 FAILED (ping-clusterip)", true }
	m := drive(t, src, Options{}, 120, 24)
	first := strings.SplitN(screenText(m), "\n", 2)[0]
	if !strings.Contains(first, "lab 3/8: 2 passed, 1 FAILED (ping-clusterip)") {
		t.Errorf("title %q lacks the lab's status", first)
	}
}

// Every verdict needs a look of its own and a key: the problem verdicts
// have single digits, past the ninth a letter of their own.
func TestEveryVerdictHasALookAndAKey(t *testing.T) {
	if n := len(problemVerdicts()) - len(letterVerdicts); n > 9 {
		t.Fatalf("%d problem verdicts without a letter, but only the keys 1-9 select one", n)
	}
	symbols := map[string]string{}
	for i, v := range trace.Verdicts {
		l, ok := verdictLooks[v]
		if !ok {
			t.Errorf("verdict %s has no symbol and short name", v)
			continue
		}
		if other, dup := symbols[l.symbol]; dup {
			t.Errorf("verdicts %s and %s share the symbol %s", other, v, l.symbol)
		}
		symbols[l.symbol] = v
		if w := ansi.StringWidth(l.symbol + " " + l.short); w > layoutFor(80, 0, 0).verdict {
			t.Errorf("%s: %q is %d cells, wider than the narrow verdict column", v, l.short, w)
		}
		m := New(incidentSource(t), Options{Now: fixedNow})
		key := keyOfVerdict(i, v)
		if v == trace.VerdictOK {
			key = "v"
		}
		press(m, key)
		if m.input != "verdict:"+v {
			t.Errorf("key %s: filter %q, want verdict:%s", key, m.input, v)
		}
	}
}

// A service-no-endpoint row shows its symbol with the short name in a
// narrow terminal and the full verdict in a wide one.
func TestServiceNoEndpointRow(t *testing.T) {
	src := incidentSource(t)
	src.Store.Append(&trace.Flow{Type: "flow", Time: fixedNow(), Proto: "tcp",
		Orig:    trace.Tuple{Src: "10.244.1.9:40000", Dst: "172.30.0.46:80"},
		Service: &trace.ServiceRef{Namespace: "ns6", Name: "svc6", Port: "p80"},
		Verdict: trace.VerdictServiceNoEndpoint})
	for _, c := range []struct {
		width int
		want  string
	}{{80, "∄ svc-no-endpt"}, {160, "∄ service-no-endpoint"}} {
		m := New(src, Options{Now: fixedNow})
		m.Update(tea.WindowSizeMsg{Width: c.width, Height: 24})
		press(m, "5")
		screen := ansi.Strip(m.Render())
		if m.flows.count() != 1 || !strings.Contains(screen, c.want) {
			t.Errorf("width %d: %d rows, want one showing %q:\n%s", c.width, m.flows.count(), c.want, screen)
		}
		checkFits(t, screen, c.width, 24)
	}
}

// The header says when conntrack events or ends were lost, and lost
// events show even when nothing else went wrong.
func TestHeaderCountsLosses(t *testing.T) {
	src := incidentSource(t)
	src.Stats = func() Stats {
		return Stats{EventsPerSec: 12, LostEvents: 4, ConntrackOverruns: 7, ConntrackEndsEvicted: 9}
	}
	m := drive(t, src, Options{}, 160, 24)
	if text := screenText(m); !strings.Contains(text, "lost 4") || !strings.Contains(text, "conntrack overruns 7") || !strings.Contains(text, "conntrack ends evicted 9") {
		t.Errorf("header lacks the losses:\n%s", text)
	}
	src.Stats = func() Stats { return Stats{EventsPerSec: 12} }
	if text := screenText(drive(t, src, Options{}, 160, 24)); strings.Contains(text, "conntrack overruns") || strings.Contains(text, "evicted") {
		t.Errorf("header names conntrack losses when there were none:\n%s", text)
	}
}

// The header shows what the tracer's own process costs, when the source
// knows it, and nothing of it when it does not (a replay).
func TestHeaderShowsTracerCost(t *testing.T) {
	src := incidentSource(t)
	src.Stats = func() Stats { return Stats{EventsPerSec: 12, TracerCPU: 0.034, TracerRSS: 61<<20 + 1} }
	if text := screenText(drive(t, src, Options{}, 160, 24)); !strings.Contains(text, "tracer 3.4% CPU 61 MiB") {
		t.Errorf("header lacks the tracer's cost:\n%s", text)
	}
	src.Stats = func() Stats { return Stats{EventsPerSec: 12} }
	if text := screenText(drive(t, src, Options{}, 160, 24)); strings.Contains(text, "% CPU") {
		t.Errorf("header shows a cost it was not given:\n%s", text)
	}
}
