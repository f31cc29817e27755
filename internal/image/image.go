// Package image owns what a worker's data directory holds for runtime
// drivers to boot from, and builds it: the template catalog (ListTemplates,
// ReadTemplate, TemplateRootFS, AddTemplate; a template is a root
// filesystem tree named by its content Digest), the read-only ext4 image of
// a template and empty ext4 disks (EnsureTemplateImage, MakeExt4), the
// initramfs around the guest agent (BuildInitrd) and the names of a VM's
// boot files (VMAssets). Drivers (internal/runtime/qemu) use it at run
// time; internal/setup, the first-run installers (runsc, the base
// template's Debian layer, QEMU and the guest kernel), fills it. It calls
// no package manager and downloads nothing.
//
// Layout under dir (the data directory):
//
//	templates/<hex>/rootfs/             a template's root filesystem
//	templates/<hex>/template.json       its model.Template
//	images/<template digest>.ext4       a template's read-only root image (mkfs.ext4 -d)
//	images/<template digest>.ext4.done  its completion marker
//	setup.lock                          serialises builds under dir, with internal/setup's (flock)
package image

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// VMAssets are the host files a VM runtime boots from.
type VMAssets struct {
	QEMU          string // qemu-system-x86_64
	Kernel        string // vmlinuz of the Debian cloud kernel
	Initrd        string // gzip'ed newc initramfs, /init = airlock-agent (BuildInitrd)
	KernelRelease string // e.g. "6.1.0-57-cloud-amd64", what uname -r prints in the guest
}

// Lock takes an exclusive flock on dir/setup.lock, so that two processes
// (a worker and a test, two test packages) never build the same thing
// under dir at once; internal/setup takes the same lock. The returned func
// releases it.
func Lock(dir string) (func(), error) {
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

// progressf writes one progress line; a nil writer discards it.
func progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// tail returns the last lines of command output for error messages.
func tail(out []byte) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}

// copyFile copies src to a new file dst owned by root.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Lchown(dst, 0, 0)
}
