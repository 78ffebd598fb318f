package loader

import (
	"slices"
	"testing"

	"github.com/tracer-dev/tracer/internal/event"
)

// The netfilter tier shares two programs among several hooks: their run
// statistics must be reported against every hook whose work they do. A
// program of another tier serves the hook that attached it, even when the
// same program serves another hook too (the IPv4 and IPv6 ICMP hooks).
func TestProgramHooks(t *testing.T) {
	plan := Plan{
		{Hook: event.HookNFNat, Via: event.ViaNetfilter},
		{Hook: event.HookIPVSConnNew, Via: event.ViaNone},
		{Hook: event.HookICMPSend, Via: event.ViaFentry, Program: "tr_icmp_fentry"},
		{Hook: event.HookICMP6Send, Via: event.ViaFentry, Program: "tr_icmp_fentry"},
		{Hook: event.HookNFSendReset, Via: event.ViaNetfilter},
		{Hook: event.HookNFSendReset6, Via: event.ViaNetfilter},
		{Hook: event.HookTCPSendReset, Via: event.ViaTracepoint, Program: "tr_rst_tp3"},
		{Hook: event.HookTCPSendReset6, Via: event.ViaTracepoint, Program: "tr_rst_tp3"},
		{Hook: event.HookKfreeSkb, Via: event.ViaTracepoint, Program: "tr_drop_tp3"},
	}
	for _, c := range []struct {
		prog attachedProgram
		want []event.Hook
	}{
		{attachedProgram{name: "tr_nf_dnat", via: event.ViaNetfilter},
			[]event.Hook{event.HookNFNat, event.HookNFSendReset, event.HookNFSendReset6}},
		{attachedProgram{name: "tr_nf_snat", via: event.ViaNetfilter}, []event.Hook{event.HookNFNat}},
		{attachedProgram{name: "tr_icmp_fentry", via: event.ViaFentry, hook: event.HookICMP6Send},
			[]event.Hook{event.HookICMP6Send}},
		{attachedProgram{name: "tr_rst_tp3", via: event.ViaTracepoint, hook: event.HookTCPSendReset},
			[]event.Hook{event.HookTCPSendReset}},
	} {
		if got := programHooks(plan, c.prog); !slices.Equal(got, c.want) {
			t.Errorf("%s for %s: hooks %v, want %v", c.prog.name, c.prog.hook, got, c.want)
		}
	}
}
