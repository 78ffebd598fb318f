package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// unpack reads the image back from the tarball and writes its filesystem
// into dir, as a runtime would lay it out.
func unpack(tarPath string, tag name.Tag, dir string) error {
	img, err := tarball.ImageFromPath(tarPath, &tag)
	if err != nil {
		return fmt.Errorf("read back %s: %w", tarPath, err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read back %s: %w", tarPath, err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		if !strings.HasPrefix(p, filepath.Clean(dir)+"/") {
			return fmt.Errorf("read back %s: %q leaves the root", tarPath, h.Name)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode))
		case tar.TypeSymlink:
			os.Remove(p)
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			err = writeFile(p, tr, os.FileMode(h.Mode))
		}
		if err != nil {
			return fmt.Errorf("unpack %s: %w", h.Name, err)
		}
	}
}

func writeFile(p string, r io.Reader, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
