package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/charmbracelet/x/term"

	"github.com/tracer-dev/tracer/internal/trace"
)

func runTracer(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = dispatch(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestReplayJSONReemitsFiltered(t *testing.T) {
	code, out, stderr := runTracer("replay", "-o", "json", "--filter", "!verdict:ok proto:tcp", incidentTrace)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	tr, err := trace.ReadAll(strings.NewReader(out), "stdout")
	if err != nil {
		t.Fatalf("output is not a trace: %v", err)
	}
	if len(tr.Flows) != 6 || tr.Summary == nil || tr.Summary.Flows != 6 || tr.Header.Filter != "!verdict:ok proto:tcp" {
		t.Errorf("%d flows, summary %+v, filter %q", len(tr.Flows), tr.Summary, tr.Header.Filter)
	}
	// Flags may follow the file too.
	if code, out2, _ := runTracer("replay", incidentTrace, "-o", "json", "--filter", "!verdict:ok proto:tcp"); code != 0 || out2 != out {
		t.Errorf("flags after FILE: exit %d, same output %v", code, out2 == out)
	}
}

// A recorded verdict is not trusted: replay diagnoses each flow again
// against the header's snapshot, so a stale or older verdict is corrected.
func TestReplayRediagnoses(t *testing.T) {
	data, err := os.ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	stale := 0
	for i, l := range lines {
		if strings.Contains(l, `"verdict":"ipvs-filter-reject"`) {
			l = strings.Replace(l, `"verdict":"ipvs-filter-reject"`, `"verdict":"ok"`, 1)
			lines[i] = regexp.MustCompile(`"explanation":"[^"]*"`).ReplaceAllString(l, `"explanation":"stale"`)
			stale++
		}
	}
	if stale == 0 {
		t.Fatal("the incident trace has no ipvs-filter-reject flow to make stale")
	}
	path := filepath.Join(t.TempDir(), "stale.ndjson")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runTracer("replay", "-o", "json", "--filter", "verdict:ipvs-filter-reject", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	tr, err := trace.ReadAll(strings.NewReader(out), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Flows) != stale {
		t.Fatalf("%d flows re-diagnosed as ipvs-filter-reject, want %d", len(tr.Flows), stale)
	}
	for _, f := range tr.Flows {
		if f.Explanation == "stale" || !strings.Contains(f.Explanation, "KUBE-IPVS-FILTER") {
			t.Errorf("explanation not re-derived: %s", f.Explanation)
		}
	}
}

func TestReplayBadInputExitsTwo(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.ndjson")
	data, err := os.ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	lines[3] = strings.Replace(lines[3], `"proto":"tcp"`, `"proto":"tpc"`, 1)
	os.WriteFile(bad, []byte(strings.Join(lines, "")), 0o644)

	cases := []struct {
		name string
		args []string
		want string
	}{
		{"malformed", []string{"replay", "-o", "json", bad}, bad + `:4: bad flow: proto "tpc"`},
		{"bad filter", []string{"replay", "-o", "json", "--filter", "ns:db port:abc", incidentTrace}, "port:abc: not a port number (0-65535) (column 7)"},
		{"no file", []string{"replay"}, "replay needs a trace FILE"},
		{"two files", []string{"replay", incidentTrace, incidentTrace}, "replay takes one trace FILE"},
		{"missing file", []string{"replay", filepath.Join(dir, "nope.ndjson")}, "no such file"},
		{"bad output", []string{"replay", "-o", "yaml", incidentTrace}, `-o "yaml": use ui or json`},
		{"not a terminal", []string{"replay", incidentTrace}, "use `tracer trace -o json`"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "not a terminal" && (term.IsTerminal(os.Stdin.Fd()) && term.IsTerminal(os.Stdout.Fd())) {
				t.Skip("the test's stdin and stdout are a terminal: the UI would start")
			}
			code, _, stderr := runTracer(c.args...)
			if code != 2 || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, stderr, c.want)
			}
		})
	}
}

func TestReplayCutOffTraceWarns(t *testing.T) {
	data, err := os.ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	cut := filepath.Join(t.TempDir(), "cut.ndjson")
	os.WriteFile(cut, []byte(strings.Join(lines[:5], "")), 0o644)
	code, out, stderr := runTracer("replay", "-o", "json", cut)
	if code != 0 || !strings.Contains(stderr, "warning: "+cut+": no summary line") || strings.Count(out, `"type":"flow"`) != 4 {
		t.Errorf("exit %d, stderr %q, output:\n%s", code, stderr, out)
	}
}

// An IPv6 recording (the lab's dual-stack hostPort hijack, recorded live)
// replays with the verdicts, pods and Services the live tracer gave.
func TestReplayIPv6Recording(t *testing.T) {
	const path = "../../internal/audit/testdata/lab-dualstack-hostport-hijack-clusterip.ndjson"
	rec, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runTracer("replay", "-o", "json", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got, err := trace.ReadAll(strings.NewReader(out), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Flows) != len(rec.Flows) || len(got.Flows) == 0 {
		t.Fatalf("%d flows replayed, %d recorded", len(got.Flows), len(rec.Flows))
	}
	for i, f := range got.Flows {
		r := rec.Flows[i]
		if !strings.HasPrefix(f.Orig.Src, "[") || f.Verdict != r.Verdict || f.DstPod.Key() != r.DstPod.Key() || f.Service.Name != r.Service.Name {
			t.Errorf("%s -> %s: replayed %s, pod %s, Service %v; live %s, %s, %v", f.Orig.Src, f.Orig.Dst, f.Verdict, f.DstPod.Key(), f.Service, r.Verdict, r.DstPod.Key(), r.Service)
		}
	}
}
