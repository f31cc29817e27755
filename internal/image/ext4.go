package image

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

// templateDigestRe matches dir/templates/<digest>/rootfs.
var templateDigestRe = regexp.MustCompile(`/templates/([0-9a-f]{64})/rootfs/?$`)

// EnsureTemplateImage returns a read-only ext4 image of the template root
// filesystem rootfs, built once per template digest under dir/images with
// mkfs.ext4 -d (no loop mount). A rootfs that is a cached template
// (dir/templates/<digest>/rootfs) is keyed by that digest without hashing.
func EnsureTemplateImage(ctx context.Context, dir, rootfs string, progress io.Writer) (string, error) {
	st, err := os.Stat(rootfs)
	if err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("template image: %s is not a directory", rootfs)
	}
	var digest string
	if m := templateDigestRe.FindStringSubmatch(filepath.Clean(rootfs)); m != nil {
		digest = m[1]
	} else if digest, _, err = Digest(rootfs); err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	digest = strings.TrimPrefix(digest, "sha256:")
	img := filepath.Join(dir, "images", digest+".ext4")
	if _, err := os.Stat(img + ".done"); err == nil {
		return img, nil
	}
	unlock, err := Lock(dir)
	if err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	defer unlock()
	if _, err := os.Stat(img + ".done"); err == nil {
		return img, nil
	}
	if err := os.MkdirAll(filepath.Dir(img), 0o755); err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	used, err := treeBytes(rootfs)
	if err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	size := used + used/4 + 32<<20
	progressf(progress, "qemu: building the template image %s (%d MiB)", filepath.Base(img), size>>20)
	tmp := img + ".tmp"
	os.Remove(tmp)
	defer os.Remove(tmp)
	if err := MakeExt4(ctx, tmp, size, rootfs); err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	if err := os.Rename(tmp, img); err != nil {
		return "", fmt.Errorf("template image: %w", err)
	}
	if err := os.WriteFile(img+".done", []byte(rootfs+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("template image: marker: %w", err)
	}
	return img, nil
}

// MakeExt4 creates a sparse ext4 image of size bytes at path, filled from
// the directory from when it is not empty.
func MakeExt4(ctx context.Context, path string, size int64, from string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("create ext4 image: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("create ext4 image: %w", err)
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		mkfs = "/usr/sbin/mkfs.ext4"
	}
	// No journal: the template is read-only, and the per-sandbox disk is
	// thrown away with the sandbox; it also keeps images small.
	args := []string{"-q", "-F", "-O", "^has_journal", "-E", "root_owner=0:0"}
	if from != "" {
		args = append(args, "-d", from)
	}
	args = append(args, path)
	if out, err := exec.CommandContext(ctx, mkfs, args...).CombinedOutput(); err != nil {
		os.Remove(path)
		return fmt.Errorf("mkfs.ext4 %s: %w\n%s", path, err, tail(out))
	}
	return nil
}

// treeBytes is the allocated size of a tree plus an inode's worth per entry.
func treeBytes(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += 512
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += info.Size()
		}
		return nil
	})
	return n, err
}
