package diagnose

import (
	"testing"

	"github.com/tracer-dev/tracer/internal/trace"
)

// flowLateAnswer is a masqueraded DNAT whose backend's packet reached the
// node untranslated and was reset and dropped there (seen in the 6.1 VM
// when the next SYN from the same client port had replaced the entry).
func flowLateAnswer(state string) *trace.Flow {
	f := flow("tcp", "10.0.0.2:31005", "10.97.78.8:80", "192.168.0.3:8080", trace.KindDNAT, trace.KindSNAT, trace.KindReset, trace.KindDrop)
	f.Reply.Dst = "192.168.0.2:31005"
	f.Events[0].To = "192.168.0.3:8080"
	f.Events[1].To = "192.168.0.2"
	answer := &trace.Tuple{Src: "192.168.0.3:8080", Dst: "192.168.0.2:31005"}
	f.Events[2].Packet, f.Events[3].Packet = answer, answer
	f.Events[3].Reason = "NO_SOCKET"
	f.Conntrack = &trace.Conntrack{Replied: true, State: state}
	return f
}

func TestLateAnswerAfterCloseIsOK(t *testing.T) {
	for _, state := range []string{"CLOSE", "TIME_WAIT"} {
		check(t, flowLateAnswer(state), trace.VerdictOK, "was DNAT'd to 192.168.0.3:8080",
			"late packet from 192.168.0.3:8080 to 192.168.0.2:31005", "the connection itself was answered")
	}
}

// The same untranslated answer while the connection is open is the
// connection's answers refused.
func TestUntranslatedAnswerWhileOpenIsReset(t *testing.T) {
	check(t, flowLateAnswer("ESTABLISHED"), trace.VerdictReset, "reach the node untranslated",
		"from 192.168.0.3:8080 to 192.168.0.2:31005", "no socket of the node's own holds 192.168.0.2:31005", "state ESTABLISHED", "went away")
	f := flowLateAnswer("CLOSE")
	f.Conntrack.Replied = false
	check(t, f, trace.VerdictReset, "reach the node untranslated")
}

// Only the reply tuple itself counts: a reset of a packet in the
// connection's own direction is the generic stack reset.
func TestOrigDirectionResetIsNotLateAnswer(t *testing.T) {
	f := flowLateAnswer("CLOSE")
	f.Events = f.Events[:3]
	f.Events[2].Packet = &trace.Tuple{Src: "10.0.0.2:31005", Dst: "192.168.0.3:8080"}
	check(t, f, trace.VerdictReset, "no socket listens on 192.168.0.3:8080")
}
