// Command image writes the tracer's container image as a tarball that
// `docker load`, `podman load` and `ctr images import` read, without a
// container daemon: the tracer binary, and the Debian binaries it runs to
// read a node's rules (iptables-save and ip6tables-save of both backends,
// ipset, nft) with the shared libraries and files they need, copied from
// this machine's Debian packages. iptables-save and ip6tables-save are
// the tracer itself, which runs the backend the node uses (see
// cmd/tracer/iptwrapper.go).
//
//	go run . -binary ../../bin/tracer -out ../../bin/tracer-image.tar [-rootfs DIR]
//
// -rootfs also unpacks the written image into DIR, read back from the
// tarball: the tests run the image's tracer there under chroot.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "", "the tracer binary to put in the image")
	flag.StringVar(&o.out, "out", "", "write the image tarball here")
	flag.StringVar(&o.tag, "tag", "tracer:dev", "the image's name in the tarball")
	flag.StringVar(&o.rootfs, "rootfs", "", "also unpack the written image into this directory")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

type options struct {
	binary, out, tag, rootfs string
}
