package loader

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"sync"
)

// ladderTargets are the kernel functions and tracepoints the ladders
// name: the only names the attach explanations ask kallsyms about.
var ladderTargets = sync.OnceValue(func() map[string]bool {
	out := map[string]bool{}
	for _, rungs := range ladders {
		for _, r := range rungs {
			out[r.target] = true
		}
	}
	return out
})

// targetSymbols maps the ladders' targets that /proc/kallsyms lists as
// functions to their module ("" for the kernel itself), read once; nil
// when kallsyms cannot be read. Only the targets are kept: the whole
// table is some 120,000 functions, which took 16 MiB of heap for the
// tracer's lifetime and 100 ms of CPU to build.
var targetSymbols = sync.OnceValue(func() map[string]string { return readKallsyms(ladderTargets()) })

// kernelSymbol says whether kallsyms lists sym as a function (ok) and in
// which module; readable is false when kallsyms cannot be read. A name no
// ladder targets is looked for in a read of its own.
func kernelSymbol(sym string) (mod string, ok, readable bool) {
	var syms map[string]string
	if ladderTargets()[sym] {
		syms = targetSymbols()
	} else {
		syms = readKallsyms(map[string]bool{sym: true})
	}
	if syms == nil {
		return "", false, false
	}
	mod, ok = syms[sym]
	return mod, ok, true
}

// kernelHasSymbol reports whether a function exists (modules included);
// when kallsyms cannot be read it does not claim a symbol is missing.
func kernelHasSymbol(sym string) bool {
	_, ok, readable := kernelSymbol(sym)
	return ok || !readable
}

// symbolModule is the module a function is in, "" for the kernel itself
// or a function kallsyms does not list.
func symbolModule(sym string) string {
	mod, _, _ := kernelSymbol(sym)
	return mod
}

func readKallsyms(wanted map[string]bool) map[string]string {
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return nil
	}
	defer f.Close()
	syms, err := parseKallsyms(f, wanted)
	if err != nil {
		return nil
	}
	return syms
}

// parseKallsyms reads kallsyms lines ("ADDRESS TYPE NAME [MODULE]",
// fields split by spaces or tabs) and maps each wanted name whose type is
// a function (t or T) to its module without the brackets.
func parseKallsyms(r io.Reader, wanted map[string]bool) (map[string]string, error) {
	syms := map[string]string{}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// No symbol line is this long: skip it whole.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			continue
		}
		var fields [4][]byte
		n := splitFields(line, &fields)
		if n >= 3 && len(fields[1]) == 1 && (fields[1][0] == 't' || fields[1][0] == 'T') && wanted[string(fields[2])] {
			mod := ""
			if n == 4 {
				mod = string(bytes.Trim(fields[3], "[]"))
			}
			syms[string(fields[2])] = mod
		}
		switch {
		case errors.Is(err, io.EOF):
			return syms, nil
		case err != nil:
			return nil, err
		}
	}
}

// splitFields puts up to four whitespace-separated fields of line into
// out, as strings.Fields would split it, and returns how many.
func splitFields(line []byte, out *[4][]byte) int {
	n := 0
	for i := 0; i < len(line) && n < len(out); {
		for i < len(line) && isSpace(line[i]) {
			i++
		}
		start := i
		for i < len(line) && !isSpace(line[i]) {
			i++
		}
		if i > start {
			out[n] = line[start:i]
			n++
		}
	}
	return n
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}
