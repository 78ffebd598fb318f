package loader

import (
	"slices"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
)

// The netfilter tier shares two programs among several hooks: their run
// statistics must be reported against every hook whose work they do.
func TestProgramHooks(t *testing.T) {
	plan := Plan{
		{Hook: event.HookNFNat, Via: event.ViaNetfilter},
		{Hook: event.HookIPVSConnNew, Via: event.ViaNone},
		{Hook: event.HookICMPSend, Via: event.ViaTracepoint, Program: "tr_icmp_tp"},
		{Hook: event.HookNFSendReset, Via: event.ViaNetfilter},
		{Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, Program: "tr_rst_tp3"},
		{Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Program: "tr_drop_tp3"},
	}
	for _, c := range []struct {
		prog string
		via  event.Via
		want []event.Hook
	}{
		{"tr_nf_dnat", event.ViaNetfilter, []event.Hook{event.HookNFNat, event.HookNFSendReset}},
		{"tr_nf_snat", event.ViaNetfilter, []event.Hook{event.HookNFNat}},
		{"tr_icmp_tp", event.ViaTracepoint, []event.Hook{event.HookICMPSend}},
		{"tr_drop_tp3", event.ViaTracepoint, []event.Hook{event.HookKfreeSkb}},
		{"tr_rst_tp", event.ViaTracepoint, nil},
	} {
		if got := programHooks(plan, c.prog, c.via); !slices.Equal(got, c.want) {
			t.Errorf("%s: hooks %v, want %v", c.prog, got, c.want)
		}
	}
}
