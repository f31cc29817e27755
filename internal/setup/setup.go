// Package setup does Airlock's first-run set-up on a worker host: it provides
// a pinned, statically linked runsc (EnsureRunsc) and builds the "base"
// template root filesystem (EnsureBaseTemplate), caching both under a data
// directory so later starts reuse them at once. Progress is written as human
// lines to an io.Writer.
//
// Layout under dir:
//
//	bin/runsc, bin/runsc.version        the pinned runsc and its version marker
//	cache/debian-bookworm/              the debootstrap'ed Debian layer
//	cache/debian-bookworm.done          its completion marker
//	templates/<hex>/rootfs/             a template: the layer hardlink-copied + the agent
//	templates/<hex>/template.json       its model.Template
//	templates/index.json                {agent sha256 → template digest}
//	setup.lock                          serialises concurrent set-ups (flock)
package setup

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// progressf writes one progress line; a nil writer discards it.
func progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// lock takes an exclusive flock on dir/setup.lock, so that two processes
// (a worker and a test, two test packages) never build the same thing at
// once. The returned func releases it.
func lock(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "setup.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open set-up lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("take set-up lock: %w", err)
	}
	return func() { f.Close() }, nil
}

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
