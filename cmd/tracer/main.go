// Command tracer explains the NAT, IPVS, REJECT, reset and drop decisions
// a Kubernetes node's kernel makes. See README.md and docs/.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand. run parses its own flags from args and does
// the work; it returns a usageError for bad input (exit 2).
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is filled by each subcommand's file in init, so adding a command
// touches one file.
var commands = map[string]command{}

// usageError marks bad usage or bad input: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

func main() {
	if name, ok := asIPTablesSave(); ok {
		os.Exit(runIPTablesWrapper(name, os.Args[1:]))
	}
	os.Exit(runMain(asKubectlPlugin(os.Args[1:])))
}

// runMain is the process: SIGINT and SIGTERM cancel the command, which
// detaches and completes its files before the exit code is returned.
func runMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return dispatch(ctx, args, os.Stdout, os.Stderr)
}

// dispatch picks the subcommand (default: ui) and maps its error to an exit
// code: 0 success, 1 runtime failure, 2 bad usage or input.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := "ui"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	if name == "help" {
		printUsage(stdout)
		return 0
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "tracer: unknown command %q\n\n", name)
		printUsage(stderr)
		return 2
	}
	err := cmd.run(ctx, args, stdout, stderr)
	return exitCode(err, stderr)
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, errHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "tracer: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: tracer [COMMAND] [FLAGS]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'tracer COMMAND -h' for a command's flags.")
}
