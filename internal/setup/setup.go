// Package setup holds Airlock's first-run installers on a worker host: a
// pinned, statically linked runsc (EnsureRunsc), the "debian:bookworm" template
// (EnsureDebianTemplate: a debootstrap'ed Debian layer plus the agent) and,
// for the qemu runtime, QEMU and the Debian cloud kernel (EnsureQEMU).
// Each caches under a data directory so later starts reuse it at once, and
// writes progress as human lines to an io.Writer. What the installers
// produce for runtimes (the template catalog, ext4 images, the initramfs,
// VMAssets) is internal/image's, which setup calls and drivers use without
// this package.
//
// Layout under dir (see internal/image for templates/ and images/):
//
//	bin/runsc, bin/runsc.version        the pinned runsc and its version marker
//	cache/debian-bookworm/              the debootstrap'ed Debian layer
//	cache/debian-bookworm.done          its completion marker
//	templates/<hex>/                    a template (image.AddTemplate): the layer hardlink-copied + the agent
//	templates/index.json                {agent sha256 → template digest}
//	setup.lock                          serialises concurrent set-ups (image.Lock)
package setup

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/airlock/airlock/internal/image"
)

// progressf writes one progress line; a nil writer discards it.
func progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// lock serialises set-ups under dir with image builds (image.Lock).
func lock(dir string) (func(), error) { return image.Lock(dir) }

// writeFileAtomic writes data to a temp file beside path and renames it.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
