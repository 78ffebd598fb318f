package trace

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const incidentTrace = "../../testdata/traces/node2-incident.ndjson"

func TestReadFileIncidentTrace(t *testing.T) {
	tr, err := ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Header.Node != "node-2" || tr.Summary == nil || len(tr.Warnings) != 0 {
		t.Fatalf("header node %q, summary %v, warnings %v", tr.Header.Node, tr.Summary, tr.Warnings)
	}
	if tr.Summary.Flows != len(tr.Flows) {
		t.Errorf("summary says %d flows, read %d", tr.Summary.Flows, len(tr.Flows))
	}
	seen := map[string]bool{}
	for _, f := range tr.Flows {
		seen[f.Verdict] = true
	}
	for _, v := range []string{VerdictOK, VerdictHostportHijack, VerdictIPVSFilterReject, VerdictIPVSNoEndpoint, VerdictReturnPathMismatch, VerdictReset, VerdictDropped} {
		if !seen[v] {
			t.Errorf("incident trace has no %s flow", v)
		}
	}
}

func TestWriterRoundTrip(t *testing.T) {
	in, err := ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "out.ndjson")
	hdr := in.Header
	hdr.Conntrack = []ConntrackSource{
		{Netns: "/run/netns/node", Inode: 4026532283, Lookups: LookupsBPF, Ends: EndsKernel},
		{Lookups: LookupsNetlink, LookupsWhy: "the kernel has no bpf_xdp_ct_lookup", Ends: EndsDestroyEvents},
	}
	w, err := Create(path, hdr)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range in.Flows {
		if err := w.WriteFlow(f); err != nil {
			t.Fatal(err)
		}
	}
	// Before Close the file already holds every flow (what a SIGKILL
	// leaves), and the reader says the summary is missing.
	cut, err := ReadFile(path)
	if err != nil {
		t.Fatalf("the unclosed trace does not read: %v", err)
	}
	if len(cut.Flows) != len(in.Flows) || cut.Summary != nil || len(cut.Warnings) != 1 || !strings.Contains(cut.Warnings[0], "no summary line") {
		t.Fatalf("unclosed trace: %d of %d flows, summary %v, warnings %q", len(cut.Flows), len(in.Flows), cut.Summary, cut.Warnings)
	}
	w.SetLoss(Summary{LostEvents: 3, LostByHook: map[string]uint64{"kfree_skb": 3}, ConntrackOverruns: 2,
		ConntrackBPFLookups: 40, ConntrackLookupsOff: "conntrack lookup by BPF failed"})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out.Flows, in.Flows) {
		t.Error("flows differ after a write and read")
	}
	if out.Summary.LostEvents != 3 || out.Summary.ConntrackOverruns != 2 ||
		out.Summary.Flows != len(in.Flows) || out.Summary.Verdicts[VerdictHostportHijack] != 2 ||
		out.Summary.ConntrackBPFLookups != 40 || out.Summary.ConntrackLookupsOff != "conntrack lookup by BPF failed" {
		t.Errorf("summary %+v", out.Summary)
	}
	if !reflect.DeepEqual(out.Header.Conntrack, hdr.Conntrack) {
		t.Errorf("header conntrack %+v, wrote %+v", out.Header.Conntrack, hdr.Conntrack)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("files beside the trace: %v", ents)
	}
}

// A write that fails (here: the file closed under the writer, as a full
// disk fails it) keeps what was written readable.
func TestWriterFailureKeepsWhatWasWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.ndjson")
	w, err := Create(path, Header{Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	f := &Flow{Time: time.Unix(1, 0).UTC(), Proto: "tcp", Orig: Tuple{"10.0.0.1:1", "10.0.0.2:2"}, Verdict: VerdictOK}
	if err := w.WriteFlow(f); err != nil {
		t.Fatal(err)
	}
	w.file.Close()
	if err := w.WriteFlow(f); err == nil {
		t.Fatal("a write to a closed file succeeded")
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close after a failed write reports no error")
	}
	tr, err := ReadFile(path)
	if err != nil || len(tr.Flows) != 1 {
		t.Fatalf("what was written is gone: %v, %d flows", err, len(tr.Flows))
	}
}

func TestWriterAbortLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(filepath.Join(dir, "x.ndjson"), Header{})
	if err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("abort left %v", ents)
	}
}

func TestWriterOneWritePerLine(t *testing.T) {
	var writes countingWriter
	w, err := NewWriter(&writes, Header{Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	f := &Flow{Time: time.Unix(1, 0).UTC(), Proto: "tcp", Orig: Tuple{"10.0.0.1:1", "10.0.0.2:2"}, Verdict: VerdictOK}
	w.WriteFlow(f)
	w.Close()
	if writes.n != 3 || strings.Count(writes.buf.String(), "\n") != 3 {
		t.Errorf("%d writes for 3 lines:\n%s", writes.n, writes.buf.String())
	}
	if !strings.Contains(writes.buf.String(), `"events":[]`) {
		t.Errorf("flow without events must write events:[]: %s", writes.buf.String())
	}
}

type countingWriter struct {
	n   int
	buf bytes.Buffer
}

func (c *countingWriter) Write(p []byte) (int, error) { c.n++; return c.buf.Write(p) }

func TestReaderErrorsNameFileAndLine(t *testing.T) {
	const hdr = `{"type":"header","schema":"tracer/v1","started":"2026-01-01T00:00:00Z","hooks":[]}` + "\n"
	const flow = `{"type":"flow","time":"2026-01-01T00:00:01Z","proto":"tcp","orig":{"src":"10.0.0.1:1","dst":"10.0.0.2:80"},"events":[]}` + "\n"
	cases := []struct{ name, in, want string }{
		{"empty", "", "t.ndjson:0: empty file"},
		{"not json", "hello\n", "t.ndjson:1: first line is not valid JSON"},
		{"flow first", flow, "t.ndjson:1: first line is unknown record type \"flow\", not a header"},
		{"schema", `{"type":"header","schema":"tracer/v9","hooks":[]}` + "\n", `t.ndjson:1: schema "tracer/v9" is not "tracer/v1"`},
		{"bad tuple", hdr + strings.Replace(flow, "10.0.0.2:80", "10.0.0.2", 1), `t.ndjson:2: bad flow: orig.dst "10.0.0.2" is not IP:PORT`},
		{"bad proto", hdr + "\n" + strings.Replace(flow, `"tcp"`, `"tpc"`, 1), `t.ndjson:3: bad flow: proto "tpc"`},
		{"bad verdict", hdr + strings.Replace(flow, `"events":[]`, `"events":[],"verdict":"hijack"`, 1), `t.ndjson:2: bad flow: unknown verdict "hijack"`},
		{"bad kind", hdr + strings.Replace(flow, `"events":[]`, `"events":[{"kind":"nat","time":"2026-01-01T00:00:01Z"}]`, 1), `t.ndjson:2: bad flow: events[0]: unknown kind "nat"`},
		{"wrong type", hdr + strings.Replace(flow, `"proto":"tcp"`, `"proto":6`, 1), `t.ndjson:2: bad flow: field "proto": number is not a string`},
		{"unknown type", hdr + `{"type":"packet"}` + "\n", `t.ndjson:2: unknown record type "packet"`},
		{"two headers", hdr + hdr, "t.ndjson:2: a second header"},
		{"after summary", hdr + `{"type":"summary","flows":0}` + "\n" + flow, "t.ndjson:3: flow line after the summary"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadAll(strings.NewReader(c.in), "t.ndjson")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Errorf("%T is not a *ParseError", err)
			}
		})
	}
}

func TestReaderCutOffTrace(t *testing.T) {
	data, err := os.ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	// No summary: the last 2 entries are the summary and "" after it.
	noSummary := strings.Join(lines[:len(lines)-2], "")
	tr, err := ReadAll(strings.NewReader(noSummary), "cut.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	if tr.Summary != nil || len(tr.Flows) != 11 || len(tr.Warnings) != 1 || !strings.Contains(tr.Warnings[0], "cut off") {
		t.Fatalf("summary %v, %d flows, warnings %q", tr.Summary, len(tr.Flows), tr.Warnings)
	}
	// Cut in the middle of the last flow line: that line is dropped.
	midLine := noSummary[:len(noSummary)-40]
	tr, err = ReadAll(strings.NewReader(midLine), "cut.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Flows) != 10 || len(tr.Warnings) != 2 || !strings.Contains(tr.Warnings[0], "cut.ndjson:12: incomplete last line") {
		t.Fatalf("%d flows, warnings %q", len(tr.Flows), tr.Warnings)
	}
}

func TestStoreSharesAndCounts(t *testing.T) {
	tr, err := ReadFile(incidentTrace)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore()
	for _, f := range tr.Flows {
		s.Append(f)
	}
	if s.Len() != len(tr.Flows) {
		t.Fatalf("len %d", s.Len())
	}
	for i, f := range tr.Flows {
		if !reflect.DeepEqual(s.At(i), f) {
			t.Errorf("flow %d changed in the store:\n got %+v\nwant %+v", i, s.At(i), f)
		}
	}
	events, verdicts := s.Counts()
	if events != tr.Summary.Events || !reflect.DeepEqual(verdicts, tr.Summary.Verdicts) {
		t.Errorf("counts %d %v, summary %d %v", events, verdicts, tr.Summary.Events, tr.Summary.Verdicts)
	}
	a, b := s.At(1), s.At(9) // the two hijack flows
	if a.Rule.Text != b.Rule.Text || a.SrcPod != b.SrcPod || a.Service != b.Service {
		t.Error("repeated pods and services are not shared")
	}
	if a.Events[0].Packet != &a.Orig {
		t.Error("an event's packet equal to the flow's orig tuple is not shared")
	}
	view := s.Snapshot()
	s.Append(tr.Flows[0])
	if view.Len() != len(tr.Flows) || s.Len() != len(tr.Flows)+1 || !reflect.DeepEqual(view.At(0), s.At(0)) {
		t.Error("a snapshot must keep its length and its flows")
	}
}

func FuzzReader(f *testing.F) {
	data, err := os.ReadFile(incidentTrace)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	lines := bytes.SplitAfter(data, []byte("\n"))
	f.Add(bytes.Join(lines[:3], nil))
	f.Add(append(append([]byte{}, lines[0]...), `{"type":"flow","events":[{"kind":"drop"}]}`...))
	f.Add([]byte(`{"type":"header","schema":"tracer/v1","hooks":[{}]}`))
	f.Add(append(append([]byte{}, lines[0]...), `{"type":"state","time":"2026-01-01T00:00:00Z","changed":["rules:nat"],"snapshot":{"rules":{"nat":"x"}}}`...))
	f.Add(append(append([]byte{}, lines[0]...), `{"type":"state","time":"2026-01-01T00:00:00Z","changed":["metadata","warnings"],"snapshot":{},"metadata":{"pods":[{"namespace":"a","name":"b","ips":["10.0.0.1"]}],"services_gone":[{"namespace":"a","name":"s"}]},"warnings":["x"]}`...))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := NewReader(bytes.NewReader(in), "fuzz")
		if err != nil {
			return
		}
		for {
			rec, err := r.Next()
			if err != nil {
				if err != io.EOF {
					var pe *ParseError
					if !errors.As(err, &pe) {
						t.Fatalf("error %v is not a ParseError", err)
					}
				}
				return
			}
			if rec.Flow == nil && rec.Event == nil && rec.State == nil && rec.Summary == nil {
				t.Fatal("empty record without error")
			}
			if rec.State != nil {
				NewTimeline(&Snapshot{}).Add(rec.State) // a valid change applies to any state
			}
		}
	})
}

func TestParseEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"10.96.0.20:3306":   "10.96.0.20:3306",
		"[fd00::1]:443":     "[fd00::1]:443",
		"10.96.0.10":        "10.96.0.10:0", // ICMP
		"fd96::10":          "[fd96::10]:0", // ICMPv6
		"10.0.0.1-10.0.0.9": "invalid AddrPort",
		"":                  "invalid AddrPort",
	} {
		if got := ParseEndpoint(in).String(); got != want {
			t.Errorf("ParseEndpoint(%q) = %s, want %s", in, got, want)
		}
	}
}

// FuzzParseEndpoint: the bare-IP shortcut reads every string as reading
// IP:PORT first, then a bare IP, does.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "10.0.0.1", "[fd00::1]:53", "fd00::1", "fd00::1:80", "[fd00::1]", "::", ":80", "1.2.3.4:", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := netip.AddrPort{}
		if ap, err := netip.ParseAddrPort(s); err == nil {
			want = ap
		} else if a, err := netip.ParseAddr(s); err == nil {
			want = netip.AddrPortFrom(a, 0)
		}
		if got := ParseEndpoint(s); got != want {
			t.Errorf("ParseEndpoint(%q) = %v, want %v", s, got, want)
		}
	})
}

// ICMP has no ports: the tracer writes its tuples as bare IPs, and a
// recorded ping must read back (`tracer lab --record` of ping-clusterip).
func TestReaderTakesICMPWithoutPorts(t *testing.T) {
	const in = `{"type":"header","schema":"tracer/v1","started":"2026-01-01T00:00:00Z","hooks":[]}
{"type":"flow","time":"2026-01-01T00:00:01Z","proto":"icmp","orig":{"src":"10.244.1.2","dst":"10.96.0.30"},"events":[{"kind":"reject","time":"2026-01-01T00:00:01Z","hook":"icmp_send","via":"tracepoint","proto":"icmp","packet":{"src":"10.244.1.2","dst":"10.96.0.30"}}],"verdict":"ipvs-filter-reject"}
{"type":"flow","time":"2026-01-01T00:00:02Z","proto":"icmpv6","orig":{"src":"fd00::2","dst":"fd00::30"},"events":[]}
`
	tr, err := ReadAll(strings.NewReader(in), "ping.ndjson")
	if err != nil {
		t.Fatalf("an ICMP flow without ports is refused: %v", err)
	}
	if len(tr.Flows) != 2 {
		t.Fatalf("%d flows, want 2", len(tr.Flows))
	}
	bad := strings.Replace(in, `"10.96.0.30"},"events":[{`, `"10.96.0.30:x"},"events":[{`, 1)
	if _, err := ReadAll(strings.NewReader(bad), "ping.ndjson"); err == nil || !strings.Contains(err.Error(), `orig.dst "10.96.0.30:x" is not IP or IP:PORT`) {
		t.Errorf("a malformed ICMP endpoint: error %v", err)
	}
}
