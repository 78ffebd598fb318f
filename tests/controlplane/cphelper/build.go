package cphelper

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"sync"
	"syscall"
	"time"
)

// CacheEnv overrides the directory the control-plane binaries are built
// into (default tests/controlplane/.cache/bin).
const CacheEnv = "TRACER_CP_CACHE"

// Binaries are the paths of the built control-plane programs, and of
// kube-proxy (not part of a control plane, but built from the same
// k8s.io/kubernetes module for the tests in tests/controlplane/kubeproxy).
type Binaries struct {
	Etcd      string
	APIServer string
	KubeProxy string
	// Kwok plays the kubelets of fake nodes (the cluster-mode test);
	// KwokStages is the node and pod lifecycle it is given, the one kwok
	// ships (printed by cmd/kwok-stages at build time).
	Kwok       string
	KwokStages string
}

var (
	buildOnce sync.Once
	buildBins Binaries
	buildErr  error
)

// sourceDir is tests/controlplane, found from this file's compiled path.
func sourceDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("locate cphelper source: runtime.Caller failed")
	}
	return filepath.Dir(filepath.Dir(file)), nil
}

// EnsureBinaries builds kube-apiserver, etcd and kube-proxy from the module in
// tests/controlplane/build unless the cache already holds binaries built
// from the same sources. It is safe to call from several test processes at
// once (a file lock serialises the build); logf reports progress.
func EnsureBinaries(logf func(format string, args ...any)) (Binaries, error) {
	buildOnce.Do(func() { buildBins, buildErr = ensureBinaries(logf) })
	return buildBins, buildErr
}

func ensureBinaries(logf func(format string, args ...any)) (Binaries, error) {
	src, err := sourceDir()
	if err != nil {
		return Binaries{}, err
	}
	mod := filepath.Join(src, "build")
	cache, err := cacheDir(src)
	if err != nil {
		return Binaries{}, err
	}
	bins := Binaries{
		Etcd:       filepath.Join(cache, "etcd"),
		APIServer:  filepath.Join(cache, "kube-apiserver"),
		KubeProxy:  filepath.Join(cache, "kube-proxy"),
		Kwok:       filepath.Join(cache, "kwok"),
		KwokStages: filepath.Join(cache, "kwok-stages.yaml"),
	}

	kube, err := kubeVersion(mod)
	if err != nil {
		return Binaries{}, err
	}
	// What `kube-apiserver --version`, `kube-proxy --version` and /version report; go build alone
	// leaves v0.0.0-master.
	ldflags := fmt.Sprintf("-X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=%s -X k8s.io/component-base/version.gitMinor=%s",
		kube.full, kube.major, kube.minor)
	stamp, err := sourceStamp(mod, ldflags)
	if err != nil {
		return Binaries{}, err
	}
	unlock, err := lockFile(filepath.Join(cache, ".lock"))
	if err != nil {
		return Binaries{}, err
	}
	defer unlock()

	stampFile := filepath.Join(cache, "stamp")
	if old, err := os.ReadFile(stampFile); err == nil && string(old) == stamp && exists(bins.Etcd) && exists(bins.APIServer) && exists(bins.KubeProxy) && exists(bins.Kwok) && exists(bins.KwokStages) {
		return bins, nil
	}
	if os.Getenv("TRACER_VM") != "" {
		// A tests/vm guest has no network card and emulates its CPUs:
		// linking kube-apiserver there takes far longer than the tests
		// (30-95 s warm on the host), so the host builds and the guest
		// finds the result through the shared root.
		return Binaries{}, fmt.Errorf("control-plane binaries in %s missing or stale in the VM guest: build them on the host first (make cp-bin)", cache)
	}
	gobin, err := goCommand()
	if err != nil {
		return Binaries{}, err
	}
	// A half-written stamp must never vouch for a failed build.
	if err := os.Remove(stampFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Binaries{}, fmt.Errorf("remove build stamp: %w", err)
	}
	for _, b := range []struct{ pkg, out string }{
		{"./cmd/etcd", bins.Etcd},
		{"./cmd/kube-apiserver", bins.APIServer},
		// After kube-apiserver it reuses most of its compiled packages:
		// about 11 s more on a cold cache (185 s alone).
		{"./cmd/kube-proxy", bins.KubeProxy},
		{"./cmd/kwok", bins.Kwok},
		{"./cmd/kwok-stages", bins.KwokStages + ".bin"},
	} {
		start := time.Now()
		logf("cphelper: building %s into %s (kube-apiserver takes minutes cold)", b.pkg, cache)
		cmd := exec.Command(gobin, "build", "-ldflags="+ldflags, "-o", b.out+".tmp", b.pkg)
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
		if err := os.Rename(b.out+".tmp", b.out); err != nil {
			return Binaries{}, fmt.Errorf("install %s: %w", b.out, err)
		}
		logf("cphelper: built %s in %s", b.pkg, time.Since(start).Round(time.Second))
	}
	stages, err := exec.Command(bins.KwokStages + ".bin").Output()
	if err != nil {
		return Binaries{}, fmt.Errorf("print kwok's stages: %w", err)
	}
	if err := os.WriteFile(bins.KwokStages, stages, 0o644); err != nil {
		return Binaries{}, fmt.Errorf("write kwok's stages: %w", err)
	}
	if err := os.WriteFile(stampFile, []byte(stamp), 0o644); err != nil {
		return Binaries{}, fmt.Errorf("write build stamp: %w", err)
	}
	return bins, nil
}

// cacheDir is where built binaries live: $TRACER_CP_CACHE, or
// tests/controlplane/.cache/bin (gitignored) under src.
func cacheDir(src string) (string, error) {
	cache := os.Getenv(CacheEnv)
	if cache == "" {
		cache = filepath.Join(src, ".cache", "bin")
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("create binary cache: %w", err)
	}
	return cache, nil
}

// lockFile takes an exclusive flock on path, so test processes started in
// parallel (go test runs packages at once) build each binary only once.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open build lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("take build lock %s: %w", path, err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

type version struct{ full, major, minor string }

var kubeRequire = regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v(\d+)\.(\d+)\.\S+)`)

// kubeVersion is the k8s.io/kubernetes version the build module requires.
func kubeVersion(mod string) (version, error) {
	data, err := os.ReadFile(filepath.Join(mod, "go.mod"))
	if err != nil {
		return version{}, fmt.Errorf("read build module: %w", err)
	}
	m := kubeRequire.FindSubmatch(data)
	if m == nil {
		return version{}, fmt.Errorf("read build module: no k8s.io/kubernetes requirement in %s/go.mod", mod)
	}
	return version{full: string(m[1]), major: string(m[2]), minor: string(m[3])}, nil
}

// sourceStamp hashes everything that decides the binaries: go.mod, go.sum,
// the mains, the Go version and the linker flags.
func sourceStamp(mod, ldflags string) (string, error) {
	var files []string
	err := filepath.WalkDir(mod, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (filepath.Ext(p) == ".go" || d.Name() == "go.mod" || d.Name() == "go.sum") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("list build module %s: %w", mod, err)
	}
	sort.Strings(files)
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", runtime.Version(), ldflags)
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			return "", fmt.Errorf("hash build module: %w", err)
		}
		rel, _ := filepath.Rel(mod, p)
		fmt.Fprintf(h, "%s\n", rel)
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("hash %s: %w", p, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func goCommand() (string, error) {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); exists(p) {
		return p, nil
	}
	p, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("find the go command to build the control plane: %w", err)
	}
	return p, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
