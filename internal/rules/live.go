package rules

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Runner runs a read-only command and returns its standard output. It is a
// variable of ReadLive's callers so tests (and `--netns`, which wraps the
// command in `ip netns exec` or setns) need no root.
type Runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// ExecRunner runs the command with os/exec; stderr goes into the error.
func ExecRunner(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg != "" {
			return nil, fmt.Errorf("run %s: %w: %s", name, err, msg)
		}
		return nil, fmt.Errorf("run %s: %w", name, err)
	}
	return out, nil
}

// LiveTables are the tables ReadLive reads.
var LiveTables = []string{"raw", "mangle", "nat", "filter"}

// ReadLive reads the node's current rules for one family with iptables-save
// or ip6tables-save, one `-t TABLE` call per table in tables (LiveTables if
// nil). It only reads: iptables-save never changes rules.
//
// A table the kernel does not have is left out rather than failing the
// read (iptables-legacy exits non-zero for it, iptables-nft prints
// nothing); callers see it missing from Ruleset.Tables. The read fails only
// when no table could be read at all.
//
// On iptables-legacy, naming a table with -t asks the kernel for it, which
// can autoload its module (iptable_raw, ...) and instantiate the empty
// table in the namespace. To change nothing, ReadLive first asks which
// tables exist (/proc/net/ip_tables_names via listTables) and only reads
// those when the command is iptables-legacy.
func ReadLive(ctx context.Context, run Runner, family Family, tables []string) (*Ruleset, error) {
	if run == nil {
		run = ExecRunner
	}
	if tables == nil {
		tables = LiveTables
	}
	cmd := "iptables-save"
	if family == IPv6 {
		cmd = "ip6tables-save"
	}
	if existing, ok := legacyTables(ctx, run, cmd, family); ok {
		var keep []string
		for _, t := range tables {
			if existing[t] {
				keep = append(keep, t)
			}
		}
		tables = keep
	}
	rs := &Ruleset{Family: family, Tables: map[string]*Table{}}
	var errs []string
	read := 0
	for _, t := range tables {
		out, err := run(ctx, cmd, "-t", t)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		part, err := ParseSave(bytes.NewReader(out), family)
		if err != nil {
			return nil, fmt.Errorf("read live %s rules: %w", family, err)
		}
		for name, tab := range part.Tables {
			rs.Tables[name] = tab
		}
		read++
	}
	if read == 0 && len(errs) > 0 {
		return nil, fmt.Errorf("read live %s rules: %s", family, strings.Join(errs, "; "))
	}
	return rs, nil
}

// legacyTables returns the tables that exist when cmd is iptables-legacy,
// from /proc/net/ip_tables_names (ip6_tables_names). ok is false for
// iptables-nft, where naming a missing table creates nothing and the proc
// file says nothing about the nft tables, or when the file cannot be read.
func legacyTables(ctx context.Context, run Runner, cmd string, family Family) (map[string]bool, bool) {
	ver, err := run(ctx, cmd, "--version")
	if err != nil || !bytes.Contains(ver, []byte("legacy")) {
		return nil, false
	}
	file := "/proc/net/ip_tables_names"
	if family == IPv6 {
		file = "/proc/net/ip6_tables_names"
	}
	// Read through the runner so that a --netns runner reads the proc
	// file of the observed namespace.
	out, err := run(ctx, "cat", file)
	if err != nil {
		return nil, false
	}
	m := map[string]bool{}
	for _, l := range strings.Fields(string(out)) {
		m[l] = true
	}
	return m, true
}

// ReadLiveIPSets reads every ipset with `ipset save` into a MemNode's sets.
func ReadLiveIPSets(ctx context.Context, run Runner) (map[string]*IPSet, error) {
	if run == nil {
		run = ExecRunner
	}
	out, err := run(ctx, "ipset", "save")
	if err != nil {
		return nil, fmt.Errorf("read live ipsets: %w", err)
	}
	sets, err := ParseIPSetSave(bytes.NewReader(out))
	if err != nil {
		return nil, fmt.Errorf("read live ipsets: %w", err)
	}
	return sets, nil
}
