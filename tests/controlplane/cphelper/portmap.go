package cphelper

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"
)

// PortmapModule is where the real portmap CNI plugin comes from. It is
// built with `go install pkg@version`, outside any module of this
// repository, so the product's go.mod never requires it.
const PortmapModule = "github.com/containernetworking/plugins"

const portmapPkg = PortmapModule + "/plugins/meta/portmap"

// PortmapVersions are the releases the tests run, one of each nftables
// shape: v1.10.0 guards its prerouting jump with `fib daddr type local`
// (since v1.9.0); v1.8.0 jumps to hostports for every destination (v1.6.1
// to v1.8.x; the module proxy serves v1.8.0 but refuses v1.8.1).
var PortmapVersions = []string{"v1.10.0", "v1.8.0"}

var (
	portmapMu    sync.Mutex
	portmapBuilt = map[string]string{}
)

// A version becomes a directory name and an argument of go install: only
// plain release tags are accepted.
var releaseTag = regexp.MustCompile(`^v\d+\.\d+\.\d+$`)

// EnsurePortmap builds the portmap plugin of the given release into the
// binary cache (portmap-VERSION/portmap) unless a build with the same stamp
// is already there, and returns its path. The first build on a machine
// needs the Go module proxy. It is safe to call from several test processes
// at once (a file lock per version); logf reports progress.
func EnsurePortmap(version string, logf func(format string, args ...any)) (string, error) {
	if !releaseTag.MatchString(version) {
		return "", fmt.Errorf("portmap version %q: want a release tag like v1.10.0", version)
	}
	portmapMu.Lock()
	defer portmapMu.Unlock()
	if p, ok := portmapBuilt[version]; ok {
		return p, nil
	}
	p, err := ensurePortmap(version, logf)
	if err != nil {
		return "", err
	}
	portmapBuilt[version] = p
	return p, nil
}

func ensurePortmap(version string, logf func(format string, args ...any)) (string, error) {
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	cache, err := cacheDir(src)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "portmap-"+version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create portmap cache: %w", err)
	}
	bin := filepath.Join(dir, "portmap")
	// What `portmap` prints when run without CNI_COMMAND; plain go install
	// leaves "version unknown". Release builds also set CGO_ENABLED=0.
	ldflags := "-X " + PortmapModule + "/pkg/utils/buildversion.BuildVersion=" + version
	h := sha256.New()
	// A module version on the proxy is immutable (go.sum checks it), so the
	// version, toolchain and flags decide the binary.
	fmt.Fprintf(h, "%s@%s\n%s\n%s/%s\nCGO_ENABLED=0\n%s\n", portmapPkg, version, runtime.Version(), runtime.GOOS, runtime.GOARCH, ldflags)
	stamp := hex.EncodeToString(h.Sum(nil))

	unlock, err := lockFile(filepath.Join(dir, ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()

	stampFile := filepath.Join(dir, "stamp")
	if old, err := os.ReadFile(stampFile); err == nil && string(old) == stamp && exists(bin) {
		return bin, nil
	}
	gobin, err := goCommand()
	if err != nil {
		return "", err
	}
	// A half-written stamp must never vouch for a failed build.
	if err := os.Remove(stampFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("remove portmap stamp: %w", err)
	}
	tmp := filepath.Join(dir, ".gobin")
	if err := os.RemoveAll(tmp); err != nil {
		return "", fmt.Errorf("clear portmap build dir: %w", err)
	}
	start := time.Now()
	logf("cphelper: building portmap %s into %s", version, dir)
	cmd := exec.Command(gobin, "install", "-ldflags="+ldflags, portmapPkg+"@"+version)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GOBIN="+tmp,
		"GOWORK=off",
		"CGO_ENABLED=0",
		// The stamp names this toolchain: a release whose go.mod asks for
		// a newer Go must fail here, not be built by a downloaded one.
		"GOTOOLCHAIN=local",
	)
	if os.Getenv("TRACER_VM") != "" {
		proxy, err := moduleCacheProxy(gobin, version)
		if err != nil {
			return "", err
		}
		cmd.Env = append(cmd.Env, "GOPROXY="+proxy)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s@%s (with %s): %w\n%s", portmapPkg, version, runtime.Version(), err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "portmap"), bin); err != nil {
		return "", fmt.Errorf("install portmap %s: %w", version, err)
	}
	if err := os.RemoveAll(tmp); err != nil {
		return "", fmt.Errorf("clear portmap build dir: %w", err)
	}
	logf("cphelper: built portmap %s in %s", version, time.Since(start).Round(time.Second))
	if err := os.WriteFile(stampFile, []byte(stamp), 0o644); err != nil {
		return "", fmt.Errorf("write portmap stamp: %w", err)
	}
	return bin, nil
}

// moduleCacheProxy is the module cache's download directory as a GOPROXY.
// A tests/vm guest has no network card but sees the host's module cache,
// which holds the release once the host has built or fetched it; asking
// the network proxy first would fail on lookups the cache cannot answer
// (the package path tried as a module, the latest version for its
// deprecation notice) instead of falling back.
func moduleCacheProxy(gobin, version string) (string, error) {
	out, err := exec.Command(gobin, "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("find the module cache for an offline portmap build: %w", err)
	}
	dl := filepath.Join(strings.TrimSpace(string(out)), "cache", "download")
	if !exists(dl) {
		return "", fmt.Errorf("offline portmap build: no module cache at %s: fetch the release on the host first (go mod download %s@%s)", dl, PortmapModule, version)
	}
	return "file://" + dl, nil
}
