package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
)

// observerKeys name the observers for -observers, in the order a round
// runs them.
var observerKeys = []string{"none", "kernel", "stats", "ct", "live", "conntrack", "nft", "blocker", "blocker-own"}

// newObserver is the observer a key of -observers names.
// The tracer's observers run in a process of their own (separate).
func newObserver(key string) (observer, error) {
	switch key {
	case "kernel", "stats", "ct", "live":
		o, err := inProcessObserver(key)
		if err != nil {
			return nil, err
		}
		return &separate{key: key, label: o.name()}, nil
	case "blocker-own":
		return &separate{key: "blocker", label: (&blocker{own: true}).name()}, nil
	}
	return inProcessObserver(key)
}

// inProcessObserver is the observer a key names, run in this process.
func inProcessObserver(key string) (observer, error) {
	switch key {
	case "none":
		return none{}, nil
	case "kernel":
		return &kernelOnly{}, nil
	case "stats":
		return &kernelOnly{stats: true}, nil
	case "ct":
		return &ctTracker{}, nil
	case "live":
		return &fullLive{}, nil
	case "conntrack":
		return &conntrackE{}, nil
	case "nft":
		return &nftTrace{}, nil
	case "blocker":
		return &blocker{}, nil
	}
	return nil, fmt.Errorf("unknown observer %q (known: %s)", key, strings.Join(observerKeys, ","))
}

// observers reads -observers; "none" is always measured, every ratio is
// to it.
func observers(spec string) ([]observer, error) {
	out := []observer{none{}}
	for _, key := range strings.Split(spec, ",") {
		key = strings.TrimSpace(key)
		if key == "" || key == "none" {
			continue
		}
		o, err := newObserver(key)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// cpuProfileEnv names the file a CPU profile of every full live pipeline
// window goes to: the first window to the file itself, the n-th to
// FILE.n, so `go tool pprof` can merge them. The conntrack tracker
// observer's windows go to FILE-ct, FILE-ct.2, ...
const cpuProfileEnv = "NODEBENCH_CPUPROFILE"

// windowProfile is a CPU profile of one observer's windows, when asked
// for; suffix tells its files from another observer's.
type windowProfile struct {
	suffix  string
	windows int
	f       *os.File
	path    string
}

func (w *windowProfile) start() error {
	path := os.Getenv(cpuProfileEnv)
	if path == "" {
		return nil
	}
	path += w.suffix
	w.windows++
	if n, err := strconv.Atoi(os.Getenv(windowEnv)); err == nil {
		w.windows = n
	}
	if w.windows > 1 {
		path = fmt.Sprintf("%s.%d", path, w.windows)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("cpu profile: %w", err)
	}
	w.f, w.path = f, path
	return nil
}

func (w *windowProfile) stop() error {
	if w.f == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := w.f.Close()
	w.f = nil
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	return writeAllocs(w.path + ".allocs")
}

// writeAllocs writes the process's allocations so far, beside the CPU
// profile: what the garbage collector's share of it comes from.
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("allocation profile: %w", err)
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("allocation profile: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("allocation profile: %w", err)
	}
	return nil
}

// labelled runs fn with the pprof label observer=name, which every
// goroutine fn starts inherits: the profile then tells the observer's
// own CPU from the load generator's and the server's.
func labelled(name string, fn func(ctx context.Context)) {
	pprof.Do(context.Background(), pprof.Labels("observer", name), fn)
}
