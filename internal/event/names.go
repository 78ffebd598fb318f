package event

import (
	"fmt"
	"strconv"
)

// ReasonNamer names a drop or RST reason number for this kernel (the
// numbers differ between kernels; the loader reads the names from BTF).
type ReasonNamer interface {
	DropReason(uint32) string
	ResetReason(uint32) string
}

// String renders the range as IP[-IP][:PORT[-PORT]].
func (r Range) String() string { return string(r.AppendTo(nil)) }

// AppendTo appends the range as String renders it.
func (r Range) AppendTo(b []byte) []byte {
	if !r.MinAddr.IsValid() {
		return b
	}
	v6 := r.MinAddr.Is6()
	if v6 {
		b = append(b, '[')
	}
	b = r.MinAddr.AppendTo(b)
	if r.MaxAddr.IsValid() && r.MaxAddr != r.MinAddr {
		b = r.MaxAddr.AppendTo(append(b, '-'))
	}
	if v6 {
		b = append(b, ']')
	}
	if r.MinPort != 0 {
		b = strconv.AppendUint(append(b, ':'), uint64(r.MinPort), 10)
		if r.MaxPort != r.MinPort {
			b = strconv.AppendUint(append(b, '-'), uint64(r.MaxPort), 10)
		}
	}
	return b
}

// ICMPName names common ICMP and ICMPv6 error type/code pairs as REJECT
// and ip6tables' REJECT spell them.
func ICMPName(v4 bool, typ, code uint8) string {
	if v4 && typ == 3 {
		switch code {
		case 0:
			return "icmp-net-unreachable"
		case 1:
			return "icmp-host-unreachable"
		case 2:
			return "icmp-proto-unreachable"
		case 3:
			return "icmp-port-unreachable"
		case 4:
			return "icmp-frag-needed"
		case 9:
			return "icmp-net-prohibited"
		case 10:
			return "icmp-host-prohibited"
		case 13:
			return "icmp-admin-prohibited"
		}
	}
	if v4 && typ == 11 {
		return "icmp-time-exceeded"
	}
	// The spellings match internal/rules' reject table, so a rule's
	// --reject-with and the ICMPv6 error seen on the wire compare equal.
	if !v4 && typ == 1 {
		switch code {
		case 0:
			return "icmp6-no-route"
		case 1:
			return "icmp6-adm-prohibited"
		case 3:
			return "icmp6-addr-unreachable"
		case 4:
			return "icmp6-port-unreachable"
		case 5:
			return "icmp6-policy-fail"
		case 6:
			return "icmp6-reject-route"
		}
	}
	if !v4 && typ == 1 && code == 2 {
		return "icmp6-beyond-scope" // RFC 4443: not a REJECT type
	}
	if !v4 && typ == 3 {
		return "icmp6-time-exceeded"
	}
	// IPv6 routers do not fragment: packet too big is how an MTU fault
	// shows, as icmp-frag-needed does for IPv4.
	if !v4 && typ == 2 {
		return "icmp6-packet-too-big"
	}
	if !v4 && typ == 4 {
		return "icmp6-parameter-problem"
	}
	return fmt.Sprintf("icmp type %d code %d", typ, code)
}
