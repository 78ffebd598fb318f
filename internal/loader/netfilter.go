package loader

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/netns"
)

// Priorities just after the kernel's nat hooks (NF_IP_PRI_NAT_DST = -100,
// NF_IP_PRI_NAT_SRC = 100), where skb->_nfct already holds what NAT chose.
// A BPF hook may not share its priority with any other hook (EBUSY), and
// IPVS takes -99 and -98 at OUTPUT, so each has alternatives that keep it
// between NAT and the filter table (or before conntrack confirms).
var (
	prioAfterDNAT = []int32{-95, -90, -85, -80, -70, -60, -50}
	prioAfterSNAT = []int32{101, 105, 110, 120, 150, 200, 250}
)

type nfAttach struct {
	prog   string
	hook   link.NetfilterInetHook
	prios  []int32
	family link.NetfilterProtocolFamily
}

// nfAttachments lists where the netfilter-tier programs go for the roles
// asked: NAT needs all four hooks; RST and ICMP detection only LOCAL_OUT.
func nfAttachments(roles uint32) []nfAttach {
	var out []nfAttach
	for _, fam := range []link.NetfilterProtocolFamily{link.NetfilterProtoIPv4, link.NetfilterProtoIPv6} {
		out = append(out, nfAttach{"tr_nf_dnat", link.NetfilterInetLocalOut, prioAfterDNAT, fam})
		if roles&nfRoleNAT != 0 {
			out = append(out,
				nfAttach{"tr_nf_dnat", link.NetfilterInetPreRouting, prioAfterDNAT, fam},
				nfAttach{"tr_nf_snat", link.NetfilterInetPostRouting, prioAfterSNAT, fam},
				nfAttach{"tr_nf_snat", link.NetfilterInetLocalIn, prioAfterSNAT, fam})
		}
	}
	return out
}

// attachNetfilter loads the netfilter programs with the roles the other
// tiers could not fill, and attaches them in the observed namespace (a
// netfilter link belongs to the namespace of the thread that makes it).
func (t *Tracer) attachNetfilter(netnsPaths []string, roles uint32) error {
	progs := map[string]*ebpf.Program{}
	for _, name := range []string{"tr_nf_dnat", "tr_nf_snat"} {
		p, err := t.loadProgram(name, "", map[string]any{"cfg_nf_roles": roles})
		if err != nil {
			return fmt.Errorf("load netfilter program %s: %w", name, err)
		}
		progs[name] = p
	}
	if len(netnsPaths) == 0 {
		netnsPaths = []string{""}
	}
	for _, path := range netnsPaths {
		err := netns.On(path, func() error {
			for _, a := range nfAttachments(roles) {
				l, err := attachNetfilterAt(progs[a.prog], a)
				if err != nil {
					return err
				}
				t.links = append(t.links, l)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	var attached []string
	for _, a := range nfAttachments(roles) {
		if !slices.Contains(attached, a.prog) {
			attached = append(attached, a.prog)
			t.progs = append(t.progs, attachedProgram{name: a.prog, via: event.ViaNetfilter, prog: progs[a.prog]})
		}
	}
	return nil
}

// attachNetfilterAt tries the hook's priorities in order until one is free.
func attachNetfilterAt(p *ebpf.Program, a nfAttach) (link.Link, error) {
	var err error
	for _, prio := range a.prios {
		var l link.Link
		l, err = link.AttachNetfilter(link.NetfilterOptions{Program: p, ProtocolFamily: a.family, Hook: a.hook, Priority: prio})
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
	}
	return nil, fmt.Errorf("attach netfilter %s hook %d priorities %v: %w", a.prog, a.hook, a.prios, err)
}
