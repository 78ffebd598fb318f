package conntrack

import "github.com/tracer-dev/tracer/internal/event"

// IPS_* bits of enum ip_conntrack_status (include/uapi/linux/netfilter/
// nf_conntrack_common.h), the ones the tracker and its tests read.
const (
	StatusSeenReply uint32 = 1 << 1
	StatusAssured   uint32 = 1 << 2
	StatusConfirmed uint32 = 1 << 3
	StatusDstNAT    uint32 = 1 << 5
	StatusDying     uint32 = 1 << 9
)

// FormatStatus names the IPS_* bits set in status, lowest bit first. It is
// event.CTStatusNames, so a status reads the same whether it came from a
// kernel event or from the conntrack table.
func FormatStatus(status uint32) []string {
	return event.CTStatusNames(status)
}

// tcpStates are enum tcp_conntrack (include/uapi/linux/netfilter/
// nf_conntrack_tcp.h) as conntrack(8) prints them.
var tcpStates = [...]string{
	"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT",
	"CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2",
}

// TCPStateName names a conntrack TCP state number; unknown numbers (a newer
// kernel) are "" rather than a guess.
func TCPStateName(s uint8) string {
	if int(s) < len(tcpStates) {
		return tcpStates[s]
	}
	return ""
}
