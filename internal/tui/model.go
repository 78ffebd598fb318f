package tui

import (
	"fmt"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/tracer-dev/tracer/internal/filter"
	"github.com/tracer-dev/tracer/internal/trace"
)

type screen int

const (
	screenTable screen = iota
	screenDetails
	screenHelp
)

// Model is the UI's Bubble Tea model. Create it with New.
type Model struct {
	src  Source
	opts Options

	width, height int
	screen        screen

	flows flowIndex // the filtered rows over a snapshot of the store

	// Filter bar.
	editing    bool
	input      string // what is in the filter bar
	beforeEdit string // restored by esc
	filterErr  error

	// Table position: cur is the selected row, top the first row drawn.
	// Rows count from the newest flow unless oldestFirst.
	cur, top    int
	follow      bool
	oldestFirst bool
	paused      bool

	detail       *trace.Flow // the flow in the details view, kept if evicted
	detailScroll int
	helpScroll   int
	moreLines    int // lines below the details or help screen's bottom

	status     string
	sourceDone bool

	// Event rate, computed from the store when the source has no Stats.
	rate       float64
	rateEvents int
	rateAt     time.Time
}

// New returns the UI model for src.
func New(src Source, opts Options) *Model {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RefreshEvery == 0 {
		opts.RefreshEvery = 250 * time.Millisecond
	}
	if src.Store == nil {
		src.Store = trace.NewCappedStore(trace.DefaultCaps)
	}
	m := &Model{src: src, opts: opts, width: 80, height: 24, follow: true}
	m.flows.reset(src.Store.Snapshot(), 0, nil)
	m.input = opts.Filter
	m.applyInput()
	m.rateAt = opts.Now()
	return m
}

// Filter returns the filter in effect.
func (m *Model) Filter() filter.Filter { return m.flows.filter }

type refreshMsg time.Time

type sourceDoneMsg struct{}

type exportDoneMsg struct {
	path  string
	flows int
	err   error
}

// Init starts draining the source's channel and the refresh ticks.
func (m *Model) Init() tea.Cmd {
	var cmds []tea.Cmd
	if m.src.Flows != nil {
		cmds = append(cmds, m.drain(m.src.Flows, m.src.Store))
	}
	if m.src.live() {
		cmds = append(cmds, m.tick())
	}
	return tea.Batch(cmds...)
}

// drain appends the channel's flows to the store; the ticks show them.
func (m *Model) drain(ch <-chan *trace.Flow, store *trace.Store) tea.Cmd {
	return func() tea.Msg {
		for f := range ch {
			store.Append(f)
		}
		return sourceDoneMsg{}
	}
}

func (m *Model) tick() tea.Cmd {
	return tea.Tick(m.opts.RefreshEvery, func(t time.Time) tea.Msg { return refreshMsg(t) })
}

// Update handles one message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = max(msg.Width, 20), max(msg.Height, 8)
		m.clampScroll()
	case refreshMsg:
		m.refresh()
		return m, m.tick()
	case sourceDoneMsg:
		m.sourceDone = true
		m.refresh()
	case exportDoneMsg:
		if msg.err != nil {
			m.status = "export failed: " + msg.err.Error()
		} else {
			m.status = fmt.Sprintf("exported %d flows to %s", msg.flows, msg.path)
		}
	case tea.MouseWheelMsg:
		m.wheel(msg)
	case tea.KeyPressMsg:
		return m, m.key(msg)
	}
	return m, nil
}

// refresh takes in flows stored since the last refresh, unless paused,
// and the store's evictions, paused or not: the selection stays on its
// flow, or on the oldest retained one when its flow was evicted.
func (m *Model) refresh() {
	events, _ := m.src.Store.Counts()
	now := m.opts.Now()
	if dt := now.Sub(m.rateAt).Seconds(); dt >= 1 {
		m.rate = float64(events-m.rateEvents) / dt
		m.rateEvents, m.rateAt = events, now
	}
	snap := m.src.Store.Snapshot()
	if m.paused {
		m.rowsDropped(m.flows.evictUnder(snap))
		return
	}
	added, dropped := m.flows.extend(snap)
	if !m.follow && !m.oldestFirst {
		// Keep the selected flow under the cursor as rows arrive on top.
		m.cur += added
		m.top += added
	}
	m.rowsDropped(dropped)
}

// rowsDropped moves the cursor with the rows when the oldest leave: they
// are at the bottom newest first, at the top oldest first.
func (m *Model) rowsDropped(n int) {
	if m.oldestFirst {
		m.cur -= n
		m.top -= n
	}
	m.clampScroll()
}

func (m *Model) wheel(msg tea.MouseWheelMsg) {
	const step = 3
	switch {
	case m.screen == screenDetails && msg.Button == tea.MouseWheelUp:
		m.detailScroll = max(0, m.detailScroll-step)
	case m.screen == screenDetails && msg.Button == tea.MouseWheelDown:
		m.detailScroll += step
	case m.screen == screenHelp && msg.Button == tea.MouseWheelUp:
		m.helpScroll = max(0, m.helpScroll-step)
	case m.screen == screenHelp && msg.Button == tea.MouseWheelDown:
		m.helpScroll += step
	case msg.Button == tea.MouseWheelUp:
		m.scrollTable(-step)
	case msg.Button == tea.MouseWheelDown:
		m.scrollTable(step)
	}
}

func (m *Model) key(msg tea.KeyPressMsg) tea.Cmd {
	k := msg.String()
	if k == "ctrl+c" {
		return tea.Quit
	}
	if m.editing {
		m.editKey(msg)
		return nil
	}
	switch m.screen {
	case screenHelp:
		return m.helpKey(k)
	case screenDetails:
		return m.detailsKey(k)
	}
	return m.tableKey(k)
}

func (m *Model) helpKey(k string) tea.Cmd {
	switch k {
	case "q":
		return tea.Quit
	case "up", "k":
		m.helpScroll = max(0, m.helpScroll-1)
	case "down", "j":
		m.helpScroll++
	default:
		m.screen, m.helpScroll = screenTable, 0
	}
	return nil
}

func (m *Model) detailsKey(k string) tea.Cmd {
	switch k {
	case "q":
		return tea.Quit
	case "esc", "enter", "backspace", "left", "h":
		m.screen = screenTable
	case "up", "k":
		m.detailScroll = max(0, m.detailScroll-1)
	case "down", "j":
		m.detailScroll++
	case "pgup":
		m.detailScroll = max(0, m.detailScroll-m.bodyHeight())
	case "pgdown", "space":
		m.detailScroll += m.bodyHeight()
	case "e":
		return m.export()
	case "?":
		m.screen = screenHelp
	}
	return nil
}

func (m *Model) tableKey(k string) tea.Cmd {
	switch k {
	case "q":
		return tea.Quit
	case "?":
		m.screen = screenHelp
	case "/":
		m.editing, m.beforeEdit = true, m.input
		if m.input != "" && !strings.HasSuffix(m.input, " ") {
			m.input += " " // ready for the next term
		}
	case "esc":
		if m.input != "" {
			m.input = ""
			m.applyInput()
		}
	case "up", "k":
		m.moveCursor(-1)
	case "down", "j":
		m.moveCursor(1)
	case "pgup":
		m.moveCursor(-m.tableRows())
	case "pgdown":
		m.moveCursor(m.tableRows())
	case "home", "g":
		m.cur, m.follow = 0, !m.oldestFirst
		m.clampScroll()
	case "end", "G":
		m.cur, m.follow = m.flows.count()-1, m.oldestFirst
		m.clampScroll()
	case "enter":
		if m.flows.count() > 0 {
			m.screen, m.detailScroll = screenDetails, 0
			m.detail = m.flows.view.At(m.rowFlow(m.cur))
		}
	case "space":
		m.togglePause()
	case "f":
		m.follow = !m.follow
		m.followNewest()
	case "o":
		m.oldestFirst = !m.oldestFirst
		m.cur = m.flows.count() - 1 - m.cur
		m.clampScroll()
	case "c":
		m.flows.clear()
		m.cur, m.top = 0, 0
		m.status = "cleared: showing flows from now on"
	case "e":
		return m.export()
	case "x":
		m.setVerdictTerm("!verdict:" + trace.VerdictOK)
	case "v":
		m.setVerdictTerm("verdict:" + trace.VerdictOK)
	case "0":
		m.setVerdictTerm("")
	default:
		if v, ok := verdictOfKey(k); ok {
			m.setVerdictTerm("verdict:" + v)
		}
	}
	return nil
}

func (m *Model) togglePause() {
	m.paused = !m.paused
	if m.paused {
		m.status = "paused: new flows are kept but not shown; space resumes"
		return
	}
	m.status = ""
	m.refresh()
}

// editKey edits the filter bar; the filter applies on every keystroke.
func (m *Model) editKey(msg tea.KeyPressMsg) {
	switch msg.String() {
	case "enter":
		m.editing = false
		return
	case "esc":
		m.editing = false
		m.input = m.beforeEdit
	case "backspace":
		if r := []rune(m.input); len(r) > 0 {
			m.input = string(r[:len(r)-1])
		}
	case "ctrl+u":
		m.input = ""
	case "ctrl+w":
		m.input = strings.TrimRight(m.input, " ")
		if i := strings.LastIndexByte(m.input, ' '); i >= 0 {
			m.input = m.input[:i+1]
		} else {
			m.input = ""
		}
	case "space":
		m.input += " "
	default:
		if msg.Text == "" {
			return
		}
		m.input += msg.Text
	}
	m.applyInput()
}

// applyInput parses the filter bar. A bad expression keeps the last good
// filter's rows on screen and shows the error next to the bar.
func (m *Model) applyInput() {
	f, err := filter.Parse(m.input)
	f = f.OnNode(m.src.Header.Node)
	m.filterErr = err
	if err != nil {
		return
	}
	if f.String() == m.flows.filter.String() {
		return
	}
	m.flows.setFilter(f)
	m.cur, m.top = 0, 0
	if m.oldestFirst {
		m.cur = m.flows.count() - 1
	}
	m.clampScroll()
}

// setVerdictTerm replaces the verdict terms of the filter with term.
func (m *Model) setVerdictTerm(term string) {
	var kept []string
	for _, w := range strings.Fields(m.input) {
		if !strings.HasPrefix(strings.TrimPrefix(w, "!"), "verdict:") {
			kept = append(kept, w)
		}
	}
	if term != "" {
		kept = append(kept, term)
	}
	m.input = strings.Join(kept, " ")
	m.applyInput()
}

func (m *Model) moveCursor(d int) {
	m.cur += d
	m.follow = false
	m.clampScroll()
}

func (m *Model) scrollTable(d int) {
	m.top += d
	m.cur += d
	m.follow = false
	m.clampScroll()
}

func (m *Model) followNewest() {
	if !m.follow {
		return
	}
	if m.oldestFirst {
		m.cur = m.flows.count() - 1
	} else {
		m.cur = 0
	}
	m.clampScroll()
}

// clampScroll keeps the cursor on a row and the row on screen.
func (m *Model) clampScroll() {
	n, rows := m.flows.count(), m.tableRows()
	if m.follow {
		if m.oldestFirst {
			m.cur = n - 1
		} else {
			m.cur = 0
		}
	}
	m.cur = min(max(m.cur, 0), max(n-1, 0))
	if m.cur < m.top {
		m.top = m.cur
	}
	if m.cur >= m.top+rows {
		m.top = m.cur - rows + 1
	}
	m.top = min(max(m.top, 0), max(n-rows, 0))
}

// rowFlow returns the store index shown on table row r.
func (m *Model) rowFlow(r int) int {
	if m.oldestFirst {
		return m.flows.at(r)
	}
	return m.flows.at(m.flows.count() - 1 - r)
}

// problemVerdicts are the verdicts the digit keys select: every one but
// ok, which has a key of its own ("v"), so ten verdicts fit nine digits.
func problemVerdicts() []string {
	out := make([]string, 0, len(trace.Verdicts))
	for _, v := range trace.Verdicts {
		if v != trace.VerdictOK {
			out = append(out, v)
		}
	}
	return out
}

// letterVerdicts are the problem verdicts past the ninth, which no digit
// selects.
var letterVerdicts = map[string]string{"t": trace.VerdictConntrackTableFull}

// keyOfVerdict is the key that selects a problem verdict.
func keyOfVerdict(i int, v string) string {
	for k, lv := range letterVerdicts {
		if lv == v {
			return k
		}
	}
	return fmt.Sprint(i + 1)
}

func verdictOfKey(k string) (string, bool) {
	if v, ok := letterVerdicts[k]; ok {
		return v, true
	}
	ps := problemVerdicts()
	if len(k) != 1 || k[0] < '1' || k[0] > '9' || int(k[0]-'1') >= len(ps) {
		return "", false
	}
	return ps[k[0]-'1'], true
}

// Frame drives the model without a terminal, as the soak test does: it
// sizes the screen, takes in what the store holds since the last frame and
// renders it.
func (m *Model) Frame(width, height int) string {
	m.Update(tea.WindowSizeMsg{Width: width, Height: height})
	m.refresh()
	return m.Render()
}
