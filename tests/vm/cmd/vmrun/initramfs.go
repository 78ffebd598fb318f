package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// bootModules are what the initramfs needs before it can reach the host's
// root filesystem: virtio PCI transport, 9p over virtio, and overlayfs.
// Their dependencies are resolved from modules.dep.
var bootModules = []string{"virtio_pci", "9pnet_virtio", "9p", "overlay"}

// initScript is /init of the initramfs (busybox sh). It loads the modules
// listed in /modules.order, mounts the host root read-only under a tmpfs
// overlay, the kernel's modules and the results share, and runs
// /vmresults/run.sh chrooted into that root. The exit status goes to the
// results share and the console, then the guest powers off.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /lower /rw /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec 0</dev/console 1>/dev/console 2>&1
halt() {
	echo "TRACER_VM_EXIT=$1"
	sync
	echo o > /proc/sysrq-trigger
	sleep 60
}
fail() {
	echo "vm-init: $*"
	halt init-failed
}
for m in $(cat /modules.order); do
	insmod "/modules/$m" || fail "insmod $m"
done
O=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o $O,ro,cache=loose hostroot /lower || fail "mount host root over 9p"
mount -t tmpfs -o mode=0755 tmpfs /rw || fail "mount tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot || fail "mount overlay root"
mkdir -p /newroot/lib/modules /newroot/vmresults
mount -t 9p -o $O,ro modules /newroot/lib/modules || fail "mount modules share"
mount -t 9p -o $O results /newroot/vmresults || fail "mount results share"
mount -o move /dev /newroot/dev || fail "move /dev"
mount -o move /sys /newroot/sys || fail "move /sys"
mount -o move /proc /newroot/proc || fail "move /proc"
chroot /newroot /bin/bash /vmresults/run.sh
status=$?
echo "$status" > /newroot/vmresults/exit-status
sync
echo "TRACER_VM_EXIT=$status"
sync
echo o > /newroot/proc/sysrq-trigger
sleep 60
`

// modprobeWrapper is /sbin/modprobe of the initramfs. The kernel's module
// autoloader (request_module: veth, nf_tables, ...) runs /sbin/modprobe in
// init's root, which stays the initramfs; this hands it to the real modprobe
// in the chrooted host root, where the kernel's modules are mounted.
const modprobeWrapper = `#!/bin/busybox sh
exec /bin/busybox chroot /newroot /sbin/modprobe "$@"
`

// buildInitramfs writes an uncompressed newc cpio with busybox, /init and
// the boot modules of k (decompressed: busybox insmod reads plain .ko).
func buildInitramfs(k *kernel, busybox, out string) error {
	order, err := moduleLoadOrder(filepath.Join(k.Modules, k.Release), bootModules)
	if err != nil {
		return err
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("read busybox (apt-get install busybox-static): %w", err)
	}
	var buf bytes.Buffer
	w := &cpioWriter{w: &buf}
	for _, d := range []string{"bin", "dev", "modules", "proc", "sys", "sbin"} {
		w.dir(d)
	}
	w.file("sbin/modprobe", 0o755, []byte(modprobeWrapper))
	w.charDev("dev/console", 5, 1)
	w.file("bin/busybox", 0o755, bb)
	w.file("init", 0o755, []byte(initScript))
	var names []string
	for i, rel := range order {
		data, err := readModule(filepath.Join(k.Modules, k.Release, rel))
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%02d-%s", i, strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(filepath.Base(rel), ".xz"), ".zst"), ".gz"))
		w.file("modules/"+name, 0o644, data)
		names = append(names, name)
	}
	w.file("modules.order", 0o644, []byte(strings.Join(names, "\n")+"\n"))
	w.trailer()
	if w.err != nil {
		return fmt.Errorf("write initramfs: %w", w.err)
	}
	return writeFileAtomic(out, buf.Bytes())
}

func readModule(path string) ([]byte, error) {
	var cmd *exec.Cmd
	switch {
	case strings.HasSuffix(path, ".ko"):
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read module: %w", err)
		}
		return b, nil
	case strings.HasSuffix(path, ".xz"):
		cmd = exec.Command("xz", "-dc", path)
	case strings.HasSuffix(path, ".zst"):
		cmd = exec.Command("zstd", "-dcq", path)
	case strings.HasSuffix(path, ".gz"):
		cmd = exec.Command("gzip", "-dc", path)
	default:
		return nil, fmt.Errorf("read module %s: unknown compression", path)
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("decompress module %s: %w", path, err)
	}
	return out, nil
}

// moduleLoadOrder resolves the wanted modules and their dependencies from
// modules.dep into load order (dependencies first). Built-in modules are
// skipped; a module that is neither built in nor in modules.dep is an error.
func moduleLoadOrder(dir string, want []string) ([]string, error) {
	depFile, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("read modules.dep (depmod not run?): %w", err)
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[modName(l)] = true
		}
	}
	return resolveDeps(string(depFile), builtin, want)
}

func resolveDeps(depFile string, builtin map[string]bool, want []string) ([]string, error) {
	deps := map[string][]string{} // path -> dependency paths
	byName := map[string]string{} // module name -> path
	sc := bufio.NewScanner(strings.NewReader(depFile))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		path, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[path] = strings.Fields(rest)
		byName[modName(path)] = path
	}
	var order []string
	seen := map[string]bool{}
	var visit func(p string)
	visit = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		// modules.dep lists the deepest dependencies last: visit in reverse.
		d := deps[p]
		for i := len(d) - 1; i >= 0; i-- {
			visit(d[i])
		}
		order = append(order, p)
	}
	for _, name := range want {
		p, ok := byName[name]
		if !ok {
			if builtin[name] {
				continue
			}
			return nil, fmt.Errorf("module %s: neither in modules.dep nor built in", name)
		}
		visit(p)
	}
	return order, nil
}

func modName(path string) string {
	b := filepath.Base(path)
	if i := strings.Index(b, ".ko"); i >= 0 {
		b = b[:i]
	}
	return strings.ReplaceAll(b, "-", "_")
}

// cpioWriter writes the "newc" cpio format the kernel unpacks as initramfs.
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

func (c *cpioWriter) entry(name string, mode uint32, rdevMajor, rdevMinor int, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	var b bytes.Buffer
	b.WriteString(hdr)
	b.WriteString(name)
	b.WriteByte(0)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(data)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	_, c.err = c.w.Write(b.Bytes())
}

func (c *cpioWriter) dir(name string)                         { c.entry(name, 0o040755, 0, 0, nil) }
func (c *cpioWriter) file(name string, perm uint32, d []byte) { c.entry(name, 0o100000|perm, 0, 0, d) }
func (c *cpioWriter) charDev(name string, major, minor int) {
	c.entry(name, 0o020600, major, minor, nil)
}
func (c *cpioWriter) trailer() { c.entry("TRAILER!!!", 0, 0, 0, nil) }
