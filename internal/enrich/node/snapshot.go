package node

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/tracer-dev/tracer/internal/rules"
	"github.com/tracer-dev/tracer/internal/trace"
)

// FromSnapshot is the state a trace header's snapshot recorded, parsed:
// what a replay diagnoses against, as the live pipeline does against the
// state it read. A part that does not parse is an error naming the part;
// an IPVS service or listener whose address does not parse is left out
// (no flow can reach it).
func FromSnapshot(snap *trace.Snapshot) (*State, error) {
	st := &State{notes: map[string]string{}, facts: map[string]bool{}}
	if snap == nil {
		st.local = rules.Loopback()
		st.finish()
		return st, nil
	}
	if err := st.addressesFrom(snap); err != nil {
		return nil, err
	}
	if len(snap.Rules) > 0 {
		v4, v6, err := parseRulesText(snap.Rules, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		st.rulesText, st.rules4, st.rules6 = snap.Rules, v4, v6
	}
	if snap.Ipsets != "" {
		sets, err := rules.ParseIPSetSave(strings.NewReader(snap.Ipsets))
		if err != nil {
			return nil, fmt.Errorf("snapshot ipsets: %w", err)
		}
		st.ipsetText, st.sets = snap.Ipsets, sets
	}
	for _, s := range snap.IPVS {
		if v, ok := ipvsFrom(s); ok {
			st.ipvs = append(st.ipvs, v)
		}
	}
	for _, l := range snap.Listeners {
		if ap, err := netip.ParseAddrPort(l.Address); err == nil {
			st.listeners = append(st.listeners, Listener{Proto: l.Proto, Addr: ap, V6Only: l.V6Only, Process: l.Process})
		}
	}
	st.nftRuleset = snap.NFTables
	st.finish()
	return st, nil
}

// addressesFrom reads the interface addresses and the local routes. A
// snapshot without local routes takes its addresses, each as a single
// address, and the loopback ranges as local.
func (s *State) addressesFrom(snap *trace.Snapshot) error {
	for _, a := range snap.Addresses {
		p, err := netip.ParsePrefix(a.Address)
		switch {
		case err == nil:
			s.addrs = append(s.addrs, Address{Interface: a.Interface, Prefix: p, Up: a.Up})
		case a.Interface == "kube-ipvs0":
			return fmt.Errorf("snapshot address %q of kube-ipvs0: %w", a.Address, err)
		case len(snap.LocalRoutes) == 0:
			return fmt.Errorf("snapshot local address %q: %w", a.Address, err)
		}
	}
	for _, r := range snap.LocalRoutes {
		p, err := parsePrefixOrAddr(r)
		if err != nil {
			return fmt.Errorf("snapshot local address %q: %w", r, err)
		}
		s.local = append(s.local, p)
	}
	if len(snap.LocalRoutes) == 0 {
		s.local = rules.Loopback()
		for _, a := range s.addrs {
			s.local = append(s.local, netip.PrefixFrom(a.Prefix.Addr(), a.Prefix.Addr().BitLen()))
		}
	}
	return nil
}

func parsePrefixOrAddr(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err == nil {
		return p, nil
	}
	a, aerr := netip.ParseAddr(s)
	if aerr != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// ipvsFrom is a recorded virtual server; a fwmark one has its mark for an
// address.
func ipvsFrom(s trace.IPVSService) (IPVSService, bool) {
	v := IPVSService{Proto: s.Proto, Scheduler: s.Scheduler}
	if s.Proto == "fwmark" {
		mark, err := strconv.ParseUint(s.Address, 10, 32)
		if err != nil {
			return v, false
		}
		v.FWMark = uint32(mark)
	} else {
		vip, err := netip.ParseAddrPort(s.Address)
		if err != nil {
			return v, false
		}
		v.VIP = vip
	}
	for _, r := range s.Reals {
		if ap, err := netip.ParseAddrPort(r); err == nil {
			v.Reals = append(v.Reals, IPVSReal{Addr: ap})
		}
	}
	return v, true
}

// NFTRuleset is the nftables ruleset as nft printed it; nil when it was
// not read.
func (s *State) NFTRuleset() *trace.NFTRuleset { return s.nftRuleset }
