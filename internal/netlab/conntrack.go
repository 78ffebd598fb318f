package netlab

import (
	"bytes"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/tracer-dev/tracer/internal/event"
)

// ConntrackEntry is one line of `conntrack -L`: the kernel's table as the
// conntrack tool prints it, the truth the tracer's conntrack is held to.
// ICMP tuples are keyed as conntrack keys them: the echo id as source
// port, type<<8|code as destination port.
type ConntrackEntry struct {
	Orig, Reply event.Tuple
	State       string // TCP's, "" for other protocols
	Assured     bool
	Unreplied   bool
}

// ConntrackList is the namespace's table as `conntrack -L args...` prints
// it. It reads stdout alone: the tool's summary goes to stderr unbuffered,
// and would land inside a line once the listing passes stdout's 4 KiB
// buffer.
func (n Namespace) ConntrackList(args ...string) ([]ConntrackEntry, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("conntrack", append([]string{"-L"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := n.RunCmd(cmd); err != nil {
		return nil, fmt.Errorf("conntrack -L %v in %s: %w: %s", args, n.Name, err, stderr.String())
	}
	var entries []ConntrackEntry
	for _, line := range strings.Split(stdout.String(), "\n") {
		if e, ok := ParseConntrackLine(line); ok {
			entries = append(entries, e)
		}
	}
	return entries, nil
}

// ParseConntrackLine reads "tcp 6 431999 ESTABLISHED src=.. dst=..
// sport=.. dport=.. src=.. dst=.. sport=.. dport=.. [ASSURED] mark=0
// use=1" (ICMP: type, code and id instead of the ports); the first tuple
// is the original, the second the reply.
func ParseConntrackLine(line string) (ConntrackEntry, bool) {
	f := strings.Fields(line)
	if len(f) < 3 {
		return ConntrackEntry{}, false
	}
	var e ConntrackEntry
	var proto uint8
	if _, err := fmt.Sscan(f[1], &proto); err != nil {
		return ConntrackEntry{}, false
	}
	var tuples [2]map[string]string
	n := -1
	for _, w := range f[2:] {
		k, v, ok := strings.Cut(w, "=")
		switch {
		case w == "[ASSURED]":
			e.Assured = true
		case w == "[UNREPLIED]":
			e.Unreplied = true
		case !ok && w == strings.ToUpper(w) && w[0] >= 'A' && w[0] <= 'Z':
			e.State = w
		case k == "src" && n < 1:
			n++
			tuples[n] = map[string]string{k: v}
		case ok && n >= 0 && k != "mark" && k != "use" && k != "zone":
			tuples[n][k] = v
		}
	}
	if n != 1 {
		return ConntrackEntry{}, false
	}
	var okO, okR bool
	e.Orig, okO = toolTuple(proto, tuples[0])
	e.Reply, okR = toolTuple(proto, tuples[1])
	if !okO || !okR {
		return ConntrackEntry{}, false
	}
	return e, true
}

func toolTuple(proto uint8, kv map[string]string) (event.Tuple, bool) {
	src, err1 := netip.ParseAddr(kv["src"])
	dst, err2 := netip.ParseAddr(kv["dst"])
	if err1 != nil || err2 != nil {
		return event.Tuple{}, false
	}
	tu := event.Tuple{Proto: proto, Src: src, Dst: dst}
	num := func(k string) uint16 {
		var n uint16
		fmt.Sscan(kv[k], &n)
		return n
	}
	if proto == 1 || proto == 58 {
		tu.SrcPort, tu.DstPort = num("id"), num("type")<<8|num("code")
		return tu, true
	}
	tu.SrcPort, tu.DstPort = num("sport"), num("dport")
	return tu, true
}
