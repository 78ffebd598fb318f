package trace

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"time"
	"unicode/utf8"
	"unsafe"
)

// AppendFlow appends f as encoding/json writes it, without reflection or
// allocation: a flow is the line a trace writes most. Whatever the fast
// path does not cover (a time outside years 0-9999) is handed to the
// time's own MarshalJSON, so the bytes are json.Marshal's
// (TestAppendFlowMatchesMarshal holds them to it).
func AppendFlow(b []byte, f *Flow) ([]byte, error) { return (*FlowEncoder)(nil).AppendFlow(b, f) }

// FlowEncoder is AppendFlow with what it keeps from one flow to the next:
// the encoded form of each rule, since flows share the rule the
// attribution found (a rule is never changed once a flow holds it), and
// the text of the second the last time fell in, since a trace's times
// come in order. A nil FlowEncoder keeps nothing. It is not safe for
// concurrent use.
type FlowEncoder struct {
	rules map[*Rule][]byte
	// second is the Unix second secText spells in loc; zoneText follows
	// the fraction.
	second   int64
	loc      *time.Location
	secText  []byte
	zoneText []byte
}

// encodedRules bounds the rules a FlowEncoder keeps; a full map starts
// over.
const encodedRules = 4096

// AppendFlow is AppendFlow, from what e kept where it can.
func (e *FlowEncoder) AppendFlow(b []byte, f *Flow) ([]byte, error) {
	var err error
	b = append(b, `{"type":`...)
	b = appendString(b, f.Type)
	if f.Node != "" {
		b = append(b, `,"node":`...)
		b = appendString(b, f.Node)
	}
	if len(f.Nodes) > 0 {
		b = append(b, `,"nodes":`...)
		b = appendStrings(b, f.Nodes)
	}
	b = append(b, `,"time":`...)
	if b, err = e.appendTime(b, f.Time); err != nil {
		return b, err
	}
	b = append(b, `,"proto":`...)
	b = appendString(b, f.Proto)
	b = append(b, `,"orig":`...)
	b = appendTuple(b, &f.Orig)
	if f.Reply != nil {
		b = append(b, `,"reply":`...)
		b = appendTuple(b, f.Reply)
	}
	b = append(b, `,"events":`...)
	if f.Events == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range f.Events {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = e.appendEvent(b, &f.Events[i]); err != nil {
				return b, err
			}
		}
		b = append(b, ']')
	}
	if f.Rule != nil {
		b = append(b, `,"rule":`...)
		b = e.appendRule(b, f.Rule)
	}
	if c := f.Conntrack; c != nil {
		b = append(b, `,"conntrack":{`...)
		comma := false
		if c.State != "" {
			b = append(b, `"state":`...)
			b = appendString(b, c.State)
			comma = true
		}
		if len(c.Status) > 0 {
			b = appendKey(b, "status", comma)
			b = appendStrings(b, c.Status)
			comma = true
		}
		if c.Mark != 0 {
			b = appendKey(b, "mark", comma)
			b = strconv.AppendUint(b, uint64(c.Mark), 10)
			comma = true
		}
		if c.Unconfirmed {
			b = appendKey(b, "unconfirmed", comma)
			b = append(b, "true"...)
			comma = true
		}
		b = appendKey(b, "replied", comma)
		b = strconv.AppendBool(b, c.Replied)
		b = append(b, '}')
	}
	if f.SrcPod != nil {
		b = append(b, `,"src_pod":`...)
		b = appendPodRef(b, f.SrcPod)
	}
	if f.DstPod != nil {
		b = append(b, `,"dst_pod":`...)
		b = appendPodRef(b, f.DstPod)
	}
	if s := f.Service; s != nil {
		b = append(b, `,"service":{"namespace":`...)
		b = appendString(b, s.Namespace)
		b = append(b, `,"name":`...)
		b = appendString(b, s.Name)
		if s.Port != "" {
			b = append(b, `,"port":`...)
			b = appendString(b, s.Port)
		}
		b = append(b, '}')
	}
	if f.Verdict != "" {
		b = append(b, `,"verdict":`...)
		b = appendString(b, f.Verdict)
	}
	if f.Explanation != "" {
		b = append(b, `,"explanation":`...)
		b = appendString(b, f.Explanation)
	}
	return append(b, '}'), nil
}

func (enc *FlowEncoder) appendEvent(b []byte, e *Event) ([]byte, error) {
	b = append(b, '{')
	if e.Type != "" {
		b = append(b, `"type":`...)
		b = appendString(b, e.Type)
		b = append(b, ',')
	}
	if e.Node != "" {
		b = append(b, `"node":`...)
		b = appendString(b, e.Node)
		b = append(b, ',')
	}
	b = append(b, `"kind":`...)
	b = appendString(b, e.Kind)
	b = append(b, `,"time":`...)
	var err error
	if b, err = enc.appendTime(b, e.Time); err != nil {
		return b, err
	}
	b = append(b, `,"hook":`...)
	b = appendString(b, e.Hook)
	b = append(b, `,"via":`...)
	b = appendString(b, e.Via)
	b = appendOptString(b, "proto", e.Proto)
	if e.Netns != 0 {
		b = append(b, `,"netns":`...)
		b = strconv.AppendUint(b, uint64(e.Netns), 10)
	}
	for _, t := range [...]struct {
		name string
		t    *Tuple
	}{{"packet", e.Packet}, {"orig", e.Orig}, {"reply", e.Reply}} {
		if t.t != nil {
			b = appendKey(b, t.name, true)
			b = appendTuple(b, t.t)
		}
	}
	b = appendOptString(b, "to", e.To)
	b = appendOptString(b, "virtual", e.Virtual)
	b = appendOptString(b, "forward", e.Forward)
	b = appendOptString(b, "nf_hook", e.NFHook)
	if e.ICMPType != nil {
		b = append(b, `,"icmp_type":`...)
		b = strconv.AppendUint(b, uint64(*e.ICMPType), 10)
	}
	if e.ICMPCode != nil {
		b = append(b, `,"icmp_code":`...)
		b = strconv.AppendUint(b, uint64(*e.ICMPCode), 10)
	}
	b = appendOptString(b, "reason", e.Reason)
	if len(e.CTStatus) > 0 {
		b = append(b, `,"ct_status":`...)
		b = appendStrings(b, e.CTStatus)
	}
	if e.CTMark != 0 {
		b = append(b, `,"ct_mark":`...)
		b = strconv.AppendUint(b, uint64(e.CTMark), 10)
	}
	if e.CTZone != 0 {
		b = append(b, `,"ct_zone":`...)
		b = strconv.AppendUint(b, uint64(e.CTZone), 10)
	}
	b = appendOptString(b, "by", e.By)
	if e.NoConntrack {
		b = append(b, `,"no_conntrack":true`...)
	}
	if c := e.ConntrackTable; c != nil {
		b = append(b, `,"conntrack_table":{"entries":`...)
		b = strconv.AppendUint(b, uint64(c.Entries), 10)
		b = append(b, `,"max":`...)
		b = strconv.AppendUint(b, uint64(c.Max), 10)
		b = append(b, `,"drops":`...)
		b = strconv.AppendUint(b, c.Drops, 10)
		if c.InsertFailed != 0 {
			b = append(b, `,"insert_failed":`...)
			b = strconv.AppendUint(b, c.InsertFailed, 10)
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// appendRule appends r as encoded before, or encodes it and keeps that.
func (e *FlowEncoder) appendRule(b []byte, r *Rule) []byte {
	if e == nil {
		return appendRuleFields(b, r)
	}
	if enc, ok := e.rules[r]; ok {
		return append(b, enc...)
	}
	if e.rules == nil || len(e.rules) >= encodedRules {
		e.rules = make(map[*Rule][]byte)
	}
	start := len(b)
	b = appendRuleFields(b, r)
	e.rules[r] = append([]byte(nil), b[start:]...)
	return b
}

func appendRuleFields(b []byte, r *Rule) []byte {
	b = append(b, '{')
	comma := false
	if r.Backend != "" {
		b = append(b, `"backend":`...)
		b = appendString(b, r.Backend)
		comma = true
	}
	if r.Family != "" {
		b = appendKey(b, "family", comma)
		b = appendString(b, r.Family)
		comma = true
	}
	if r.Handle != 0 {
		b = appendKey(b, "handle", comma)
		b = strconv.AppendUint(b, r.Handle, 10)
		comma = true
	}
	if el := r.Element; el != nil {
		b = appendKey(b, "element", comma)
		b = append(b, '{')
		if el.Map != "" {
			b = append(b, `"map":`...)
			b = appendString(b, el.Map)
			b = append(b, ',')
		}
		b = append(b, `"key":`...)
		b = appendString(b, el.Key)
		b = appendOptString(b, "comment", el.Comment)
		b = append(b, '}')
		comma = true
	}
	b = appendKey(b, "table", comma)
	b = appendString(b, r.Table)
	b = append(b, `,"chain":`...)
	b = appendString(b, r.Chain)
	b = appendOptString(b, "entry_chain", r.EntryChain)
	if len(r.Path) > 0 {
		b = append(b, `,"path":`...)
		b = appendStrings(b, r.Path)
	}
	b = append(b, `,"text":`...)
	b = appendString(b, r.Text)
	if o := r.Owner; o != nil {
		b = append(b, `,"owner":{`...)
		if o.ContainerID != "" {
			b = append(b, `"container_id":`...)
			b = appendString(b, o.ContainerID)
		}
		if o.Pod != nil {
			b = appendKey(b, "pod", o.ContainerID != "")
			b = appendPodRef(b, o.Pod)
		}
		b = append(b, '}')
	}
	b = appendOptString(b, "uncertain", r.Uncertain)
	return append(b, '}')
}

func appendTuple(b []byte, t *Tuple) []byte {
	b = append(b, `{"src":`...)
	b = appendString(b, t.Src)
	b = append(b, `,"dst":`...)
	b = appendString(b, t.Dst)
	return append(b, '}')
}

func appendPodRef(b []byte, p *PodRef) []byte {
	b = append(b, `{"namespace":`...)
	b = appendString(b, p.Namespace)
	b = append(b, `,"name":`...)
	b = appendString(b, p.Name)
	return append(b, '}')
}

// appendKey appends "name": after a comma when comma is set.
func appendKey(b []byte, name string, comma bool) []byte {
	if comma {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

// appendOptString appends ,"name":"s" unless s is empty (omitempty).
func appendOptString(b []byte, name, s string) []byte {
	if s == "" {
		return b
	}
	b = appendKey(b, name, true)
	return appendString(b, s)
}

func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

// appendString quotes s as encoding/json does (HTML's <, > and & escaped,
// invalid UTF-8 as U+FFFD, U+2028 and U+2029 escaped). The runs that need
// nothing (printable ASCII other than those and the quote and backslash,
// valid UTF-8 other than the two) are copied whole; a rule's text with
// its quoted comments takes no detour through encoding/json.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0 // s[start:i] is yet to be copied
	data := unsafe.Pointer(unsafe.StringData(s))
	for i := 0; i < len(s); {
		// Eight bytes at a time; a word with a byte that needs a look
		// says which is the first, so an explanation's arrows cost one
		// look each rather than a byte at a time around them. m has the
		// high bit of each byte that needs one: at or above 0x80, below
		// 0x20 (w-0x20 borrows), or one of the five that JSON or HTML
		// escape, each found as a zero byte of x, y or z (which
		// borrows). '"' (0x22) and '&' (0x26) differ only in bit 2, '<'
		// (0x3c) and '>' (0x3e) only in bit 1, so setting that bit makes
		// each pair one byte, which no other byte becomes. A borrow can
		// mark a byte above the first that needs a look, never one below
		// it: the lowest mark is exact. Written out here: as a function
		// it is too dear for the compiler to inline.
		for i+8 <= len(s) {
			w := binary.LittleEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(data, i)), 8))
			x, y, z := w^loBits*'\\', (w|loBits*0x04)^loBits*'&', (w|loBits*0x02)^loBits*'>'
			m := (w | (w-loBits*0x20)&^w | (x-loBits)&^x | (y-loBits)&^y | (z-loBits)&^z) & hiBits
			if m != 0 {
				i += bits.TrailingZeros64(m) / 8
				break
			}
			i += 8
		}
		if i == len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = appendEscapedByte(append(b, s[start:i]...), c)
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			switch r {
			case utf8.RuneError:
				b = append(b, `\ufffd`...)
			default:
				b = append(b, `\u202`...)
				b = append(b, hexDigits[r&0xf])
			}
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendEscapedByte writes c, an ASCII byte JSON or HTML escape, as
// encoding/json does.
func appendEscapedByte(b []byte, c byte) []byte {
	switch c {
	case '"', '\\':
		return append(b, '\\', c)
	case '\b':
		return append(b, '\\', 'b')
	case '\f':
		return append(b, '\\', 'f')
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	return append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
}

const (
	loBits = 0x0101010101010101
	hiBits = 0x8080808080808080
)

// appendTime writes t as time.Time's MarshalJSON does (RFC 3339 with
// nanoseconds, quoted); MarshalJSON itself writes the times it refuses
// (a year outside 0-9999, a zone a day or more from UTC), and says why.
func (e *FlowEncoder) appendTime(b []byte, t time.Time) ([]byte, error) {
	if _, off := t.Zone(); t.Year() < 0 || t.Year() > 9999 || off <= -24*3600 || off >= 24*3600 {
		q, err := t.MarshalJSON()
		return append(b, q...), err
	}
	b = append(b, '"')
	if e == nil {
		b = t.AppendFormat(b, time.RFC3339Nano)
		return append(b, '"'), nil
	}
	if t.Unix() != e.second || t.Location() != e.loc {
		e.spellSecond(t)
	}
	b = append(b, e.secText...)
	b = appendFraction(b, t.Nanosecond())
	b = append(b, e.zoneText...)
	return append(b, '"'), nil
}

// spellSecond keeps the text of t's second in RFC 3339 (a four-digit
// year: appendTime hands the others to encoding/json) and of its zone.
// A new encoder has no location, which no time has, so its first time
// is spelled.
func (e *FlowEncoder) spellSecond(t time.Time) {
	text := t.AppendFormat(nil, time.RFC3339)
	const secLen = len("2006-01-02T15:04:05")
	e.secText, e.zoneText = text[:secLen], text[secLen:]
	e.second, e.loc = t.Unix(), t.Location()
}

// appendFraction appends RFC3339Nano's fraction of a second: nothing for
// none, else a point and the nanoseconds without their trailing zeros.
func appendFraction(b []byte, ns int) []byte {
	if ns == 0 {
		return b
	}
	var d [10]byte
	d[0] = '.'
	for i := 9; i >= 1; i-- {
		d[i] = byte('0' + ns%10)
		ns /= 10
	}
	n := 10
	for d[n-1] == '0' {
		n--
	}
	return append(b, d[:n]...)
}
