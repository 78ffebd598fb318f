package main

import (
	"fmt"
	"slices"
	"strings"
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
