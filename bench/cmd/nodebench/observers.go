package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tracer-dev/tracer/internal/event"
)

// observerNames are the short names -observers takes, in the order the
// rounds run them.
var observerNames = []string{"none", "kernel", "stats", "live", "conntrack", "nft"}

func newObserver(name string) observer {
	switch name {
	case "none":
		return none{}
	case "kernel":
		return &kernelOnly{}
	case "stats":
		return &kernelOnly{stats: true}
	case "live":
		return &fullLive{}
	case "conntrack":
		return &conntrackE{}
	case "nft":
		return &nftTrace{}
	}
	return nil
}

// parseObservers checks a comma-separated list of observer names. "none"
// must be among them: every ratio is to the rounds with nothing attached.
func parseObservers(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(observerNames, f) {
			return nil, fmt.Errorf("unknown observer %q (want some of %s)", f, strings.Join(observerNames, ", "))
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if !slices.Contains(out, "none") {
		return nil, fmt.Errorf("%q lacks none, the rounds every ratio is to", s)
	}
	return out, nil
}

func observersOf(names []string) []observer {
	var out []observer
	for _, n := range names {
		out = append(out, newObserver(n))
	}
	return out
}

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
