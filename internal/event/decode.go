package event

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Layout of struct event and struct tuple in bpf/tracer.h. The loader's
// test checks every offset here against the BTF of the compiled object.
const (
	Size = 200

	OffTsNs       = 0
	OffNetns      = 8
	OffReason     = 12
	OffCTStatus   = 16
	OffCTMark     = 20
	OffRangeFlags = 24
	OffCTZone     = 28
	OffKind       = 30
	OffHook       = 31
	OffVia        = 32
	OffICMPType   = 33
	OffICMPCode   = 34
	OffNFHook     = 35
	OffCTInfo     = 36
	OffHasReason  = 37
	OffNoCT       = 38
	OffPkt        = 40
	OffOrig       = 80
	OffReply      = 120
	OffTo         = 160

	TupleSize      = 40
	TupleOffSrc    = 0
	TupleOffDst    = 16
	TupleOffSport  = 32
	TupleOffDport  = 34
	TupleOffFamily = 36
	TupleOffProto  = 37
)

const (
	afInet  = 2
	afInet6 = 10
)

// ErrShort is returned for records shorter than an event.
var ErrShort = errors.New("event record too short")

// Clock turns the kernel's CLOCK_MONOTONIC nanoseconds into wall time.
type Clock struct {
	// BootWall is the wall time at monotonic zero.
	BootWall time.Time
}

// Wall converts a monotonic timestamp.
func (c Clock) Wall(ns uint64) time.Time {
	return c.BootWall.Add(time.Duration(ns))
}

// Decode parses one ring buffer record. It never panics: records of the
// wrong size or with unknown enums are errors.
func Decode(b []byte, clock Clock) (Event, error) {
	var e Event
	if len(b) < Size {
		return e, fmt.Errorf("decode event: %d bytes: %w", len(b), ErrShort)
	}
	le := binary.LittleEndian
	e.Kind = Kind(b[OffKind])
	if e.Kind < KindDNAT || e.Kind > KindCTDestroy {
		return e, fmt.Errorf("decode event: unknown kind %d", b[OffKind])
	}
	e.Hook = Hook(b[OffHook])
	if e.Hook == 0 || int(e.Hook) >= len(hookNames) {
		return e, fmt.Errorf("decode event: unknown hook %d", b[OffHook])
	}
	e.Via = Via(b[OffVia])
	if e.Via < ViaFentry || e.Via > ViaNetfilter {
		return e, fmt.Errorf("decode event: unknown attach method %d", b[OffVia])
	}
	e.Time = clock.Wall(le.Uint64(b[OffTsNs:]))
	e.Netns = le.Uint32(b[OffNetns:])
	e.Reason = le.Uint32(b[OffReason:])
	e.CTStatus = le.Uint32(b[OffCTStatus:])
	e.CTMark = le.Uint32(b[OffCTMark:])
	e.To.Flags = le.Uint32(b[OffRangeFlags:])
	e.CTZone = le.Uint16(b[OffCTZone:])
	e.ICMPType = b[OffICMPType]
	e.ICMPCode = b[OffICMPCode]
	e.NFHook = b[OffNFHook]
	e.CTInfo = b[OffCTInfo]
	e.HasReason = b[OffHasReason] != 0
	e.NoCT = b[OffNoCT] != 0
	var err error
	if e.Packet, err = decodeTuple(b[OffPkt:]); err != nil {
		return e, fmt.Errorf("decode event packet: %w", err)
	}
	if e.Orig, err = decodeTuple(b[OffOrig:]); err != nil {
		return e, fmt.Errorf("decode event original tuple: %w", err)
	}
	if e.Reply, err = decodeTuple(b[OffReply:]); err != nil {
		return e, fmt.Errorf("decode event reply tuple: %w", err)
	}
	to, err := decodeTuple(b[OffTo:])
	if err != nil {
		return e, fmt.Errorf("decode event target: %w", err)
	}
	e.To.MinAddr, e.To.MaxAddr = to.Src, to.Dst
	e.To.MinPort, e.To.MaxPort = to.SrcPort, to.DstPort
	if e.Kind == KindIPVS {
		e.To.MaxAddr, e.To.MaxPort = e.To.MinAddr, e.To.MinPort
	}
	return e, nil
}

// decodeTuple reads a struct tuple; ports are in network byte order there.
func decodeTuple(b []byte) (Tuple, error) {
	var t Tuple
	switch b[TupleOffFamily] {
	case 0:
		return t, nil
	case afInet:
		t.Src = netip.AddrFrom4([4]byte(b[TupleOffSrc : TupleOffSrc+4]))
		t.Dst = netip.AddrFrom4([4]byte(b[TupleOffDst : TupleOffDst+4]))
	case afInet6:
		t.Src = netip.AddrFrom16([16]byte(b[TupleOffSrc : TupleOffSrc+16]))
		t.Dst = netip.AddrFrom16([16]byte(b[TupleOffDst : TupleOffDst+16]))
	default:
		return t, fmt.Errorf("unknown address family %d", b[TupleOffFamily])
	}
	t.SrcPort = binary.BigEndian.Uint16(b[TupleOffSport:])
	t.DstPort = binary.BigEndian.Uint16(b[TupleOffDport:])
	t.Proto = b[TupleOffProto]
	return t, nil
}
