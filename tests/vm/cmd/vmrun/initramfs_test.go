package main

import (
	"bytes"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

func TestResolveDeps(t *testing.T) {
	dep := `kernel/fs/9p/9p.ko.xz: kernel/fs/netfs/netfs.ko.xz kernel/net/9p/9pnet.ko.xz
kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/drivers/virtio/virtio_ring.ko.xz kernel/drivers/virtio/virtio.ko.xz
kernel/net/9p/9pnet.ko.xz:
kernel/fs/netfs/netfs.ko.xz:
kernel/drivers/virtio/virtio.ko.xz: kernel/drivers/virtio/virtio_ring.ko.xz
kernel/drivers/virtio/virtio_ring.ko.xz:
kernel/fs/overlayfs/overlay.ko.xz:
`
	got, err := resolveDeps(dep, map[string]bool{"virtio_pci": true}, []string{"virtio_pci", "9pnet_virtio", "9p", "overlay"})
	if err != nil {
		t.Fatalf("resolveDeps: %v", err)
	}
	want := []string{
		"kernel/drivers/virtio/virtio_ring.ko.xz",
		"kernel/drivers/virtio/virtio.ko.xz",
		"kernel/net/9p/9pnet.ko.xz",
		"kernel/net/9p/9pnet_virtio.ko.xz",
		"kernel/fs/netfs/netfs.ko.xz",
		"kernel/fs/9p/9p.ko.xz",
		"kernel/fs/overlayfs/overlay.ko.xz",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("resolveDeps:\n got %v\nwant %v", got, want)
	}
	if _, err := resolveDeps(dep, nil, []string{"virtio_pci"}); err == nil {
		t.Error("resolveDeps of a module that is neither listed nor built in: want an error")
	}
}

func TestCPIOWriter(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio not installed: cannot cross-check the archive")
	}
	var buf bytes.Buffer
	w := &cpioWriter{w: &buf}
	w.dir("bin")
	w.charDev("dev/console", 5, 1)
	w.file("init", 0o755, []byte("#!/bin/sh\n"))
	w.file("bin/odd", 0o644, []byte("12345"))
	w.trailer()
	if w.err != nil {
		t.Fatal(w.err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d is not 4-byte aligned", buf.Len())
	}
	cmd := exec.Command("cpio", "-itv", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -t: %v\n%s", err, out)
	}
	for _, want := range []string{"drwxr-xr-x", "bin\n", "crw-------", "dev/console", "-rwxr-xr-x", " 10 ", "init\n", " 5 ", "bin/odd"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cpio -tv output lacks %q:\n%s", want, out)
		}
	}
}
