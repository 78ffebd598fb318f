package rules

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ParseSave parses the output of iptables-save (or ip6tables-save, with
// family IPv6). Tables other than raw, mangle, nat, filter and security are
// kept too. Lines it cannot parse are errors naming the line; a rule whose
// matches it does not understand is not an error, its matches are
// MatchUnknown and the evaluator treats them as uncertain.
func ParseSave(r io.Reader, family Family) (*Ruleset, error) {
	return parseSave(r, family, nil)
}

// ParseSaveReusing is ParseSaveString sharing prev's rules (a parse of the
// same family, nil for none): a rule line prev has in the same table and
// chain is prev's rule, copied only where its position or its jump's
// target chain differ. A node whose rules change a few at a time, as
// kube-proxy's do, costs a parse and the memory of what changed.
func ParseSaveReusing(s string, family Family, prev *Ruleset) (*Ruleset, error) {
	return parseSave(strings.NewReader(s), family, rulesOf(prev))
}

// ruleLine is a rule as a line of its chain: what ParseSaveReusing finds
// a prev rule by.
type ruleLine struct{ table, chain, text string }

// rulesOf indexes rs's rules that stand on their line alone. A jump that
// finish made unknown (its chain was missing) depends on the rest of the
// table, and is parsed again.
func rulesOf(rs *Ruleset) map[ruleLine]*Rule {
	if rs == nil {
		return nil
	}
	out := map[ruleLine]*Rule{}
	for _, t := range rs.Tables {
		for _, c := range t.Chains {
			for _, r := range c.Rules {
				if r.Target.Kind == TargetUnknown {
					continue
				}
				k := ruleLine{t.Name, c.Name, r.Text}
				if _, ok := out[k]; !ok {
					out[k] = r
				}
			}
		}
	}
	return out
}

func parseSave(r io.Reader, family Family, prev map[ruleLine]*Rule) (*Ruleset, error) {
	rs := &Ruleset{Family: family, Tables: map[string]*Table{}}
	sc := bufio.NewScanner(r)
	// kube-proxy comments and ipset names keep lines short, but bpf
	// bytecode and long comment chains can exceed the default 64 KiB.
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	var cur *Table
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		var err error
		switch {
		case line[0] == '*':
			if cur != nil {
				err = fmt.Errorf("table %q starts before table %q is committed", line[1:], cur.Name)
				break
			}
			name := line[1:]
			if name == "" {
				err = errors.New("empty table name")
				break
			}
			cur = rs.Tables[name]
			if cur == nil {
				cur = &Table{Name: name, Chains: map[string]*Chain{}}
				rs.Tables[name] = cur
			}
		case line == "COMMIT":
			if cur == nil {
				err = errors.New("COMMIT outside a table")
				break
			}
			cur.finish()
			cur = nil
		case line[0] == ':':
			if cur == nil {
				err = errors.New("chain declared outside a table")
				break
			}
			err = cur.declare(line)
		case line[0] == '[' || strings.HasPrefix(line, "-A ") || strings.HasPrefix(line, "-I "):
			if cur == nil {
				err = errors.New("rule outside a table")
				break
			}
			err = cur.addRule(line, family, prev)
		default:
			err = errors.New("unrecognised line")
		}
		if err != nil {
			return nil, fmt.Errorf("parse iptables-save line %d %q: %w", lineNo, clip(line), err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse iptables-save: read: %w", err)
	}
	if cur != nil {
		return nil, fmt.Errorf("parse iptables-save: table %q has no COMMIT", cur.Name)
	}
	return rs, nil
}

// ParseSaveString is ParseSave on a string.
func ParseSaveString(s string, family Family) (*Ruleset, error) {
	return ParseSave(strings.NewReader(s), family)
}

func clip(s string) string {
	if len(s) > 120 {
		return s[:117] + "..."
	}
	return s
}

// declare handles ":NAME POLICY [pkts:bytes]".
func (t *Table) declare(line string) error {
	f := strings.Fields(line[1:])
	if len(f) < 2 || f[0] == "" {
		return errors.New("chain declaration needs a name and a policy")
	}
	c := t.chain(f[0])
	if f[1] != "-" {
		c.Policy = f[1]
	}
	return nil
}

func (t *Table) chain(name string) *Chain {
	c := t.Chains[name]
	if c == nil {
		c = &Chain{Table: t.Name, Name: name}
		t.Chains[name] = c
		t.Order = append(t.Order, name)
	}
	return c
}

// Chain returns the named chain, or nil.
func (rs *Ruleset) Chain(table, chain string) *Chain {
	t := rs.Tables[table]
	if t == nil {
		return nil
	}
	return t.Chains[chain]
}

// Rules returns every rule of every table, in dump order.
func (rs *Ruleset) Rules() []*Rule {
	var out []*Rule
	for _, tn := range []string{"raw", "mangle", "nat", "filter", "security"} {
		if t := rs.Tables[tn]; t != nil {
			for _, cn := range t.Order {
				out = append(out, t.Chains[cn].Rules...)
			}
		}
	}
	return out
}

func (t *Table) addRule(line string, family Family, prev map[ruleLine]*Rule) error {
	// iptables-save -c prefixes the counters: "[12:3456] -A ...".
	if line[0] == '[' {
		end := strings.IndexByte(line, ']')
		if end < 0 {
			return errors.New("unterminated counter")
		}
		line = strings.TrimSpace(line[end+1:])
	}
	if chain, ok := appendedChain(line); ok && prev != nil {
		if r := prev[ruleLine{t.Name, chain, line}]; r != nil {
			c := t.chain(chain)
			c.Rules = append(c.Rules, r)
			return nil
		}
	}
	toks, err := tokenize(line)
	if err != nil {
		return err
	}
	if len(toks) < 2 || (toks[0] != "-A" && toks[0] != "-I") {
		return errors.New("rule must start with -A CHAIN")
	}
	c := t.chain(toks[1])
	r := &Rule{Table: t.Name, Chain: c.Name, Text: line}
	if err := parseRule(r, toks[2:], family); err != nil {
		return err
	}
	// Kept for as long as the rules are: without the room append left.
	r.Matches = slices.Clone(r.Matches)
	if toks[0] == "-I" {
		c.Rules = append([]*Rule{r}, c.Rules...)
	} else {
		c.Rules = append(c.Rules, r)
	}
	return nil
}

// appendedChain is the chain of an "-A CHAIN ..." line whose chain name
// needs no unquoting, as iptables-save prints them.
func appendedChain(line string) (string, bool) {
	rest, ok := strings.CutPrefix(line, "-A ")
	if !ok {
		return "", false
	}
	chain, _, ok := strings.Cut(rest, " ")
	if !ok || chain == "" || strings.ContainsAny(chain, "\"\\\t") {
		return "", false
	}
	return chain, true
}

// tokenize splits a rule line the way iptables-restore does: on blanks,
// with double-quoted words in which a backslash escapes the next byte.
// iptables-save prints comments as "dnat name: \"cbr0\" id: \"...\"".
// A word without quotes is a slice of line, which the rule keeps as its
// text anyway: the matches' strings cost no memory of their own.
func tokenize(line string) ([]string, error) {
	var toks []string
	for i := 0; i < len(line); {
		if line[i] == ' ' || line[i] == '\t' {
			i++
			continue
		}
		start, quoted, inQuote := i, false, false
		for ; i < len(line); i++ {
			ch := line[i]
			if inQuote && ch == '\\' && i+1 < len(line) {
				i++
				continue
			}
			if ch == '"' {
				inQuote, quoted = !inQuote, true
				continue
			}
			if !inQuote && (ch == ' ' || ch == '\t') {
				break
			}
		}
		if inQuote {
			return nil, errors.New("unterminated quote")
		}
		if quoted {
			toks = append(toks, unquote(line[start:i]))
		} else {
			toks = append(toks, line[start:i])
		}
	}
	return toks, nil
}

// unquote is a word with its double quotes taken out and, inside them, a
// backslash's escape.
func unquote(word string) string {
	var b strings.Builder
	inQuote := false
	for i := 0; i < len(word); i++ {
		switch ch := word[i]; {
		case inQuote && ch == '\\' && i+1 < len(word):
			i++
			b.WriteByte(word[i])
		case ch == '"':
			inQuote = !inQuote
		default:
			b.WriteByte(ch)
		}
	}
	return b.String()
}

// isShortOpt reports whether tok is a built-in option such as -s or -p,
// which ends the option list of a preceding -m module.
func isShortOpt(tok string) bool {
	return len(tok) == 2 && tok[0] == '-' && tok[1] != '-'
}

// parseRule fills r from the tokens after "-A CHAIN".
func parseRule(r *Rule, toks []string, family Family) error {
	module := ""
	for i := 0; i < len(toks); {
		neg := false
		if toks[i] == "!" {
			neg = true
			i++
			if i >= len(toks) {
				return errors.New(`"!" negates nothing`)
			}
		}
		tok := toks[i]
		switch {
		case tok == "-m" || tok == "--match":
			if neg {
				return errors.New("! before -m")
			}
			if i+1 >= len(toks) {
				return errors.New("-m needs a module")
			}
			module = toks[i+1]
			i += 2
			// A module we do not know that is printed without options
			// still has to make the rule uncertain.
			if !knownModules[module] && !startsModuleOption(toks[i:]) {
				r.Matches = append(r.Matches, Match{Kind: MatchUnknown, Module: module,
					Reason: fmt.Sprintf("match module %q is not modelled", module)})
			}
		case tok == "-j" || tok == "-g" || tok == "--jump" || tok == "--goto":
			if neg {
				return errors.New("! before a target")
			}
			if i+1 >= len(toks) {
				// "-A CHAIN -j" with nothing after it: iptables does not
				// print this, but a counter-only rule is the only reading.
				i++
				continue
			}
			if err := parseTarget(&r.Target, tok == "-g" || tok == "--goto", toks[i+1], toks[i+2:], family); err != nil {
				return fmt.Errorf("target %s: %w", toks[i+1], err)
			}
			return nil
		case isShortOpt(tok) || longBuiltins[tok]:
			module = ""
			n, err := parseBuiltin(r, neg, toks[i:])
			if err != nil {
				return err
			}
			i += n
		case strings.HasPrefix(tok, "--"):
			// Options of the current module run until the next -m, -j/-g
			// or built-in option; collect this option's arguments.
			j := i + 1
			if tok == "--comment" {
				// One (quoted) word, which may itself start with "-".
				j = min(i+2, len(toks))
			} else {
				for j < len(toks) && !strings.HasPrefix(toks[j], "-") && toks[j] != "!" {
					j++
				}
			}
			mod := module
			if mod == "" {
				// "-p tcp --dport 80" loads the protocol's module
				// implicitly; iptables-save prints "-m tcp" but
				// hand-written dumps may not.
				mod = implicitModule(r)
			}
			m := parseModuleOption(mod, tok, toks[i+1:j], neg)
			if m.Kind == MatchComment && r.Comment == "" {
				r.Comment = m.Value
			}
			r.Matches = append(r.Matches, m)
			i = j
		default:
			return fmt.Errorf("unexpected %q", tok)
		}
	}
	return nil
}

var longBuiltins = map[string]bool{
	"--source": true, "--destination": true, "--protocol": true, "--in-interface": true,
	"--out-interface": true, "--fragment": true,
}

func startsModuleOption(toks []string) bool {
	if len(toks) > 1 && toks[0] == "!" {
		toks = toks[1:]
	}
	return len(toks) > 0 && strings.HasPrefix(toks[0], "--") && !longBuiltins[toks[0]]
}

func implicitModule(r *Rule) string {
	for _, m := range r.Matches {
		if m.Kind == MatchProto && !m.Negate {
			return ProtoName(m.Proto)
		}
	}
	return ""
}

// parseBuiltin parses one built-in option (-s, -d, -p, -i, -o, -f) and
// returns how many tokens it used.
func parseBuiltin(r *Rule, neg bool, toks []string) (int, error) {
	opt := toks[0]
	if opt == "-f" || opt == "--fragment" {
		r.Matches = append(r.Matches, Match{Kind: MatchFragment, Option: "-f", Negate: neg})
		return 1, nil
	}
	if len(toks) < 2 {
		return 0, fmt.Errorf("%s needs an argument", opt)
	}
	val := toks[1]
	m := Match{Option: opt, Negate: neg, Value: val}
	switch opt {
	case "-s", "--source", "-d", "--destination":
		m.Kind = MatchSource
		if opt == "-d" || opt == "--destination" {
			m.Kind = MatchDest
		}
		p, err := parsePrefix(val)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", opt, err)
		}
		m.Prefix = p
	case "-p", "--protocol":
		m.Kind = MatchProto
		p, ok := parseProto(val)
		if !ok {
			m.Kind = MatchUnknown
			m.Reason = fmt.Sprintf("protocol %q is not known", val)
		}
		m.Proto = p
	case "-i", "--in-interface", "-o", "--out-interface":
		m.Kind = MatchInIface
		if opt == "-o" || opt == "--out-interface" {
			m.Kind = MatchOutIface
		}
		m.Iface = val
		if strings.HasSuffix(val, "+") {
			m.IfWild = true
			m.Iface = strings.TrimSuffix(val, "+")
		}
	default:
		// -4/-6 and -c take no part in matching; anything else is a
		// built-in this package does not model.
		m.Kind = MatchUnknown
		m.Reason = fmt.Sprintf("option %s is not modelled", opt)
	}
	r.Matches = append(r.Matches, m)
	return 2, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		addr, bits, _ := strings.Cut(s, "/")
		a, err := netip.ParseAddr(addr)
		if err != nil {
			return netip.Prefix{}, err
		}
		n, err := strconv.Atoi(bits)
		if err != nil {
			// A dotted netmask, as old iptables versions printed.
			m, err2 := netip.ParseAddr(bits)
			if err2 != nil || !m.Is4() {
				return netip.Prefix{}, fmt.Errorf("bad mask %q", bits)
			}
			n = maskBits(m.As4())
			if n < 0 {
				return netip.Prefix{}, fmt.Errorf("non-contiguous mask %q", bits)
			}
		}
		p, err := a.Unmap().Prefix(n)
		if err != nil {
			return netip.Prefix{}, err
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func maskBits(m [4]byte) int {
	v := uint32(m[0])<<24 | uint32(m[1])<<16 | uint32(m[2])<<8 | uint32(m[3])
	n := 0
	for v&0x80000000 != 0 {
		n++
		v <<= 1
	}
	if v != 0 {
		return -1
	}
	return n
}

func parseProto(s string) (uint8, bool) {
	if p, ok := protoNames[strings.ToLower(s)]; ok {
		return p, true
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, false
	}
	return uint8(n), true
}

// knownModules are the -m modules whose options are parsed; an option of
// one of them that is not modelled is still uncertain on its own.
var knownModules = map[string]bool{
	"tcp": true, "udp": true, "sctp": true, "udplite": true, "multiport": true,
	"addrtype": true, "set": true, "mark": true, "conntrack": true, "state": true,
	"comment": true, "icmp": true, "icmp6": true,
}

// parseModuleOption parses one "--option args..." of module.
func parseModuleOption(module, opt string, args []string, neg bool) Match {
	m := Match{Module: module, Option: opt, Negate: neg, Value: strings.Join(args, " ")}
	unknown := func(format string, a ...any) Match {
		m.Kind = MatchUnknown
		m.Reason = fmt.Sprintf(format, a...)
		return m
	}
	arg := ""
	if len(args) > 0 {
		arg = args[0]
	}
	switch module {
	case "tcp", "udp", "sctp", "udplite":
		switch opt {
		case "--sport", "--source-port", "--dport", "--destination-port":
			m.Kind = MatchDstPort
			if opt == "--sport" || opt == "--source-port" {
				m.Kind = MatchSrcPort
			}
			pr, err := parsePortRange(arg, ":")
			if err != nil {
				return unknown("-m %s %s %q: %v", module, opt, arg, err)
			}
			m.Ports = []PortRange{pr}
			return m
		}
	case "multiport":
		switch opt {
		case "--sports", "--source-ports", "--dports", "--destination-ports", "--ports":
			m.Kind = MatchAnyPort
			switch opt {
			case "--sports", "--source-ports":
				m.Kind = MatchSrcPort
			case "--dports", "--destination-ports":
				m.Kind = MatchDstPort
			}
			for _, part := range strings.Split(arg, ",") {
				pr, err := parsePortRange(part, ":")
				if err != nil {
					return unknown("-m multiport %s %q: %v", opt, arg, err)
				}
				m.Ports = append(m.Ports, pr)
			}
			return m
		}
	case "addrtype":
		switch opt {
		case "--src-type", "--dst-type":
			m.Kind = MatchDstType
			if opt == "--src-type" {
				m.Kind = MatchSrcType
			}
			m.Types = strings.Split(arg, ",")
			return m
		}
	case "set":
		if opt == "--match-set" || opt == "--set" {
			if len(args) < 2 {
				return unknown("-m set %s needs a name and flags", opt)
			}
			m.Kind = MatchSet
			m.SetName = args[0]
			for _, f := range strings.Split(args[1], ",") {
				switch f {
				case "src":
					m.SetDirs = append(m.SetDirs, DirSrc)
				case "dst":
					m.SetDirs = append(m.SetDirs, DirDst)
				default:
					return unknown("-m set flag %q", f)
				}
			}
			if len(args) > 2 {
				return unknown("-m set %s has extra arguments %q", opt, strings.Join(args[2:], " "))
			}
			return m
		}
		// --return-nomatch, --update-counters, counters comparisons, ...
		return unknown("-m set option %s is not modelled", opt)
	case "mark":
		if opt == "--mark" {
			v, mask, err := parseMarkMask(arg)
			if err != nil {
				return unknown("-m mark --mark %q: %v", arg, err)
			}
			m.Kind, m.Mark, m.Mask = MatchMark, v, mask
			return m
		}
	case "conntrack", "state":
		switch opt {
		case "--ctstate", "--state":
			s, ok := parseCTStates(arg)
			if !ok {
				return unknown("-m %s %s %q: unknown state", module, opt, arg)
			}
			m.Kind, m.States = MatchCTState, s
			return m
		case "--ctstatus":
			m.Kind = MatchCTStatus
			m.Reason = "conntrack status " + arg + " is not known for the packet"
			return m
		case "--ctorigdst":
			p, err := parsePrefix(arg)
			if err != nil {
				return unknown("-m conntrack --ctorigdst %q: %v", arg, err)
			}
			m.Kind, m.Prefix = MatchCTOrigDst, p
			return m
		}
	case "comment":
		if opt == "--comment" {
			m.Kind = MatchComment
			return m
		}
	case "icmp", "icmp6":
		if opt == "--icmp-type" || opt == "--icmpv6-type" {
			spec, ok := parseICMPType(arg, module == "icmp6")
			if !ok {
				return unknown("-m %s %s %q: unknown type", module, opt, arg)
			}
			m.Kind, m.ICMP = MatchICMPType, spec
			return m
		}
	}
	if module == "" {
		return unknown("option %s outside a match module", opt)
	}
	if !knownModules[module] {
		return unknown("match module %q is not modelled (%s)", module, strings.TrimSpace(opt+" "+m.Value))
	}
	return unknown("-m %s option %s is not modelled", module, opt)
}

// parsePortRange parses "80", "1000:2000", ":1023", "1024:".
func parsePortRange(s, sep string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, sep)
	if !isRange {
		p, err := parsePort(s)
		return PortRange{p, p}, err
	}
	pr := PortRange{0, 65535}
	var err error
	if lo != "" {
		if pr.Lo, err = parsePort(lo); err != nil {
			return pr, err
		}
	}
	if hi != "" {
		if pr.Hi, err = parsePort(hi); err != nil {
			return pr, err
		}
	}
	if pr.Lo > pr.Hi {
		// iptables swaps an inverted range; do the same.
		pr.Lo, pr.Hi = pr.Hi, pr.Lo
	}
	return pr, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		if p, ok := serviceNames[s]; ok {
			return p, nil
		}
		return 0, fmt.Errorf("bad port %q", s)
	}
	return uint16(n), nil
}

// serviceNames covers the few /etc/services names hand-written rules use;
// iptables-save always prints numbers.
var serviceNames = map[string]uint16{
	"ssh": 22, "domain": 53, "http": 80, "https": 443, "mysql": 3306,
}

// parseMarkMask parses "0x2000/0x2000" or "0x1" (mask all ones).
func parseMarkMask(s string) (v, mask uint32, err error) {
	vs, ms, hasMask := strings.Cut(s, "/")
	v64, err := strconv.ParseUint(vs, 0, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("bad mark %q", vs)
	}
	mask = 0xffffffff
	if hasMask {
		m64, err := strconv.ParseUint(ms, 0, 32)
		if err != nil {
			return 0, 0, fmt.Errorf("bad mask %q", ms)
		}
		mask = uint32(m64)
	}
	return uint32(v64), mask, nil
}

func parseCTStates(s string) (CTState, bool) {
	var out CTState
	for _, part := range strings.Split(s, ",") {
		found := false
		for _, n := range ctStateNames {
			if strings.EqualFold(part, n.name) {
				out |= n.s
				found = true
			}
		}
		if !found {
			return 0, false
		}
	}
	return out, true
}

var icmpNames = map[string][2]int16{
	"echo-reply": {0, -1}, "destination-unreachable": {3, -1}, "network-unreachable": {3, 0},
	"host-unreachable": {3, 1}, "protocol-unreachable": {3, 2}, "port-unreachable": {3, 3},
	"fragmentation-needed": {3, 4}, "source-quench": {4, -1}, "redirect": {5, -1},
	"echo-request": {8, -1}, "router-advertisement": {9, -1}, "router-solicitation": {10, -1},
	"time-exceeded": {11, -1}, "parameter-problem": {12, -1}, "timestamp-request": {13, -1},
	"timestamp-reply": {14, -1},
}

var icmp6Names = map[string][2]int16{
	"destination-unreachable": {1, -1}, "no-route": {1, 0}, "port-unreachable": {1, 4},
	"packet-too-big": {2, -1}, "time-exceeded": {3, -1}, "parameter-problem": {4, -1},
	"echo-request": {128, -1}, "echo-reply": {129, -1}, "neighbour-solicitation": {135, -1},
	"neighbour-advertisement": {136, -1}, "router-solicitation": {133, -1}, "router-advertisement": {134, -1},
}

// parseICMPType parses "8", "3/3", "any" or a name.
func parseICMPType(s string, v6 bool) (ICMPSpec, bool) {
	if s == "any" {
		return ICMPSpec{Any: true}, true
	}
	names := icmpNames
	if v6 {
		names = icmp6Names
	}
	if tc, ok := names[s]; ok {
		return ICMPSpec{Type: uint8(tc[0]), Code: tc[1]}, true
	}
	ts, cs, hasCode := strings.Cut(s, "/")
	t, err := strconv.ParseUint(ts, 10, 8)
	if err != nil {
		return ICMPSpec{}, false
	}
	spec := ICMPSpec{Type: uint8(t), Code: -1}
	if hasCode {
		c, err := strconv.ParseUint(cs, 10, 8)
		if err != nil {
			return ICMPSpec{}, false
		}
		spec.Code = int16(c)
	}
	return spec, true
}

// knownContinue are targets that never end traversal (XT_CONTINUE).
var knownContinue = map[string]bool{
	"LOG": true, "NFLOG": true, "ULOG": true, "CONNMARK": true, "CT": true, "NOTRACK": true,
	"TRACE": true, "CLASSIFY": true, "DSCP": true, "TOS": true, "TCPMSS": true, "CHECKSUM": true,
	"SECMARK": true, "CONNSECMARK": true, "AUDIT": true, "TTL": true, "HL": true, "IDLETIMER": true,
	"LED": true, "HMARK": true, "TEE": true, "SET": true, "RATEEST": true, "TCPOPTSTRIP": true,
}

func parseTarget(t *Target, isGoto bool, name string, args []string, family Family) error {
	t.Name = name
	// A copy: args is the end of the rule's tokens, which are not kept.
	t.Args = slices.Clone(args)
	if isGoto {
		t.Kind, t.Chain = TargetGoto, name
		return nil
	}
	switch name {
	case "RETURN":
		t.Kind = TargetReturn
	case "ACCEPT":
		t.Kind = TargetAccept
	case "DROP":
		t.Kind = TargetDrop
	case "REJECT":
		t.Kind = TargetReject
		t.RejectWith = optArg(args, "--reject-with")
		if t.RejectWith == "" {
			// iptables-save always prints it; hand-written rules get the
			// kernel's default.
			t.RejectWith = "icmp-port-unreachable"
			if family == IPv6 {
				t.RejectWith = "icmp6-port-unreachable"
			}
		}
	case "DNAT", "SNAT":
		t.Kind = TargetDNAT
		opt := "--to-destination"
		if name == "SNAT" {
			t.Kind, opt = TargetSNAT, "--to-source"
		}
		for i := 0; i < len(args); i++ {
			switch args[i] {
			case opt:
				if i+1 >= len(args) {
					return fmt.Errorf("%s needs an argument", opt)
				}
				nr, err := parseNATRange(args[i+1])
				if err != nil {
					return fmt.Errorf("%s %q: %w", opt, args[i+1], err)
				}
				t.NAT = append(t.NAT, nr)
				i++
			default:
				t.Flags = append(t.Flags, args[i])
			}
		}
	case "MASQUERADE", "REDIRECT":
		t.Kind = TargetMasquerade
		if name == "REDIRECT" {
			t.Kind = TargetRedirect
		}
		for i := 0; i < len(args); i++ {
			if args[i] == "--to-ports" && i+1 < len(args) {
				pr, err := parsePortRange(args[i+1], "-")
				if err != nil {
					return fmt.Errorf("--to-ports %q: %w", args[i+1], err)
				}
				t.NAT = append(t.NAT, NATRange{MinPort: pr.Lo, MaxPort: pr.Hi})
				i++
			} else {
				t.Flags = append(t.Flags, args[i])
			}
		}
	case "MARK":
		t.Kind = TargetMark
		if err := parseMarkTarget(t, args); err != nil {
			return err
		}
	case "QUEUE", "NFQUEUE":
		t.Kind = TargetQueue
	default:
		if knownContinue[name] {
			t.Kind = TargetContinue
		} else {
			// A user chain or an extension target we do not know:
			// Table.finish decides once every chain is declared.
			t.Kind, t.Chain = TargetJump, name
		}
	}
	return nil
}

// finish runs at COMMIT: a "jump" to a name that is not a chain of the
// table is an extension target this package does not know.
// finish numbers each chain's rules and makes a jump to a chain the table
// lacks unknown. A rule parsed before (ParseSaveReusing) has its number
// already, and is shared: it is copied where either would change it.
func (t *Table) finish() {
	for _, c := range t.Chains {
		for i, r := range c.Rules {
			missing := r.Target.Kind == TargetJump && t.Chains[r.Target.Chain] == nil
			if r.Index == i+1 && !missing {
				continue
			}
			if r.Index != 0 {
				copied := *r
				r = &copied
				c.Rules[i] = r
			}
			r.Index = i + 1
			if missing {
				r.Target.Kind, r.Target.Chain = TargetUnknown, ""
			}
		}
	}
}

func optArg(args []string, opt string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == opt {
			return args[i+1]
		}
	}
	return ""
}

// parseMarkTarget converts every MARK form to --set-xmark semantics
// (mark = (mark &^ mask) ^ value), which is what the kernel's xt_MARK v2
// applies and what iptables-save prints.
func parseMarkTarget(t *Target, args []string) error {
	if len(args) < 2 {
		return errors.New("MARK needs an operation")
	}
	v, mask, err := parseMarkMask(args[1])
	if err != nil {
		return err
	}
	_, _, hasMask := strings.Cut(args[1], "/")
	switch args[0] {
	case "--set-xmark":
		t.MarkValue, t.MarkMask = v, mask
	case "--set-mark":
		t.MarkValue, t.MarkMask = v, mask|v
	case "--or-mark":
		t.MarkValue, t.MarkMask = v, v
	case "--and-mark":
		t.MarkValue, t.MarkMask = 0, ^v
	case "--xor-mark":
		t.MarkValue, t.MarkMask = v, 0
	default:
		return fmt.Errorf("unknown MARK operation %s", args[0])
	}
	if hasMask && args[0] != "--set-xmark" && args[0] != "--set-mark" {
		return fmt.Errorf("%s takes no mask", args[0])
	}
	return nil
}

// parseNATRange parses DNAT/SNAT ranges: "10.0.0.1", "10.0.0.1:80",
// "10.0.0.1-10.0.0.9:80-90", "[2001:db8::1]:80", ":80".
func parseNATRange(s string) (NATRange, error) {
	var nr NATRange
	addrPart, portPart := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return nr, errors.New("unterminated [")
		}
		addrPart = s[1:end]
		rest := s[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return nr, errors.New("junk after ]")
			}
			portPart = rest[1:]
		}
	} else if strings.Count(s, ":") == 1 {
		addrPart, portPart, _ = strings.Cut(s, ":")
	} else if strings.Count(s, ":") > 1 {
		// A bare IPv6 address or range without ports.
		addrPart = s
	}
	if addrPart != "" {
		lo, hi, isRange := strings.Cut(addrPart, "-")
		// An IPv6 range inside brackets reads "[a-b]".
		a, err := netip.ParseAddr(lo)
		if err != nil {
			return nr, err
		}
		nr.MinAddr, nr.MaxAddr = a.Unmap(), a.Unmap()
		if isRange {
			b, err := netip.ParseAddr(hi)
			if err != nil {
				return nr, err
			}
			nr.MaxAddr = b.Unmap()
			if nr.MaxAddr.Less(nr.MinAddr) || nr.MinAddr.Is4() != nr.MaxAddr.Is4() {
				return nr, errors.New("bad address range")
			}
		}
	}
	if portPart != "" {
		pr, err := parsePortRange(portPart, "-")
		if err != nil {
			return nr, err
		}
		nr.MinPort, nr.MaxPort = pr.Lo, pr.Hi
	}
	return nr, nil
}
