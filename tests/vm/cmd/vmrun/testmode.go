package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// testPkg is one Go package whose test binary runs in the guests.
type testPkg struct {
	ImportPath string
	Short      string // import path without the module prefix
	Dir        string
	Binary     string
}

// listTestPackages expands package patterns with go list and keeps the
// packages that have test files.
func listTestPackages(patterns []string) ([]testPkg, error) {
	args := append([]string{"list", "-e", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{len .TestGoFiles}}\t{{len .XTestGoFiles}}\t{{.Module.Path}}"}, patterns...)
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w\n%s", strings.Join(patterns, " "), err, stderr.Bytes())
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		logf("go list: %s", s)
	}
	var pkgs []testPkg
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			continue
		}
		if f[2] == "0" && f[3] == "0" {
			logf("%s: no test files, skipped", f[0])
			continue
		}
		short := strings.TrimPrefix(strings.TrimPrefix(f[0], f[4]), "/")
		if short == "" {
			short = f[0]
		}
		pkgs = append(pkgs, testPkg{ImportPath: f[0], Short: short, Dir: f[1]})
	}
	return pkgs, nil
}

func buildTestBinaries(pkgs []testPkg, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create test binary dir: %w", err)
	}
	for i := range pkgs {
		p := &pkgs[i]
		p.Binary = filepath.Join(dir, strings.ReplaceAll(p.Short, "/", "_")+".test")
		_ = os.Remove(p.Binary)
		cmd := exec.Command("go", "test", "-c", "-o", p.Binary, p.ImportPath)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go test -c %s: %w", p.ImportPath, err)
		}
	}
	return nil
}

// testBody is the guest shell code that runs every test binary in its
// package directory, streams its output and keeps it on the results share.
func testBody(pkgs []testPkg, run string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "run=%s\n", shellQuote(run))
	b.WriteString(`rc=0
run_pkg() {
	echo "=== vmrun package $1: $4"
	(cd "$2" && "$3" -test.v -test.count=1 ${run:+-test.run="$run"}) 2>&1 | tee "/vmresults/pkg-$1.log"
	s=${PIPESTATUS[0]}
	echo "$s" > "/vmresults/pkg-$1.status"
	echo "=== vmrun package $1: $4 exit status $s"
	[ "$s" = 0 ] || rc=1
}
`)
	for i, p := range pkgs {
		fmt.Fprintf(&b, "run_pkg %d %s %s %s\n", i, shellQuote(p.Dir), shellQuote(p.Binary), shellQuote(p.ImportPath))
	}
	b.WriteString("exit $rc\n")
	return b.String()
}

func testMode(ctx context.Context, o options) (int, error) {
	if err := checkTools(); err != nil {
		return 1, err
	}
	start := time.Now()
	pkgs, err := listTestPackages(o.args)
	if err != nil {
		return 1, err
	}
	if len(pkgs) == 0 {
		return 1, errNoTests
	}
	if err := buildTestBinaries(pkgs, filepath.Join(o.cache, "bin")); err != nil {
		return 1, err
	}
	logf("built %d test binaries in %s", len(pkgs), since(start))

	runs := bootAll(ctx, o, testBody(pkgs, o.run))
	m := newMatrix(o.kernels)
	failed := false
	for _, kr := range runs {
		if kr.err == nil {
			collect(m, kr.series, kr.dir, pkgs, kr.result)
		} else {
			m.note("kernel %s: %v", kr.series, firstLine(kr.err.Error()))
		}
		if kr.firstBoot != nil {
			m.note("kernel %s: panicked on its first boot (report below), booted once more: %s", kr.series, kr.result)
		}
		if kr.err != nil || !kr.result.OK() {
			failed = true
		}
	}
	if ctx.Err() != nil {
		m.note("interrupted")
	}

	fmt.Println()
	fmt.Println("VM test matrix (kernel × test):")
	m.write(os.Stdout)
	fmt.Printf("\nfull output per kernel: %s/<kernel>/pkg-N.log\n", filepath.Join(o.cache, "results"))
	for i, p := range pkgs {
		fmt.Printf("  pkg-%d: %s\n", i, p.ImportPath)
	}
	printTimings(os.Stdout, runs)
	pass, fail, skip := m.counts()
	if fail > 0 {
		failed = true
	}
	if f := m.failures(); len(f) > 0 {
		fmt.Println("\nfailed:")
		for _, line := range f {
			fmt.Println("  " + line)
		}
	}
	printCrashes(os.Stdout, runs)
	fmt.Printf("\nvm: %d passed, %d failed, %d skipped\n", pass, fail, skip)
	if failed {
		fmt.Println("vm: FAIL")
		return 1, nil
	}
	fmt.Println("vm: ok")
	return 0, nil
}

// bootAll runs body in a guest per kernel, o.parallel guests at a time.
// Under the privileged tests a TCG guest keeps its -smp 2 host cores
// busy: two guests at once on two cores took more than 30 minutes each
// where one alone took 27, so the default is one guest per two cores.
// Kernels are fetched and their initramfs built one at a time, in order,
// as the apt cache is shared; the runs come back in the order of
// o.kernels.
func bootAll(ctx context.Context, o options, body string) []*kernelRun {
	runs := make([]*kernelRun, 0, len(o.kernels))
	slots := make(chan struct{}, max(1, o.parallel))
	var wg sync.WaitGroup
	for _, name := range o.kernels {
		if ctx.Err() != nil {
			break
		}
		k, initrd, kr, err := prepare(o, name)
		runs = append(runs, kr)
		if err == nil {
			kr.dir, err = resultsDir(o, name)
		}
		var script string
		if err == nil {
			script, err = runScript(o, name, body)
		}
		if err != nil {
			kr.err = err
			continue
		}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			kr.result, kr.err = bootWith(ctx, o, k, initrd, kr.dir, script)
			logf("[%s] boot-to-result %s: %s", name, kr.result.Total.Round(100*time.Millisecond), kr.result)
			if kr.err != nil || !mayBootAgain(kr.result) || ctx.Err() != nil {
				return
			}
			first := kr.result
			kr.firstBoot = &first
			logf("[%s] the kernel panicked in a report that names no BPF code: booting it once more", name)
			if kr.dir, kr.err = resultsDir(o, name); kr.err == nil {
				kr.result, kr.err = bootWith(ctx, o, k, initrd, kr.dir, script)
				logf("[%s] second boot-to-result %s: %s", name, kr.result.Total.Round(100*time.Millisecond), kr.result)
			}
		}()
	}
	wg.Wait()
	return runs
}

// collect parses the logs the guest left in dir for every package.
func collect(m *matrix, kernelName, dir string, pkgs []testPkg, res bootResult) {
	if !res.OK() {
		m.note("kernel %s: %s", kernelName, res)
	}
	for i, p := range pkgs {
		logPath := filepath.Join(dir, fmt.Sprintf("pkg-%d.log", i))
		f, err := os.Open(logPath)
		if err != nil {
			m.add(kernelName, p.Short+" (package)", outcome{Status: "fail", Reason: "did not run: " + res.String()})
			continue
		}
		results, err := parseTestOutput(f)
		f.Close()
		if err != nil {
			m.note("kernel %s: %s: %v", kernelName, p.Short, err)
		}
		anyFail := false
		for _, r := range results {
			m.add(kernelName, p.Short+"."+r.Name, r.outcome)
			anyFail = anyFail || r.Status == "fail"
		}
		st, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("pkg-%d.status", i)))
		if err != nil {
			m.add(kernelName, p.Short+" (package)", outcome{Status: "fail", Reason: "test binary did not finish: " + res.String()})
			continue
		}
		code, _ := strconv.Atoi(strings.TrimSpace(string(st)))
		if code != 0 && !anyFail {
			// A panic outside a test, a failing TestMain or a crash.
			m.add(kernelName, p.Short+" (package)", outcome{Status: "fail", Reason: fmt.Sprintf("test binary exited %d without a failing test; see %s", code, logPath)})
		}
	}
}
