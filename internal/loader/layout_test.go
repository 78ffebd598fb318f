package loader

import (
	"testing"
	"unsafe"

	"github.com/cilium/ebpf/btf"

	"github.com/tracer-dev/tracer/internal/event"
)

// The Go decoder reads struct event by fixed offsets: check each against the
// BTF of the committed object, so a change to bpf/tracer.h that is not
// mirrored in internal/event fails here instead of decoding garbage.
func TestEventLayoutMatchesBTF(t *testing.T) {
	spec, err := loadTracer()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]uint32{
		"event": {
			"ts_ns": event.OffTsNs, "netns": event.OffNetns, "reason": event.OffReason,
			"ct_status": event.OffCTStatus, "ct_mark": event.OffCTMark, "range_flags": event.OffRangeFlags,
			"ct_zone": event.OffCTZone, "kind": event.OffKind, "hook": event.OffHook, "via": event.OffVia,
			"icmp_type": event.OffICMPType, "icmp_code": event.OffICMPCode, "nf_hook": event.OffNFHook,
			"ctinfo": event.OffCTInfo, "has_reason": event.OffHasReason, "no_ct": event.OffNoCT, "pkt": event.OffPkt,
			"orig": event.OffOrig, "reply": event.OffReply, "to": event.OffTo,
		},
		"tuple": {
			"src": event.TupleOffSrc, "dst": event.TupleOffDst, "sport": event.TupleOffSport,
			"dport": event.TupleOffDport, "family": event.TupleOffFamily, "proto": event.TupleOffProto,
		},
	}
	sizes := map[string]uint32{"event": event.Size, "tuple": event.TupleSize}
	for name, fields := range want {
		var s *btf.Struct
		if err := spec.Types.TypeByName(name, &s); err != nil {
			t.Fatalf("struct %s not in the object's BTF: %v", name, err)
		}
		if s.Size != sizes[name] {
			t.Errorf("struct %s: BTF size %d, Go decoder expects %d", name, s.Size, sizes[name])
		}
		seen := map[string]bool{}
		for _, m := range s.Members {
			seen[m.Name] = true
			off, ok := fields[m.Name]
			if !ok {
				if m.Name != "_pad" {
					t.Errorf("struct %s: member %s is not decoded in Go", name, m.Name)
				}
				continue
			}
			if got := m.Offset.Bytes(); got != off {
				t.Errorf("struct %s: member %s at BTF offset %d, Go decoder reads %d", name, m.Name, got, off)
			}
		}
		for f := range fields {
			if !seen[f] {
				t.Errorf("struct %s: Go decodes %s, which BTF does not have", name, f)
			}
		}
	}
}

// Every program a ladder names must exist in the object.
func TestLaddersNameRealPrograms(t *testing.T) {
	spec, err := loadTracer()
	if err != nil {
		t.Fatal(err)
	}
	for h, rungs := range ladders {
		if len(rungs) == 0 {
			t.Errorf("hook %s has an empty ladder", h)
		}
		for _, r := range rungs {
			if r.attach == nil {
				continue
			}
			if _, ok := spec.Programs[r.prog]; !ok {
				t.Errorf("hook %s: program %s is not in the object", h, r.prog)
			}
		}
	}
	for _, h := range event.Hooks {
		if _, ok := ladders[h]; !ok {
			t.Errorf("hook %s has no ladder", h)
		}
	}
}

// CTLookup writes and reads struct ct_query by fixed offsets: check them
// against the generated struct, which follows the object's BTF.
func TestCTQueryLayout(t *testing.T) {
	var q ctlookupCtQuery
	for name, got := range map[string][2]uintptr{
		"size":       {unsafe.Sizeof(q), ctQuerySize},
		"family":     {unsafe.Offsetof(q.Family), ctQueryFamily},
		"proto":      {unsafe.Offsetof(q.Proto), ctQueryProto},
		"found":      {unsafe.Offsetof(q.Found), ctQueryFound},
		"tcp_state":  {unsafe.Offsetof(q.TcpState), ctQueryTCPState},
		"zone":       {unsafe.Offsetof(q.Zone), ctQueryZone},
		"status":     {unsafe.Offsetof(q.Status), ctQueryStatus},
		"mark":       {unsafe.Offsetof(q.Mark), ctQueryMark},
		"tuple":      {unsafe.Offsetof(q.Tuple), ctQueryTuple},
		"reply":      {unsafe.Offsetof(q.Reply), ctQueryReply},
		"tuple size": {unsafe.Sizeof(q.Tuple), ctTupleSize},
		"dport":      {unsafe.Offsetof(q.Tuple.Dport), 34},
	} {
		if got[0] != got[1] {
			t.Errorf("struct ct_query %s: %d in the object, %d in ctlookup.go", name, got[0], got[1])
		}
	}
}
