package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
)

// maxLineBytes bounds one line; a header with a large node snapshot (all
// rules, ipsets, pods) is the longest line a trace has.
const maxLineBytes = 256 << 20

// ParseError is a malformed trace: which file, which line, what is wrong.
type ParseError struct {
	File string
	Line int
	Err  error
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

// Record is one line after the header: exactly one field is set.
type Record struct {
	Flow    *Flow
	Event   *Event
	State   *StateChange
	Summary *Summary
}

// Reader reads and validates a trace: a header with schema tracer/v1 first,
// then flow and event lines, then an optional summary. A trace without its
// summary (cut off) is readable; Warnings says so once the end is reached.
type Reader struct {
	name     string
	sc       *bufio.Scanner
	line     int
	header   Header
	summary  *Summary
	warnings []string
	lastNoNL bool // the last line read had no newline: it may be cut off
}

// NewReader reads the header from r. name is used in errors (a path, or
// "-" for stdin).
func NewReader(r io.Reader, name string) (*Reader, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	tr := &Reader{name: name, sc: sc}
	sc.Split(tr.splitLines)
	line, err := tr.nextLine()
	if err == io.EOF {
		return nil, tr.errorf("empty file: a trace starts with a header line")
	}
	if err != nil {
		return nil, err
	}
	if err := tr.parseHeader(line); err != nil {
		return nil, err
	}
	return tr, nil
}

// Header returns the trace's header.
func (r *Reader) Header() *Header { return &r.header }

// Summary returns the summary, or nil before the end or when the trace was
// cut off.
func (r *Reader) Summary() *Summary { return r.summary }

// Warnings lists what was wrong but readable (a missing summary, a cut-off
// last line), known once Next has returned io.EOF.
func (r *Reader) Warnings() []string { return r.warnings }

// Next returns the next flow, event or summary, or io.EOF at the end.
func (r *Reader) Next() (Record, error) {
	line, err := r.nextLine()
	if err == io.EOF {
		if r.summary == nil {
			r.warnings = append(r.warnings, fmt.Sprintf("%s: no summary line: the trace was cut off after line %d", r.name, r.line))
		}
		return Record{}, io.EOF
	}
	if err != nil {
		return Record{}, err
	}
	if r.summary != nil {
		return Record{}, r.errorf("%s line after the summary: the summary must be the last line", recordType(line))
	}
	rec, err := r.parseRecord(line)
	if err != nil && r.lastNoNL {
		// A writer killed mid-line leaves a partial last line: keep what
		// came before it.
		r.warnings = append(r.warnings, fmt.Sprintf("%s:%d: incomplete last line ignored (%v)", r.name, r.line, err))
		return r.Next()
	}
	return rec, err
}

// nextLine returns the next non-blank line.
func (r *Reader) nextLine() ([]byte, error) {
	for r.sc.Scan() {
		r.line++
		line := bytes.TrimSpace(r.sc.Bytes())
		if len(line) > 0 {
			return line, nil
		}
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &ParseError{r.name, r.line + 1, fmt.Errorf("line longer than %d bytes", maxLineBytes)}
		}
		return nil, fmt.Errorf("read trace %s: %w", r.name, err)
	}
	return nil, io.EOF
}

// splitLines is bufio.ScanLines that also remembers whether the last line
// ended without a newline.
func (r *Reader) splitLines(data []byte, atEOF bool) (int, []byte, error) {
	adv, tok, err := bufio.ScanLines(data, atEOF)
	if tok != nil {
		r.lastNoNL = atEOF && bytes.IndexByte(data[:adv], '\n') < 0
	}
	return adv, tok, err
}

func (r *Reader) errorf(format string, a ...any) error {
	return &ParseError{File: r.name, Line: r.line, Err: fmt.Errorf(format, a...)}
}

func (r *Reader) parseHeader(line []byte) error {
	typ := recordType(line)
	if typ != TypeHeader {
		return r.errorf("first line is %s, not a header: a trace starts with {\"type\":\"header\",\"schema\":%q,...}", describeType(typ), Schema)
	}
	if err := json.Unmarshal(line, &r.header); err != nil {
		return r.errorf("bad header: %v", jsonProblem(err))
	}
	if r.header.Schema != Schema {
		return r.errorf("schema %q is not %q: this tracer reads %s traces only", r.header.Schema, Schema, Schema)
	}
	for i, h := range r.header.Hooks {
		if h.Hook == "" {
			return r.errorf("header hooks[%d]: no hook name", i)
		}
	}
	return nil
}

// ParseFlow reads one flow as a trace's line holds it, checked as a
// Reader checks it: a flow that comes over the wire (tracer connect) is
// as untrusted as a file.
func ParseFlow(line []byte) (*Flow, error) {
	f := new(Flow)
	if err := json.Unmarshal(line, f); err != nil {
		return nil, fmt.Errorf("bad flow: %w", jsonProblem(err))
	}
	if f.Type != TypeFlow {
		return nil, fmt.Errorf("bad flow: type %q, want %q", f.Type, TypeFlow)
	}
	if err := validateFlow(f); err != nil {
		return nil, fmt.Errorf("bad flow: %w", err)
	}
	return f, nil
}

func (r *Reader) parseRecord(line []byte) (Record, error) {
	switch typ := recordType(line); typ {
	case TypeFlow:
		f, err := ParseFlow(line)
		if err != nil {
			return Record{}, r.errorf("%w", err)
		}
		return Record{Flow: f}, nil
	case TypeEvent:
		e := new(Event)
		if err := json.Unmarshal(line, e); err != nil {
			return Record{}, r.errorf("bad event: %v", jsonProblem(err))
		}
		if err := validateEvent(e, ""); err != nil {
			return Record{}, r.errorf("bad event: %w", err)
		}
		return Record{Event: e}, nil
	case TypeState:
		c := new(StateChange)
		if err := json.Unmarshal(line, c); err != nil {
			return Record{}, r.errorf("bad state change: %v", jsonProblem(err))
		}
		if err := validateState(c); err != nil {
			return Record{}, r.errorf("bad state change: %w", err)
		}
		return Record{State: c}, nil
	case TypeSummary:
		s := new(Summary)
		if err := json.Unmarshal(line, s); err != nil {
			return Record{}, r.errorf("bad summary: %v", jsonProblem(err))
		}
		r.summary = s
		return Record{Summary: s}, nil
	case TypeHeader:
		return Record{}, r.errorf("a second header: a trace has one header, on its first line")
	default:
		return Record{}, r.errorf("%s: expected a flow, event, state or summary", describeType(typ))
	}
}

// recordType returns the "type" of a JSON object line, "" when the line is
// not a JSON object or has no string type, or "\x00" for invalid JSON.
func recordType(line []byte) string {
	var probe struct {
		Type json.RawMessage `json:"type"`
	}
	if err := json.Unmarshal(line, &probe); err != nil {
		return "\x00"
	}
	var s string
	if json.Unmarshal(probe.Type, &s) != nil {
		return ""
	}
	return s
}

func describeType(typ string) string {
	switch typ {
	case "\x00":
		return "not valid JSON"
	case "":
		return "a line without a \"type\""
	default:
		return fmt.Sprintf("unknown record type %q", typ)
	}
}

// jsonProblem rewords encoding/json errors to say where in the line.
func jsonProblem(err error) error {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		return fmt.Errorf("field %q: %s is not a %s", ute.Field, ute.Value, ute.Type)
	}
	return err
}

func validateFlow(f *Flow) error {
	if f.Time.IsZero() {
		return errors.New("no time")
	}
	switch f.Proto {
	case "tcp", "udp", "icmp", "icmpv6", "sctp":
	case "":
		return errors.New("no proto")
	default:
		return fmt.Errorf("proto %q is not tcp, udp, icmp, icmpv6 or sctp", f.Proto)
	}
	if err := validateTuple("orig", f.Proto, &f.Orig); err != nil {
		return err
	}
	if f.Reply != nil {
		if err := validateTuple("reply", f.Proto, f.Reply); err != nil {
			return err
		}
	}
	if f.Verdict != "" && !KnownVerdict(f.Verdict) {
		return fmt.Errorf("unknown verdict %q", f.Verdict)
	}
	for i := range f.Events {
		if err := validateEvent(&f.Events[i], f.Proto); err != nil {
			return fmt.Errorf("events[%d]: %w", i, err)
		}
	}
	return nil
}

// validateEvent checks e; flowProto stands in for a proto the event lacks.
func validateEvent(e *Event, flowProto string) error {
	if e.Kind == "" {
		return errors.New("no kind")
	}
	if !KnownKind(e.Kind) {
		return fmt.Errorf("unknown kind %q", e.Kind)
	}
	if e.Time.IsZero() {
		return errors.New("no time")
	}
	for _, t := range []struct {
		name string
		t    *Tuple
	}{{"packet", e.Packet}, {"orig", e.Orig}, {"reply", e.Reply}} {
		if t.t == nil {
			continue
		}
		proto := e.Proto
		if proto == "" {
			proto = flowProto
		}
		if err := validateTuple(t.name, proto, t.t); err != nil {
			return err
		}
	}
	return nil
}

// validateTuple checks both endpoints are IP:PORT, or bare IPs for ICMP,
// which has no ports.
func validateTuple(name, proto string, t *Tuple) error {
	for _, side := range []struct{ name, addr string }{{"src", t.Src}, {"dst", t.Dst}} {
		if _, err := netip.ParseAddrPort(side.addr); err == nil {
			continue
		}
		if _, err := netip.ParseAddr(side.addr); err == nil && (proto == "icmp" || proto == "icmpv6") {
			continue
		}
		if proto == "icmp" || proto == "icmpv6" {
			return fmt.Errorf("%s.%s %q is not IP or IP:PORT", name, side.name, side.addr)
		}
		return fmt.Errorf("%s.%s %q is not IP:PORT", name, side.name, side.addr)
	}
	return nil
}

// File is a whole trace read into memory.
type File struct {
	Header Header
	Flows  []*Flow
	Events []*Event
	// States are the node's state changes, in the order recorded.
	States   []*StateChange
	Summary  *Summary // nil when the trace was cut off
	Warnings []string
}

// ReadFile reads and validates the trace at path.
func ReadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	return ReadAll(f, path)
}

// ReadAll reads and validates a whole trace from r.
func ReadAll(r io.Reader, name string) (*File, error) {
	tr, err := NewReader(r, name)
	if err != nil {
		return nil, err
	}
	out := &File{Header: *tr.Header()}
	for {
		rec, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		switch {
		case rec.Flow != nil:
			out.Flows = append(out.Flows, rec.Flow)
		case rec.Event != nil:
			out.Events = append(out.Events, rec.Event)
		case rec.State != nil:
			out.States = append(out.States, rec.State)
		}
	}
	out.Summary = tr.Summary()
	out.Warnings = tr.Warnings()
	return out, nil
}
