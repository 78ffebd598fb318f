package loader

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func capsOf(cs ...capability) uint64 {
	var m uint64
	for _, c := range cs {
		m |= 1 << c.bit
	}
	return m
}

// TestCheckCaps: each capability the tracer lacks is named, with why it is
// needed; CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON (the
// kernel's bpf_capable and perfmon_capable) but not for CAP_NET_ADMIN.
func TestCheckCaps(t *testing.T) {
	netns := Needs{SysAdmin: "--netns enters the namespace", SysAdminFix: "run inside it"}
	for _, tc := range []struct {
		name    string
		caps    uint64
		needs   Needs
		missing []string
		fix     string
	}{
		{"least", capsOf(capBPF, capPerfmon, capNetAdmin), Needs{}, nil, ""},
		{"root", ^uint64(0), netns, nil, ""},
		{"sysadmin for bpf and perfmon", capsOf(capSysAdmin, capNetAdmin), netns, nil, ""},
		{"no bpf", capsOf(capPerfmon, capNetAdmin), Needs{}, []string{"CAP_BPF"}, "setpriv"},
		{"no perfmon", capsOf(capBPF, capNetAdmin), Needs{}, []string{"CAP_PERFMON"}, "setpriv"},
		{"no net_admin", capsOf(capBPF, capPerfmon), Needs{}, []string{"CAP_NET_ADMIN"}, "setpriv"},
		{"sysadmin without net_admin", capsOf(capSysAdmin), Needs{}, []string{"CAP_NET_ADMIN"}, "setpriv"},
		{"none", 0, Needs{}, []string{"CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"}, "run as root"},
		{"netns without sysadmin", capsOf(capBPF, capPerfmon, capNetAdmin), netns, []string{"CAP_SYS_ADMIN"}, "run inside it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCaps(tc.caps, tc.needs)
			if tc.missing == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var pe *PrivilegeError
			if !errors.As(err, &pe) || !errors.Is(err, ErrNoPrivilege) {
				t.Fatalf("err %v: want a PrivilegeError", err)
			}
			if !slices.Equal(pe.Missing, tc.missing) {
				t.Errorf("missing %v, want %v", pe.Missing, tc.missing)
			}
			for _, name := range tc.missing {
				if !strings.Contains(err.Error(), name+" (") {
					t.Errorf("%q does not say why %s is needed", err, name)
				}
			}
			if !strings.Contains(err.Error(), tc.fix) {
				t.Errorf("%q does not say what to do (%q)", err, tc.fix)
			}
		})
	}
}
