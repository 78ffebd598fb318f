package main

import (
	"fmt"
	"strings"

	"github.com/tracer-dev/tracer/internal/event"
)

// parseTiers reads -only: tier names as event.Via prints them.
func parseTiers(s string) ([]event.Via, error) {
	var out []event.Via
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, ok := tierByName(f)
		if !ok {
			return nil, fmt.Errorf("unknown tier %q (want some of fentry, kprobe, tracepoint, netfilter)", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func tierByName(name string) (event.Via, bool) {
	for _, v := range []event.Via{event.ViaFentry, event.ViaKprobe, event.ViaTracepoint, event.ViaNetfilter} {
		if v.String() == name {
			return v, true
		}
	}
	return event.ViaNone, false
}

// tierList is -only's value for the tiers.
func tierList(vs []event.Via) string {
	var names []string
	for _, v := range vs {
		names = append(names, v.String())
	}
	return strings.Join(names, ",")
}
