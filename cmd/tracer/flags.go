package main

import (
	"errors"
	"flag"
	"io"
)

// errHelp is returned when -h was asked for: usage was printed, exit 0.
var errHelp = errors.New("help requested")

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("tracer "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args and maps flag errors to usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return usageError{err}
	}
	if fs.NArg() > 0 && fs.Name() != "tracer replay" && fs.Name() != "tracer lab" {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}
