package loader

import (
	"fmt"
	"strings"
	"time"

	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
)

// ReasonNames maps this kernel's drop and RST reason numbers to names. The
// numbers differ between kernels, so they come from the kernel's BTF.
type ReasonNames struct {
	drop  map[uint32]string
	reset map[uint32]string
}

// LoadReasonNames reads enum skb_drop_reason and enum sk_rst_reason from
// the kernel's BTF; missing enums leave numbers unnamed.
func LoadReasonNames() *ReasonNames { return reasonNames(btf.NewCache()) }

func reasonNames(cache *btf.Cache) *ReasonNames {
	n := &ReasonNames{drop: map[uint32]string{}, reset: map[uint32]string{}}
	spec, err := cache.Kernel()
	if err != nil {
		return n
	}
	n.drop = enumNames(spec, "skb_drop_reason", "SKB_DROP_REASON_")
	n.reset = enumNames(spec, "sk_rst_reason", "SK_RST_REASON_")
	return n
}

func enumNames(spec *btf.Spec, name, prefix string) map[uint32]string {
	out := map[uint32]string{}
	var e *btf.Enum
	if err := spec.TypeByName(name, &e); err != nil {
		return out
	}
	for _, v := range e.Values {
		if _, dup := out[uint32(v.Value)]; !dup {
			out[uint32(v.Value)] = strings.TrimPrefix(v.Name, prefix)
		}
	}
	return out
}

// DropReason names a drop reason, e.g. NETFILTER_DROP.
func (n *ReasonNames) DropReason(r uint32) string { return name(n.drop, r) }

// KnowsDropReason says whether this kernel has the drop reason name, e.g.
// NETFILTER_DROP (5.17 and later).
func (n *ReasonNames) KnowsDropReason(name string) bool {
	for _, v := range n.drop {
		if v == name {
			return true
		}
	}
	return false
}

// ResetReason names an RST reason, e.g. NO_SOCKET.
func (n *ReasonNames) ResetReason(r uint32) string { return name(n.reset, r) }

func name(m map[uint32]string, r uint32) string {
	if s, ok := m[r]; ok {
		return s
	}
	return fmt.Sprintf("reason %d", r)
}

var _ event.ReasonNamer = (*ReasonNames)(nil)

// monotonicClock pairs CLOCK_MONOTONIC (bpf_ktime_get_ns) with wall time.
func monotonicClock() (event.Clock, error) {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return event.Clock{}, fmt.Errorf("read monotonic clock: %w", err)
	}
	return event.Clock{BootWall: now.Add(-time.Duration(ts.Nano()))}, nil
}
