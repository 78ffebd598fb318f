package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tracer-dev/tracer/internal/trace"
)

const incidentTrace = "../../testdata/traces/node2-incident.ndjson"

// tmuxSession drives a program in a detached tmux session on its own
// server, as a person at a terminal would.
type tmuxSession struct {
	t      *testing.T
	socket string
}

func (s *tmuxSession) tmux(args ...string) (string, error) {
	out, err := exec.Command("tmux", append([]string{"-L", s.socket}, args...)...).CombinedOutput()
	return string(out), err
}

func (s *tmuxSession) send(keys ...string) {
	s.t.Helper()
	if out, err := s.tmux(append([]string{"send-keys", "-t", "e2e"}, keys...)...); err != nil {
		s.t.Fatalf("tmux send-keys %q: %v: %s", keys, err, out)
	}
}

func (s *tmuxSession) typeText(text string) {
	s.t.Helper()
	if out, err := s.tmux("send-keys", "-t", "e2e", "-l", text); err != nil {
		s.t.Fatalf("tmux send-keys -l %q: %v: %s", text, err, out)
	}
}

func (s *tmuxSession) screen() string {
	out, _ := s.tmux("capture-pane", "-p", "-t", "e2e")
	return out
}

// waitFor returns the screen once it contains every want, or fails with
// the last screen.
func (s *tmuxSession) waitFor(step string, want ...string) string {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		scr := s.screen()
		missing := ""
		for _, w := range want {
			if !strings.Contains(scr, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return scr
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: screen never showed %q:\n%s", step, missing, scr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestReplayEndToEndInTmux(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and drives it in tmux; runs in the full tier, not under -short")
	}
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed: cannot drive the UI in a terminal")
	}
	skipInVM(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "tracer")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build tracer: %v\n%s", err, out)
	}
	tracePath, err := filepath.Abs(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}

	s := &tmuxSession{t: t, socket: fmt.Sprintf("tracer-e2e-%d", os.Getpid())}
	t.Cleanup(func() { s.tmux("kill-server") })
	cmd := fmt.Sprintf("%s replay %s", bin, tracePath)
	if out, err := s.tmux("new-session", "-d", "-s", "e2e", "-x", "100", "-y", "30", "-c", work, cmd); err != nil {
		t.Fatalf("start tmux: %v: %s", err, out)
	}

	scr := s.waitFor("start", "node node-2", "hooks 7/8", "11 of 11", "hijack", "▶")
	t.Logf("start:\n%s", scr)

	s.send("/")
	s.typeText("port:3306")
	scr = s.waitFor("filter", "/ port:3306", "2 of 11")
	if strings.Contains(scr, "✓ ok") || strings.Count(scr, "! hijack") != 2 {
		t.Fatalf("filter port:3306 should leave the two hijack rows:\n%s", scr)
	}
	s.send("Enter") // close the filter bar
	s.send("Enter") // open the selected flow
	scr = s.waitFor("details", "HOSTPORT-HIJACK", "Decision chain", "dnat  hook nf_nat_setup_info via fentry",
		"CNI-DN-733b5c318e3a34b1f1ddf", "owner: pod db/mysql-b-0")
	t.Logf("details:\n%s", scr)

	s.send("e")
	scr = s.waitFor("export", "exported 2 flows to "+work)
	exported := exportedPath(t, scr, work)

	s.send("q")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := s.tmux("has-session", "-t", "e2e"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("q did not quit:\n%s", s.screen())
		}
		time.Sleep(50 * time.Millisecond)
	}

	got, err := trace.ReadFile(exported)
	if err != nil {
		t.Fatalf("the export does not re-open: %v", err)
	}
	orig, err := trace.ReadFile(tracePath)
	if err != nil {
		t.Fatal(err)
	}
	// The UI shows flows re-diagnosed against the snapshot: the export must
	// hold exactly those, as `replay -o json` gives them.
	shown, err := exec.Command(bin, "replay", "-o", "json", "--filter", "port:3306", tracePath).Output()
	if err != nil {
		t.Fatal(err)
	}
	want, err := trace.ReadAll(bytes.NewReader(shown), "replay -o json")
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Flows) != 2 || !reflect.DeepEqual(got.Flows, want.Flows) {
		t.Errorf("exported flows differ from the trace's port:3306 flows (%d exported, %d shown)", len(got.Flows), len(want.Flows))
	}
	if got.Summary == nil || got.Summary.Flows != 2 || got.Header.Filter != "port:3306" || !reflect.DeepEqual(got.Header.Snapshot, orig.Header.Snapshot) {
		t.Errorf("export header/summary: filter %q summary %+v", got.Header.Filter, got.Summary)
	}
	// The export replays too.
	out, err := exec.Command(bin, "replay", "-o", "json", exported).Output()
	if err != nil || strings.Count(string(out), "\n") != 4 {
		t.Errorf("replay of the export: %v\n%s", err, out)
	}
}

// exportedPath finds the file named in the status line.
func exportedPath(t *testing.T, screen, dir string) string {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(dir, "tracer-export-*.ndjson"))
	if len(matches) != 1 {
		t.Fatalf("want one export in %s, found %v; screen:\n%s", dir, matches, screen)
	}
	if !strings.Contains(screen, filepath.Base(matches[0])) && !strings.Contains(screen, "tracer-export-") {
		t.Errorf("the screen does not name the export %s:\n%s", matches[0], screen)
	}
	return matches[0]
}
