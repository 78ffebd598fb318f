package nft

import (
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
	kind      string // dnat, snat, masquerade, redirect
	addr      *keyPart
	port      *keyPart
	undecided string // an address or port from a map or expression this package does not compute
	// choices are the targets of an address taken from a numgen map that
	// covers every number (kube-proxy's multi-endpoint DNAT): the kernel
	// picked one of them.
	choices []natChoice
	flags   []string
	// family is the one the statement names (`dnat ip to`, which inet
	// tables require); the kernel skips it for a packet of the other one.
	family string
}

var nopStmts = map[string]bool{"counter": true, "log": true, "notrack": true, "quota": false, "limit": false,
	"flow": true, "ct count": false, "set": true, "synproxy": false, "tproxy": false, "dup": true, "fwd": false,
	"secmark": true, "xt": false}

// stmt reads one rule statement.
func (p *parser) stmt(raw any, t *Table) (stmt, error) {
	o, ok := raw.(map[string]any)
	if !ok || len(o) != 1 {
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

func (p *parser) match(raw any, t *Table) (stmt, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return stmt{}, fmt.Errorf("match %s not read", clip(raw))
	}
	left, err := readExpr(m["left"])
	if err != nil {
		return stmt{kind: sUnknown, why: err.Error()}, nil
	}
	op, _ := m["op"].(string)
	s := stmt{kind: sMatch, op: op, left: left}
	types := left.types()
	set, isSet, err := p.setRef(m["right"], t, types)
	if err != nil {
		return stmt{}, err
	}
	if isSet {
		s.set = set
		return s, nil
	}
	if s.right, err = concatConst(m["right"], types); err != nil {
		return stmt{}, err
	}
	return s, nil
}

// setRef reads the right side of a match or a vmap's data when it is a
// set: "@name" or an anonymous {"set": [...]}.
func (p *parser) setRef(raw any, t *Table, types []vtype) (*Set, bool, error) {
	if name, ok := raw.(string); ok && strings.HasPrefix(name, "@") {
		s := t.Sets[name[1:]]
		if s == nil {
			return nil, true, fmt.Errorf("set %s not in table %s", name, t.ID())
		}
		return s, true, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, false, nil
	}
	anon, ok := m["set"]
	if !ok {
		return nil, false, nil
	}
	elems, ok := anon.([]any)
	if !ok {
		// A one-element anonymous set may be printed as the element.
		elems = []any{anon}
	}
	return p.anonSet(elems, types)
}

// anonSet builds an inline set; elements that are [key, verdict] pairs
// make it a verdict map.
func (p *parser) anonSet(elems []any, types []vtype) (*Set, bool, error) {
	s := &Set{Name: "(anonymous)"}
	for _, raw := range elems {
		dt := ""
		if pair, ok := raw.([]any); ok && len(pair) == 2 {
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

func (p *parser) vmap(raw any, t *Table) (stmt, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return stmt{}, fmt.Errorf("vmap %s not read", clip(raw))
	}
	key, err := readExpr(m["key"])
	if err != nil {
		return stmt{kind: sUnknown, why: err.Error()}, nil
	}
	set, isSet, err := p.setRef(m["data"], t, key.types())
	if err != nil {
		return stmt{}, err
	}
	if !isSet {
		return stmt{}, fmt.Errorf("vmap data %s is not a map", clip(m["data"]))
	}
	return stmt{kind: sVmap, left: key, set: set}, nil
}

func readReject(raw any) (stmt, error) {
	var typ, code string
	if raw != nil {
		m, ok := raw.(map[string]any)
		if !ok {
			return stmt{}, fmt.Errorf("reject %s not read", clip(raw))
		}
		typ, _ = m["type"].(string)
		if e, ok := m["expr"]; ok {
			if code, ok = e.(string); !ok {
				return stmt{}, fmt.Errorf("reject code %s not read", clip(e))
			}
		}
	}
	rs := rejectSpec{text: strings.TrimSpace(typ + " " + code)}
	switch typ {
	case "tcp reset":
		rs.reset = true
	case "", "icmpx":
		if code == "" {
			code = "port-unreachable"
		}
		rs.icmpx = code
	case "icmp", "icmpv6":
		tc, ok := rejectCodes[typ][code]
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

func readNAT(kind string, raw any) (stmt, error) {
	n := natSpec{kind: kind}
	if raw == nil {
		return stmt{kind: sNAT, nat: n}, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return stmt{}, fmt.Errorf("%s %s not read", kind, clip(raw))
	}
	n.family, _ = m["family"].(string)
	switch f := m["flags"].(type) {
	case string:
		n.flags = []string{f}
	case []any:
		for _, x := range f {
			if s, ok := x.(string); ok {
				n.flags = append(n.flags, s)
			}
		}
	}
	if a, ok := m["addr"]; ok {
		if ch, ok := numgenChoices(a); ok {
			n.choices = ch
		} else if kp, err := constPart(a, tAddr); err != nil {
			n.undecided = fmt.Sprintf("%s address %s", kind, clip(a))
		} else {
			n.addr = &kp
		}
	}
	if pt, ok := m["port"]; ok {
		kp, err := constPart(pt, tPort)
		if err != nil {
			n.undecided = fmt.Sprintf("%s port %s", kind, clip(pt))
		} else {
			n.port = &kp
		}
	}
	return stmt{kind: sNAT, nat: n}, nil
}

// natChoice is one address (and port) a numgen map can give a NAT.
type natChoice struct {
	addr keyPart
	port *keyPart
}

// numgenChoices reads kube-proxy v1.37's multi-endpoint DNAT address,
// `dnat ip addr . port to numgen random mod N map { 0 : A . P, ... }`
// (proxier.go writeServiceToEndpointDNATs): a map keyed by numgen whose
// values are addresses or address . port pairs. It is only read when the
// map has a value for every number numgen can draw; otherwise the lookup
// can miss and the rule not translate at all.
func numgenChoices(raw any) ([]natChoice, bool) {
	m, _ := raw.(map[string]any)
	mp, _ := m["map"].(map[string]any)
	key, err := readExpr(mp["key"])
	if err != nil || key.kind != eNumgen {
		return nil, false
	}
	data, _ := mp["data"].(map[string]any)
	elems, ok := data["set"].([]any)
	if !ok {
		return nil, false
	}
	seen := map[uint64]bool{}
	var out []natChoice
	for _, raw := range elems {
		pair, ok := raw.([]any)
		if !ok || len(pair) != 2 {
			return nil, false
		}
		n, err := constPart(pair[0], tInt)
		if err != nil || n.lo != n.hi {
			return nil, false
		}
		c, err := readChoice(pair[1])
		if err != nil {
			return nil, false
		}
		seen[n.lo.n] = true
		out = append(out, c)
	}
	for i := uint64(0); i < key.y.n; i++ {
		if !seen[i] {
			return nil, false
		}
	}
	return out, len(out) > 0
}

func readChoice(raw any) (natChoice, error) {
	if parts, err := concatConst(raw, []vtype{tAddr, tPort}); err == nil {
		return natChoice{addr: parts[0], port: &parts[1]}, nil
	}
	a, err := constPart(raw, tAddr)
	return natChoice{addr: a}, err
}

// readMangle keeps `meta mark set ...`, which later rules match on; any
// other field it sets does not steer the walk.
func readMangle(raw any) (stmt, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return stmt{}, fmt.Errorf("mangle %s not read", clip(raw))
	}
	key, err := readExpr(m["key"])
	if err != nil || key.kind != eMeta || key.field != "mark" {
		return stmt{kind: sNop}, nil
	}
	v, err := readExpr(m["value"])
	if err != nil {
		return stmt{kind: sUnknown, why: "meta mark set " + err.Error()}, nil
	}
	return stmt{kind: sMark, left: v}, nil
}

// readExpr reads a value expression.
func readExpr(raw any) (*expr, error) {
	o, ok := raw.(map[string]any)
	if !ok {
		kp, err := constPart(raw, tInt)
		if err != nil {
			return nil, err
		}
		return &expr{kind: eConst, y: kp.lo, text: kp.text}, nil
	}
	if len(o) != 1 {
		return nil, fmt.Errorf("expression %s not read", clip(raw))
	}
	for k, v := range o {
		f, _ := v.(map[string]any)
		str := func(name string) string { s, _ := f[name].(string); return s }
		switch k {
		case "payload":
			proto, field := str("protocol"), str("field")
			if proto == "" {
				return nil, fmt.Errorf("raw payload expression %s", clip(v))
			}
			return &expr{kind: ePayload, proto: proto, field: field, typ: payloadType(proto, field), text: proto + " " + field}, nil
		case "meta":
			key := str("key")
			return &expr{kind: eMeta, field: key, typ: metaType(key), text: "meta " + key}, nil
		case "ct":
			key, dir := str("key"), str("dir")
			e := &expr{kind: eCT, field: key, typ: ctType(key), text: "ct " + key}
			if dir != "" {
				e.kind, e.text = eUnknown, "ct "+dir+" "+key
			}
			return e, nil
		case "fib":
			e := &expr{kind: eFib, field: str("result"), typ: tFibType}
			switch fl := f["flags"].(type) {
			case string:
				e.flags = []string{fl}
			case []any:
				for _, x := range fl {
					if s, ok := x.(string); ok {
						e.flags = append(e.flags, s)
					}
				}
			}
			e.text = "fib " + strings.Join(e.flags, " . ") + " " + e.field
			if e.field != "type" {
				e.typ = tInt
			}
			return e, nil
		case "numgen":
			mod, _ := f["mod"].(float64)
			return &expr{kind: eNumgen, typ: tInt, y: val{n: uint64(mod)}, text: fmt.Sprintf("numgen %s mod %d", str("mode"), uint64(mod))}, nil
		case "concat":
			parts, ok := v.([]any)
			if !ok {
				return nil, fmt.Errorf("concat %s not read", clip(v))
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
			ops, ok := v.([]any)
			if !ok || len(ops) != 2 {
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
