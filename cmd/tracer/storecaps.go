package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/tracer-dev/tracer/internal/trace"
)

// storeCaps are the flags that bound the UI's store, on the commands that
// hold one (ui, replay, lab).
type storeCaps struct {
	flows  int
	memory string
}

// defaultMaxMemory is trace.DefaultCaps.Memory as the flag spells it.
const defaultMaxMemory = "256MiB"

func (c *storeCaps) register(fs *flag.FlagSet) {
	fs.IntVar(&c.flows, "max-flows", trace.DefaultCaps.Flows, "the UI keeps at most `N` flows; older ones are dropped but still counted (0: no count cap)")
	fs.StringVar(&c.memory, "max-memory", defaultMaxMemory, "the UI's flows take at most `SIZE` (e.g. 256MiB, 1GiB; at least 16MiB; 0: no memory cap); older ones are dropped but still counted")
}

// caps validates the flags.
func (c *storeCaps) caps() (trace.Caps, error) {
	if c.flows < 0 {
		return trace.Caps{}, usagef("--max-flows %d: must not be negative", c.flows)
	}
	mem, err := parseSize(c.memory)
	if err != nil {
		return trace.Caps{}, usagef("--max-memory %q: %v", c.memory, err)
	}
	if mem != 0 && mem < trace.MinMemory {
		return trace.Caps{}, usagef("--max-memory %s: must be at least 16MiB (the flows being filled in and the shared tables), or 0", c.memory)
	}
	return trace.Caps{Flows: c.flows, Memory: mem}, nil
}

var sizeUnits = []struct {
	suffix string
	bytes  int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}

var errSize = errors.New("want a whole number of bytes with an optional unit: KiB, MiB or GiB (K, M, G)")

// parseSize reads a byte count such as 256MiB; the units are binary.
func parseSize(s string) (int64, error) {
	num, unit := strings.TrimSpace(s), int64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, unit = strings.TrimSpace(rest), u.bytes
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, errSize
	}
	if n > (1<<62)/unit {
		return 0, fmt.Errorf("%s is too large", s)
	}
	return n * unit, nil
}
