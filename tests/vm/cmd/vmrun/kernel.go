package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// series describes one kernel line of the matrix: which Debian release ships it
// and which binary package names belong to it.
type series struct {
	Name  string         // "5.10", "6.1", "6.12"
	Dist  string         // Debian release that carries it
	Match *regexp.Regexp // binary package names of this series (generic amd64 flavour)
}

var allSeries = []series{
	{Name: "5.10", Dist: "bullseye", Match: regexp.MustCompile(`^linux-image-5\.10\.0-[0-9]+-amd64$`)},
	{Name: "6.1", Dist: "bookworm", Match: regexp.MustCompile(`^linux-image-6\.1\.0-[0-9]+-amd64$`)},
	{Name: "6.12", Dist: "bookworm", Match: regexp.MustCompile(`^linux-image-6\.12\.[0-9]+\+deb12-amd64$`)},
}

func lookupSeries(name string) (series, error) {
	for _, s := range allSeries {
		if s.Name == name {
			return s, nil
		}
	}
	return series{}, fmt.Errorf("unknown kernel series %q (known: 5.10, 6.1, 6.12)", name)
}

// kernel is an extracted Debian kernel package in the cache.
type kernel struct {
	Series  string
	Package string // e.g. linux-image-6.1.0-57-amd64
	Release string // uname -r, e.g. 6.1.0-57-amd64
	Root    string // extraction root (holds boot/ and lib/modules/)
	Vmlinuz string
	Modules string // directory holding <Release>/ (the modules share)
}

// listsMaxAge is how long resolved package lists are trusted before the
// runner looks for a newer kernel again.
const listsMaxAge = 24 * time.Hour

// ensureKernel returns the newest kernel of the series, downloading and
// extracting it into cacheDir when it is not cached yet. When the package
// lists cannot be refreshed (no network) a kernel cached earlier is used.
func ensureKernel(cacheDir string, s series, logf func(string, ...any)) (*kernel, error) {
	pointer := filepath.Join(cacheDir, "kernels", s.Name+".package")
	cached := func() (*kernel, error) {
		b, err := os.ReadFile(pointer)
		if err != nil {
			return nil, err
		}
		return loadKernel(cacheDir, s.Name, strings.TrimSpace(string(b)))
	}

	a, err := newAptEnv(cacheDir, s.Dist)
	if err != nil {
		return nil, err
	}
	if a.fresh() {
		// Lists resolved within listsMaxAge: the cached choice still stands.
		if k, err := cached(); err == nil {
			return k, nil
		}
	} else {
		start := time.Now()
		if err := a.update(); err != nil {
			if k, cerr := cached(); cerr == nil {
				logf("warning: %v; using cached %s", err, k.Package)
				return k, nil
			}
			return nil, err
		}
		logf("apt lists for %s refreshed in %s", s.Dist, since(start))
	}
	pkg, version, err := a.newest(s.Match)
	if err != nil {
		if k, cerr := cached(); cerr == nil {
			logf("warning: %v; using cached %s", err, k.Package)
			return k, nil
		}
		return nil, fmt.Errorf("resolve newest %s kernel: %w", s.Name, err)
	}
	if k, err := loadKernel(cacheDir, s.Name, pkg); err == nil {
		return k, writeFileAtomic(pointer, []byte(pkg+"\n"))
	}

	logf("fetching %s %s", pkg, version)
	start := time.Now()
	debDir := filepath.Join(cacheDir, "debs")
	if err := os.MkdirAll(debDir, 0o755); err != nil {
		return nil, fmt.Errorf("create deb cache: %w", err)
	}
	deb, err := a.download(pkg, debDir)
	if err != nil {
		return nil, err
	}
	dlTime := time.Since(start)
	start = time.Now()
	root := filepath.Join(cacheDir, "kernels", pkg)
	if err := os.RemoveAll(root); err != nil {
		return nil, fmt.Errorf("clean %s: %w", root, err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", root, err)
	}
	if err := run("", "dpkg-deb", "-x", deb, root); err != nil {
		return nil, fmt.Errorf("extract %s: %w", deb, err)
	}
	// Newer packages install modules under usr/lib; depmod -b and the guest
	// both look in lib/modules.
	if _, err := os.Stat(filepath.Join(root, "lib")); errors.Is(err, fs.ErrNotExist) {
		if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
			return nil, fmt.Errorf("link lib in %s: %w", root, err)
		}
	}
	release, err := releaseOf(root)
	if err != nil {
		return nil, err
	}
	if err := run("", "depmod", "-b", root, release); err != nil {
		return nil, fmt.Errorf("depmod %s: %w", release, err)
	}
	if err := os.WriteFile(filepath.Join(root, ".ready"), []byte(release+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("mark %s ready: %w", root, err)
	}
	// The .deb is not needed once extracted.
	_ = os.Remove(deb)
	logf("downloaded %s in %s, extracted and depmod in %s", filepath.Base(deb), dlTime.Round(100*time.Millisecond), since(start))
	if err := writeFileAtomic(pointer, []byte(pkg+"\n")); err != nil {
		return nil, err
	}
	return loadKernel(cacheDir, s.Name, pkg)
}

func loadKernel(cacheDir, seriesName, pkg string) (*kernel, error) {
	root := filepath.Join(cacheDir, "kernels", pkg)
	b, err := os.ReadFile(filepath.Join(root, ".ready"))
	if err != nil {
		return nil, fmt.Errorf("kernel %s not cached: %w", pkg, err)
	}
	release := strings.TrimSpace(string(b))
	k := &kernel{
		Series:  seriesName,
		Package: pkg,
		Release: release,
		Root:    root,
		Vmlinuz: filepath.Join(root, "boot", "vmlinuz-"+release),
		Modules: filepath.Join(root, "lib", "modules"),
	}
	if _, err := os.Stat(k.Vmlinuz); err != nil {
		return nil, fmt.Errorf("kernel %s: %w", pkg, err)
	}
	if real, err := filepath.EvalSymlinks(k.Modules); err == nil {
		k.Modules = real
	}
	return k, nil
}

func releaseOf(root string) (string, error) {
	m, err := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if err != nil || len(m) != 1 {
		return "", fmt.Errorf("find vmlinuz in %s: found %d candidates", root, len(m))
	}
	return strings.TrimPrefix(filepath.Base(m[0]), "vmlinuz-"), nil
}

// aptEnv is a private apt configuration: its own sources list, package lists
// and caches, so the system's apt state is neither read nor changed.
type aptEnv struct {
	dir     string
	dist    string
	options []string
}

func newAptEnv(cacheDir, dist string) (*aptEnv, error) {
	dir := filepath.Join(cacheDir, "apt", dist)
	for _, d := range []string{"lists/partial", "cache/archives/partial", "parts", "prefs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("create apt dir: %w", err)
		}
	}
	mirrors, err := hostMirrors("/etc/apt")
	if err != nil {
		return nil, err
	}
	list := sourcesList(mirrors, dist)
	sl := filepath.Join(dir, "sources.list")
	if old, err := os.ReadFile(sl); err != nil || !bytes.Equal(old, []byte(list)) {
		if err := writeFileAtomic(sl, []byte(list)); err != nil {
			return nil, err
		}
		// A changed list invalidates the downloaded indexes.
		_ = os.Remove(filepath.Join(dir, "lists", ".updated"))
	}
	opts := []string{
		"-o", "Dir::Etc::SourceList=" + sl,
		"-o", "Dir::Etc::SourceParts=" + filepath.Join(dir, "parts"),
		"-o", "Dir::Etc::PreferencesParts=" + filepath.Join(dir, "prefs"),
		"-o", "Dir::State::Lists=" + filepath.Join(dir, "lists"),
		"-o", "Dir::State::status=/dev/null",
		"-o", "Dir::Cache=" + filepath.Join(dir, "cache"),
		"-o", "APT::Get::List-Cleanup=1",
		"-o", "Acquire::Languages=none",
		"-o", "Debug::NoLocking=1",
	}
	if os.Geteuid() == 0 {
		// Downloads go to directories the _apt sandbox user cannot write.
		opts = append(opts, "-o", "APT::Sandbox::User=root")
	}
	return &aptEnv{dir: dir, dist: dist, options: opts}, nil
}

func (a *aptEnv) fresh() bool {
	st, err := os.Stat(filepath.Join(a.dir, "lists", ".updated"))
	return err == nil && time.Since(st.ModTime()) < listsMaxAge
}

func (a *aptEnv) update() error {
	args := append(append([]string{}, a.options...), "-q", "update")
	out, err := exec.Command("apt-get", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("apt-get update (private %s lists): %w\n%s", a.dist, err, out)
	}
	return os.WriteFile(filepath.Join(a.dir, "lists", ".updated"), nil, 0o644)
}

// newest returns the newest package name matching re that has an installable
// version, with that version.
func (a *aptEnv) newest(re *regexp.Regexp) (string, string, error) {
	args := append(append([]string{}, a.options...), "pkgnames", "linux-image-")
	out, err := exec.Command("apt-cache", args...).Output()
	if err != nil {
		return "", "", fmt.Errorf("apt-cache pkgnames: %w", err)
	}
	var names []string
	for _, n := range strings.Fields(string(out)) {
		if re.MatchString(n) {
			names = append(names, n)
		}
	}
	sortNewestFirst(names)
	for _, n := range names {
		args := append(append([]string{}, a.options...), "madison", n)
		out, err := exec.Command("apt-cache", args...).Output()
		if err != nil {
			continue
		}
		// "pkg | version | source"
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Split(line, "|")
			if len(f) >= 3 && strings.TrimSpace(f[0]) == n {
				return n, strings.TrimSpace(f[1]), nil
			}
		}
	}
	return "", "", fmt.Errorf("no package matching %s in the %s lists", re, a.dist)
}

func (a *aptEnv) download(pkg, dir string) (string, error) {
	args := append(append([]string{}, a.options...), "-q", "download", pkg)
	cmd := exec.Command("apt-get", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get download %s: %w\n%s", pkg, err, out)
	}
	m, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(m) == 0 {
		return "", fmt.Errorf("apt-get download %s: no .deb written to %s", pkg, dir)
	}
	sort.Strings(m)
	return m[len(m)-1], nil
}

// sortNewestFirst orders kernel package names by the numbers in them,
// so linux-image-6.12.117+deb12-amd64 sorts before linux-image-6.12.99+deb12-amd64.
func sortNewestFirst(names []string) {
	num := regexp.MustCompile(`[0-9]+`)
	key := func(s string) []int {
		var k []int
		for _, d := range num.FindAllString(s, -1) {
			n, _ := strconv.Atoi(d)
			k = append(k, n)
		}
		return k
	}
	sort.SliceStable(names, func(i, j int) bool {
		a, b := key(names[i]), key(names[j])
		for x := 0; x < len(a) && x < len(b); x++ {
			if a[x] != b[x] {
				return a[x] > b[x]
			}
		}
		return len(a) > len(b)
	})
}

// mirrors are the Debian archive and security archive URIs the host uses.
type mirrors struct {
	Archive  string
	Security string
	SignedBy string
}

// hostMirrors reads the system's apt sources (one-line and deb822 format) and
// returns the Debian mirror in use, so the private lists reuse it.
func hostMirrors(etcApt string) (mirrors, error) {
	var m mirrors
	files := []string{filepath.Join(etcApt, "sources.list")}
	for _, pat := range []string{"*.list", "*.sources"} {
		g, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", pat))
		files = append(files, g...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var entries []aptEntry
		if strings.HasSuffix(f, ".sources") {
			entries = parseDeb822(string(b))
		} else {
			entries = parseOneLine(string(b))
		}
		for _, e := range entries {
			if !e.debian() {
				continue
			}
			for _, s := range e.Suites {
				if strings.HasSuffix(s, "-security") || strings.HasSuffix(s, "/updates") {
					if m.Security == "" {
						m.Security = e.URI
					}
				} else if m.Archive == "" {
					m.Archive = e.URI
				}
			}
		}
	}
	if m.Archive == "" {
		return m, fmt.Errorf("find the Debian mirror in %s: no deb entry for a Debian suite", etcApt)
	}
	if m.Security == "" {
		m.Security = strings.TrimSuffix(m.Archive, "/") + "-security"
	}
	if _, err := os.Stat("/usr/share/keyrings/debian-archive-keyring.gpg"); err == nil {
		m.SignedBy = "/usr/share/keyrings/debian-archive-keyring.gpg"
	}
	return m, nil
}

type aptEntry struct {
	Types  []string
	URI    string
	Suites []string
}

var debianSuite = regexp.MustCompile(`^(buster|bullseye|bookworm|trixie|forky|sid|stable|oldstable|testing|unstable)([-/].*)?$`)

func (e aptEntry) debian() bool {
	deb := false
	for _, t := range e.Types {
		deb = deb || t == "deb"
	}
	if !deb || e.URI == "" {
		return false
	}
	for _, s := range e.Suites {
		if debianSuite.MatchString(s) {
			return true
		}
	}
	return false
}

func parseOneLine(text string) []aptEntry {
	var out []aptEntry
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "#"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "" {
			continue
		}
		// Drop an options block: deb [arch=amd64 signed-by=...] uri suite comps
		if i := strings.Index(line, "["); i >= 0 {
			if j := strings.Index(line[i:], "]"); j >= 0 {
				line = line[:i] + line[i+j+1:]
			}
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		out = append(out, aptEntry{Types: []string{f[0]}, URI: f[1], Suites: []string{f[2]}})
	}
	return out
}

func parseDeb822(text string) []aptEntry {
	var out []aptEntry
	for _, para := range strings.Split(text, "\n\n") {
		var e aptEntry
		enabled := true
		for _, line := range strings.Split(para, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch strings.ToLower(strings.TrimSpace(k)) {
			case "types":
				e.Types = strings.Fields(v)
			case "uris":
				if f := strings.Fields(v); len(f) > 0 {
					e.URI = f[0]
				}
			case "suites":
				e.Suites = strings.Fields(v)
			case "enabled":
				enabled = strings.ToLower(v) != "no"
			}
		}
		if enabled && e.URI != "" {
			out = append(out, e)
		}
	}
	return out
}

func sourcesList(m mirrors, dist string) string {
	opt := ""
	if m.SignedBy != "" {
		opt = "[signed-by=" + m.SignedBy + "] "
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by tests/vm/cmd/vmrun from the host's apt mirror; private to the VM cache.\n")
	fmt.Fprintf(&b, "deb %s%s %s main\n", opt, m.Archive, dist)
	fmt.Fprintf(&b, "deb %s%s %s-updates main\n", opt, m.Archive, dist)
	fmt.Fprintf(&b, "deb %s%s %s-security main\n", opt, m.Security, dist)
	return b.String()
}

func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}

func run(dir, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, bytes.TrimSpace(out))
	}
	return nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }
