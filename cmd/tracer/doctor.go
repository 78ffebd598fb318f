package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"golang.org/x/sys/unix"

	"github.com/tracer-dev/tracer/internal/event"
	"github.com/tracer-dev/tracer/internal/live"
	"github.com/tracer-dev/tracer/internal/loader"
	"github.com/tracer-dev/tracer/internal/trace"
)

func init() {
	commands["doctor"] = command{
		summary: "kernel, BTF, and for every hook the attach method it will use, or why none",
		run:     runDoctor,
	}
}

// doctorReport is what doctor prints (and -o json emits).
type doctorReport struct {
	Kernel string       `json:"kernel"`
	BTF    bool         `json:"btf"`
	Hooks  []trace.Hook `json:"hooks"`
	Error  string       `json:"error,omitempty"`
}

func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("doctor", stderr)
	output := fs.String("o", "text", "output format: text or json")
	only := fs.String("only", "", "try only these attach methods, comma-separated (fentry,kprobe,tracepoint,netfilter)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *output != "text" && *output != "json" {
		return usagef("-o %q: want text or json", *output)
	}
	vias, err := parseVias(*only)
	if err != nil {
		return err
	}
	rep := doctorReport{Kernel: live.KernelRelease()}
	_, statErr := os.Stat("/sys/kernel/btf/vmlinux")
	rep.BTF = statErr == nil
	if err := preflight(loader.Needs{}); err != nil {
		return err
	}
	// The conntrack trackers of `tracer trace` ask for the ends of their
	// namespace's entries: show how they would get them here.
	cfg := loader.Config{Only: vias}
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/net", &st) == nil {
		cfg.ConntrackNetns = []uint32{uint32(st.Ino)}
	}
	t, err := loader.Open(cfg)
	if t != nil {
		rep.Hooks = live.HookRecords(t.Plan)
		if cerr := t.Close(); cerr != nil {
			return fmt.Errorf("detach: %w", cerr)
		}
	}
	if err != nil {
		rep.Error = err.Error()
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if eerr := enc.Encode(rep); eerr != nil {
			return eerr
		}
	} else {
		printDoctor(stdout, rep, err)
	}
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	return nil
}

func printDoctor(w io.Writer, rep doctorReport, err error) {
	fmt.Fprintf(w, "kernel  %s\n", rep.Kernel)
	btf := "present (/sys/kernel/btf/vmlinux)"
	if !rep.BTF {
		btf = "MISSING: tracer needs CONFIG_DEBUG_INFO_BTF"
	}
	fmt.Fprintf(w, "BTF     %s\n", btf)
	if err != nil {
		fmt.Fprintf(w, "\n%v\n", err)
		return
	}
	n := 0
	for _, h := range rep.Hooks {
		if h.Via != "none" {
			n++
		}
	}
	fmt.Fprintf(w, "hooks   %d of %d attach\n\n", n, len(rep.Hooks))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOOK\tVIA\tTARGET\tWHY NOT BETTER / WHY NONE")
	for _, h := range rep.Hooks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Hook, h.Via, h.Target, h.Error)
	}
	tw.Flush()
}

func parseVias(s string) ([]event.Via, error) {
	if s == "" {
		return nil, nil
	}
	var out []event.Via
	for _, name := range strings.Split(s, ",") {
		found := false
		for v := event.ViaFentry; v <= event.ViaNetfilter; v++ {
			if v.String() == strings.TrimSpace(name) {
				out = append(out, v)
				found = true
			}
		}
		if !found {
			return nil, usagef("--only: unknown attach method %q (want fentry, kprobe, tracepoint or netfilter)", name)
		}
	}
	return out, nil
}

// preflight maps missing BTF or privileges to exit code 2.
func preflight(n loader.Needs) error {
	if err := loader.Preflight(n); err != nil {
		if errors.Is(err, loader.ErrNoBTF) || errors.Is(err, loader.ErrNoPrivilege) {
			return usageError{err}
		}
		return err
	}
	return nil
}
