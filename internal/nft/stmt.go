package nft

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// stmt is one statement of a rule.
type stmt struct {
	kind skind
	// sMatch: left op right, right being constants (one per field of a
	// concatenation) or a set.
	op    string
	left  *expr
	right []keyPart
	set   *Set
	// sVerdict, and a vmap's set of verdict elements.
	verdict *verdict
	// sReject
	reject rejectSpec
	// sNAT
	nat natSpec
	// sMark: meta mark set left.
	// why is what an sUnknown statement was.
	why string
}

type skind uint8

const (
	sNop     skind = iota + 1 // counter, log, notrack, ...: no effect on the walk
	sMatch                    // a comparison: the rule goes on only if it holds
	sVerdict                  // accept, drop, jump, ...
	sVmap                     // a verdict map lookup
	sReject
	sNAT
	sMark
	sUnknown // a statement this package does not model: anything could happen
)

// rejectSpec is what a reject statement sends.
type rejectSpec struct {
	reset bool
	// icmpx is the family-independent type ("port-unreachable" in inet
	// tables); otherwise typ and code are the ICMP or ICMPv6 values.
	icmpx     string
	typ, code uint8
	text      string
}

// natSpec is a dnat, snat, masquerade or redirect statement.
type natSpec struct {
	kind       string // dnat, snat, masquerade, redirect
	addr       *keyPart
	port       *keyPart
	undecided  string // an address or port from a map or expression this package does not compute
	flags      []string
	familyHint string
}

var nopStmts = map[string]bool{"counter": true, "log": true, "notrack": true, "quota": false, "limit": false,
	"flow": true, "ct count": false, "set": true, "synproxy": false, "tproxy": false, "dup": true, "fwd": false,
	"secmark": true, "xt": false}

// stmt reads one rule statement.
func (p *parser) stmt(raw json.RawMessage, t *Table) (stmt, error) {
	var o map[string]json.RawMessage
	if err := json.Unmarshal(raw, &o); err != nil || len(o) != 1 {
		return stmt{}, fmt.Errorf("statement %s not read", clip(raw))
	}
	for k, v := range o {
		switch k {
		case "match":
			return p.match(v, t)
		case "accept", "drop", "continue", "return", "jump", "goto", "queue":
			vd, err := readVerdict(raw)
			if err != nil {
				return stmt{}, err
			}
			return stmt{kind: sVerdict, verdict: vd}, nil
		case "vmap":
			return p.vmap(v, t)
		case "reject":
			return readReject(v)
		case "dnat", "snat", "masquerade", "redirect":
			return readNAT(k, v)
		case "mangle":
			return readMangle(v)
		}
		if nop, ok := nopStmts[k]; ok && nop {
			return stmt{kind: sNop}, nil
		}
		return stmt{kind: sUnknown, why: "statement " + k}, nil
	}
	return stmt{}, errors.New("empty statement")
}

func (p *parser) match(raw json.RawMessage, t *Table) (stmt, error) {
	var m struct {
		Op    string          `json:"op"`
		Left  json.RawMessage `json:"left"`
		Right json.RawMessage `json:"right"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return stmt{}, fmt.Errorf("read match: %w", err)
	}
	left, err := readExpr(m.Left)
	if err != nil {
		return stmt{kind: sUnknown, why: err.Error()}, nil
	}
	s := stmt{kind: sMatch, op: m.Op, left: left}
	types := left.types()
	set, isSet, err := p.setRef(m.Right, t, types)
	if err != nil {
		return stmt{}, err
	}
	if isSet {
		s.set = set
		return s, nil
	}
	if s.right, err = concatConst(m.Right, types); err != nil {
		return stmt{}, err
	}
	return s, nil
}

// setRef reads the right side of a match or a vmap's data when it is a
// set: "@name" or an anonymous {"set": [...]}.
func (p *parser) setRef(raw json.RawMessage, t *Table, types []vtype) (*Set, bool, error) {
	raw = trimSpace(raw)
	var name string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &name) == nil && strings.HasPrefix(name, "@") {
		s := t.Sets[name[1:]]
		if s == nil {
			return nil, true, fmt.Errorf("set %s not in table %s", name, t.ID())
		}
		return s, true, nil
	}
	var anon struct {
		Set json.RawMessage `json:"set"`
	}
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &anon) != nil || anon.Set == nil {
		return nil, false, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(anon.Set, &elems); err != nil {
		// A one-element anonymous set may be printed as the element.
		elems = []json.RawMessage{anon.Set}
	}
	return p.anonSet(elems, types)
}

// anonSet builds an inline set; elements that are [key, verdict] pairs
// make it a verdict map.
func (p *parser) anonSet(elems []json.RawMessage, types []vtype) (*Set, bool, error) {
	s := &Set{Name: "(anonymous)"}
	for _, raw := range elems {
		dt := ""
		var pair []json.RawMessage
		if k := trimSpace(raw); len(k) > 0 && k[0] == '[' && json.Unmarshal(raw, &pair) == nil && len(pair) == 2 {
			if _, err := readVerdict(pair[1]); err == nil {
				dt = "verdict"
			}
		}
		if dt != "" {
			s.DataType = dt
		}
		e, err := p.elem(raw, types, dt)
		if err != nil {
			return nil, true, fmt.Errorf("anonymous set element %s: %w", clip(raw), err)
		}
		s.Elems = append(s.Elems, e)
	}
	return s, true, nil
}

func (p *parser) vmap(raw json.RawMessage, t *Table) (stmt, error) {
	var m struct {
		Key  json.RawMessage `json:"key"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return stmt{}, fmt.Errorf("read vmap: %w", err)
	}
	key, err := readExpr(m.Key)
	if err != nil {
		return stmt{kind: sUnknown, why: err.Error()}, nil
	}
	set, isSet, err := p.setRef(m.Data, t, key.types())
	if err != nil {
		return stmt{}, err
	}
	if !isSet {
		return stmt{}, fmt.Errorf("vmap data %s is not a map", clip(m.Data))
	}
	return stmt{kind: sVmap, left: key, set: set}, nil
}

func readReject(raw json.RawMessage) (stmt, error) {
	var r struct {
		Type string          `json:"type"`
		Expr json.RawMessage `json:"expr"`
	}
	if string(trimSpace(raw)) != "null" {
		if err := json.Unmarshal(raw, &r); err != nil {
			return stmt{}, fmt.Errorf("read reject: %w", err)
		}
	}
	var code string
	if len(r.Expr) > 0 {
		if err := json.Unmarshal(r.Expr, &code); err != nil {
			return stmt{}, fmt.Errorf("read reject code %s: %w", clip(r.Expr), err)
		}
	}
	rs := rejectSpec{text: strings.TrimSpace(r.Type + " " + code)}
	switch r.Type {
	case "tcp reset":
		rs.reset = true
	case "", "icmpx":
		if code == "" {
			code = "port-unreachable"
		}
		rs.icmpx = code
	case "icmp", "icmpv6":
		tc, ok := rejectCodes[r.Type][code]
		if !ok {
			return stmt{kind: sUnknown, why: "reject with " + rs.text}, nil
		}
		rs.typ, rs.code = tc[0], tc[1]
	default:
		return stmt{kind: sUnknown, why: "reject with " + rs.text}, nil
	}
	return stmt{kind: sReject, reject: rs}, nil
}

var rejectCodes = map[string]map[string][2]uint8{
	"icmp": {"net-unreachable": {3, 0}, "host-unreachable": {3, 1}, "prot-unreachable": {3, 2},
		"port-unreachable": {3, 3}, "net-prohibited": {3, 9}, "host-prohibited": {3, 10}, "admin-prohibited": {3, 13}},
	"icmpv6": {"no-route": {1, 0}, "admin-prohibited": {1, 1}, "addr-unreachable": {1, 3},
		"port-unreachable": {1, 4}, "policy-fail": {1, 5}, "reject-route": {1, 6}},
}

// icmpxCodes are the family-independent reject codes of inet tables.
var icmpxCodes = map[string][2][2]uint8{
	"port-unreachable": {{3, 3}, {1, 4}}, "admin-prohibited": {{3, 13}, {1, 1}},
	"no-route": {{3, 0}, {1, 0}}, "host-unreachable": {{3, 1}, {1, 3}},
}

func readNAT(kind string, raw json.RawMessage) (stmt, error) {
	n := natSpec{kind: kind}
	if string(trimSpace(raw)) == "null" {
		return stmt{kind: sNAT, nat: n}, nil
	}
	var j struct {
		Addr   json.RawMessage `json:"addr"`
		Port   json.RawMessage `json:"port"`
		Family string          `json:"family"`
		Flags  json.RawMessage `json:"flags"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return stmt{}, fmt.Errorf("read %s: %w", kind, err)
	}
	n.familyHint = j.Family
	if len(j.Flags) > 0 {
		var one string
		if json.Unmarshal(j.Flags, &one) == nil {
			n.flags = []string{one}
		} else {
			_ = json.Unmarshal(j.Flags, &n.flags)
		}
	}
	if len(j.Addr) > 0 {
		kp, err := constPart(j.Addr, tAddr)
		if err != nil {
			n.undecided = fmt.Sprintf("%s address %s", kind, clip(j.Addr))
		} else {
			n.addr = &kp
		}
	}
	if len(j.Port) > 0 {
		kp, err := constPart(j.Port, tPort)
		if err != nil {
			n.undecided = fmt.Sprintf("%s port %s", kind, clip(j.Port))
		} else {
			n.port = &kp
		}
	}
	return stmt{kind: sNAT, nat: n}, nil
}

// readMangle keeps `meta mark set ...`, which later rules match on; any
// other field it sets does not steer the walk.
func readMangle(raw json.RawMessage) (stmt, error) {
	var m struct {
		Key   json.RawMessage `json:"key"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return stmt{}, fmt.Errorf("read mangle: %w", err)
	}
	key, err := readExpr(m.Key)
	if err != nil || key.kind != eMeta || key.field != "mark" {
		return stmt{kind: sNop}, nil
	}
	v, err := readExpr(m.Value)
	if err != nil {
		return stmt{kind: sUnknown, why: "meta mark set " + err.Error()}, nil
	}
	return stmt{kind: sMark, left: v}, nil
}

// readExpr reads a value expression.
func readExpr(raw json.RawMessage) (*expr, error) {
	raw = trimSpace(raw)
	if len(raw) > 0 && raw[0] != '{' {
		kp, err := constPart(raw, tInt)
		if err != nil {
			return nil, err
		}
		return &expr{kind: eConst, y: kp.lo, text: kp.text}, nil
	}
	var o map[string]json.RawMessage
	if err := json.Unmarshal(raw, &o); err != nil || len(o) != 1 {
		return nil, fmt.Errorf("expression %s not read", clip(raw))
	}
	for k, v := range o {
		switch k {
		case "payload":
			var p struct{ Protocol, Field string }
			if err := json.Unmarshal(v, &p); err != nil || p.Protocol == "" {
				return nil, fmt.Errorf("raw payload expression %s", clip(v))
			}
			return &expr{kind: ePayload, proto: p.Protocol, field: p.Field, typ: payloadType(p.Protocol, p.Field), text: p.Protocol + " " + p.Field}, nil
		case "meta":
			var m struct{ Key string }
			if err := json.Unmarshal(v, &m); err != nil {
				return nil, fmt.Errorf("read meta: %w", err)
			}
			return &expr{kind: eMeta, field: m.Key, typ: metaType(m.Key), text: "meta " + m.Key}, nil
		case "ct":
			var c struct {
				Key string
				Dir string
			}
			if err := json.Unmarshal(v, &c); err != nil {
				return nil, fmt.Errorf("read ct: %w", err)
			}
			e := &expr{kind: eCT, field: c.Key, typ: ctType(c.Key), text: "ct " + c.Key}
			if c.Dir != "" {
				e.kind, e.text = eUnknown, "ct "+c.Dir+" "+c.Key
			}
			return e, nil
		case "fib":
			var f struct {
				Result string
				Flags  json.RawMessage
			}
			if err := json.Unmarshal(v, &f); err != nil {
				return nil, fmt.Errorf("read fib: %w", err)
			}
			e := &expr{kind: eFib, field: f.Result, typ: tFibType}
			var one string
			if json.Unmarshal(f.Flags, &one) == nil {
				e.flags = []string{one}
			} else {
				_ = json.Unmarshal(f.Flags, &e.flags)
			}
			e.text = "fib " + strings.Join(e.flags, " . ") + " " + f.Result
			if f.Result != "type" {
				e.typ = tInt
			}
			return e, nil
		case "numgen":
			var n struct {
				Mode string
				Mod  uint64
			}
			_ = json.Unmarshal(v, &n)
			return &expr{kind: eNumgen, typ: tInt, y: val{n: n.Mod}, text: fmt.Sprintf("numgen %s mod %d", n.Mode, n.Mod)}, nil
		case "concat":
			var parts []json.RawMessage
			if err := json.Unmarshal(v, &parts); err != nil {
				return nil, fmt.Errorf("read concat: %w", err)
			}
			e := &expr{kind: eConcat}
			for _, pr := range parts {
				x, err := readExpr(pr)
				if err != nil {
					return nil, err
				}
				e.parts = append(e.parts, x)
			}
			return e, nil
		case "&", "|", "^", "<<", ">>":
			var ops []json.RawMessage
			if err := json.Unmarshal(v, &ops); err != nil || len(ops) != 2 {
				return nil, fmt.Errorf("read %s: two operands expected", k)
			}
			x, err := readExpr(ops[0])
			if err != nil {
				return nil, err
			}
			y, err := constPart(ops[1], x.typ)
			if err != nil {
				return &expr{kind: eUnknown, typ: x.typ, text: x.text + " " + k + " " + clip(ops[1])}, nil
			}
			return &expr{kind: eBinop, op: k, x: x, y: y.lo, typ: x.typ, text: x.text + " " + k + " " + y.text}, nil
		}
		return &expr{kind: eUnknown, typ: tInt, text: k}, nil
	}
	return nil, errors.New("empty expression")
}

// types are the field types of the expression's value: one, or one per
// field of a concatenation.
func (e *expr) types() []vtype {
	if e.kind != eConcat {
		return []vtype{e.typ}
	}
	out := make([]vtype, len(e.parts))
	for i, p := range e.parts {
		out[i] = p.typ
	}
	return out
}

func payloadType(proto, field string) vtype {
	switch field {
	case "saddr", "daddr":
		return tAddr
	case "sport", "dport":
		return tPort
	case "protocol", "nexthdr":
		return tProto
	case "flags":
		if proto == "tcp" {
			return tTCPFlags
		}
	case "type":
		if proto == "icmp" {
			return tICMPType
		}
		if proto == "icmpv6" {
			return tICMP6Type
		}
	}
	return tInt
}

func metaType(key string) vtype {
	switch key {
	case "l4proto":
		return tProto
	case "mark":
		return tMark
	case "iifname", "oifname":
		return tIfname
	case "nfproto":
		return tNFProto
	}
	return tInt
}

func ctType(key string) vtype {
	switch key {
	case "state":
		return tCTState
	case "status":
		return tCTStatus
	case "mark":
		return tMark
	}
	return tInt
}
