package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The binaries the tracer runs to read a node's state, as Debian installs
// them (packages iptables, ipset, nftables).
var hostBinaries = []string{"/usr/sbin/xtables-legacy-multi", "/usr/sbin/xtables-nft-multi", "/usr/sbin/ipset", "/usr/sbin/nft"}

// hostDirs are copied whole: iptables's match and target extensions,
// which iptables-save loads to print a rule.
var hostDirs = []string{"/usr/lib/x86_64-linux-gnu/xtables"}

// hostFiles: iptables prints protocols and ports by name from these, as
// the node's own iptables-save does (the tracer parses rules as printed).
var hostFiles = []string{"/etc/protocols", "/etc/services", "/etc/ethertypes"}

// links are the image's names for its binaries: the save commands of
// each backend are their multi-call binary; iptables-save and
// ip6tables-save are the tracer, which picks the backend the node uses;
// kubectl-tracer is the tracer as a kubectl plugin.
var links = map[string]string{
	"/usr/sbin/iptables-legacy-save":  "xtables-legacy-multi",
	"/usr/sbin/ip6tables-legacy-save": "xtables-legacy-multi",
	"/usr/sbin/iptables-nft-save":     "xtables-nft-multi",
	"/usr/sbin/ip6tables-nft-save":    "xtables-nft-multi",
	"/usr/sbin/iptables-save":         "/usr/local/bin/tracer",
	"/usr/sbin/ip6tables-save":        "/usr/local/bin/tracer",
	"/usr/local/bin/kubectl-tracer":   "tracer",
}

const tracerPath = "/usr/local/bin/tracer"

func run(o options) error {
	if o.binary == "" || o.out == "" {
		return usageError{fmt.Errorf("-binary and -out are required")}
	}
	tools, err := toolsLayer()
	if err != nil {
		return err
	}
	tracer, err := tracerLayer(o.binary)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, tools, tracer)
	if err != nil {
		return fmt.Errorf("assemble image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config = v1.Config{
		Entrypoint: []string{tracerPath},
		Cmd:        []string{"agent"},
		Env:        []string{"PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels:     map[string]string{"org.opencontainers.image.source": "https://github.com/tracer-dev/tracer"},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	tag, err := name.NewTag(o.tag)
	if err != nil {
		return usageError{fmt.Errorf("-tag %q: %w", o.tag, err)}
	}
	if err := tarball.WriteToFile(o.out, tag, img); err != nil {
		return fmt.Errorf("write %s: %w", o.out, err)
	}
	if o.rootfs != "" {
		return unpack(o.out, tag, o.rootfs)
	}
	return nil
}

// layerBuilder collects a layer's entries, directories made on the way.
type layerBuilder struct {
	buf  bytes.Buffer
	tw   *tar.Writer
	seen map[string]bool
}

func newLayer() *layerBuilder {
	l := &layerBuilder{seen: map[string]bool{}}
	l.tw = tar.NewWriter(&l.buf)
	return l
}

func (l *layerBuilder) dirs(p string) error {
	for d := path.Dir(p); d != "/" && !l.seen[d]; d = path.Dir(d) {
		if err := l.dirs(d); err != nil {
			return err
		}
		l.seen[d] = true
		if err := l.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
	}
	return nil
}

// file adds the content of src (symlinks followed) at p.
func (l *layerBuilder) file(p, src string) error {
	if l.seen[p] {
		return nil
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := l.dirs(p); err != nil {
		return err
	}
	l.seen[p] = true
	h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: int64(st.Mode().Perm()), Size: int64(len(data)), ModTime: time.Unix(0, 0)}
	if err := l.tw.WriteHeader(h); err != nil {
		return err
	}
	_, err = l.tw.Write(data)
	return err
}

// object adds the executable or library src at p, and the shared
// libraries it loads at their own paths.
func (l *layerBuilder) object(p, src string) error {
	if err := l.file(p, src); err != nil {
		return err
	}
	libs, err := sharedLibraries(src)
	if err != nil {
		return err
	}
	for _, lib := range libs {
		if err := l.file(lib, lib); err != nil {
			return err
		}
	}
	return nil
}

func (l *layerBuilder) link(p, target string) error {
	if err := l.dirs(p); err != nil {
		return err
	}
	l.seen[p] = true
	return l.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(p, "/"), Linkname: target, Mode: 0o777, ModTime: time.Unix(0, 0)})
}

func (l *layerBuilder) layer() (v1.Layer, error) {
	if err := l.tw.Close(); err != nil {
		return nil, err
	}
	data := l.buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// toolsLayer: the host's binaries, their libraries, extensions and files.
func toolsLayer() (v1.Layer, error) {
	l := newLayer()
	objects := slices.Clone(hostBinaries)
	for _, d := range hostDirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				objects = append(objects, p)
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("read %s (is the iptables package installed?): %w", d, err)
		}
	}
	for _, obj := range objects {
		if err := l.object(obj, obj); err != nil {
			return nil, err
		}
	}
	for _, f := range hostFiles {
		if _, err := os.Stat(f); err == nil {
			if err := l.file(f, f); err != nil {
				return nil, err
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(links)) {
		if !strings.HasPrefix(p, "/usr/local/") {
			if err := l.link(p, links[p]); err != nil {
				return nil, err
			}
		}
	}
	return l.layer()
}

// tracerLayer: the tracer binary, its libraries (a cgo build links
// glibc), and its kubectl plugin name.
func tracerLayer(binary string) (v1.Layer, error) {
	l := newLayer()
	if err := l.object(tracerPath, binary); err != nil {
		return nil, err
	}
	if err := l.link("/usr/local/bin/kubectl-tracer", links["/usr/local/bin/kubectl-tracer"]); err != nil {
		return nil, err
	}
	return l.layer()
}

var lddPath = regexp.MustCompile(`(?m)(?:=> )?(/\S+) \(0x`)

// sharedLibraries lists what the dynamic loader maps for obj, the loader
// itself included; nothing for a static binary.
func sharedLibraries(obj string) ([]string, error) {
	out, err := exec.Command("ldd", obj).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) || bytes.Contains(out, []byte("statically linked")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", obj, err, out)
	}
	var libs []string
	for _, m := range lddPath.FindAllSubmatch(out, -1) {
		libs = append(libs, string(m[1]))
	}
	if bytes.Contains(out, []byte("not found")) {
		return nil, fmt.Errorf("ldd %s: a library is missing: %s", obj, out)
	}
	return libs, nil
}
