package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildInitrd writes a gzip'ed newc cpio: /init (the agent), /modules/*.ko
// and the empty mount points the agent's VM init uses.
func BuildInitrd(ctx context.Context, modules, agentPath, out string) error {
	tree, err := os.MkdirTemp(filepath.Dir(out), ".initrd-*")
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer os.RemoveAll(tree)
	for _, d := range []string{"dev", "proc", "sys", "newroot", "mnt/ro", "mnt/rw", "modules"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	if err := copyFile(agentPath, filepath.Join(tree, "init"), 0o755); err != nil {
		return fmt.Errorf("initramfs: agent: %w", err)
	}
	mods, err := os.ReadDir(modules)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	for _, m := range mods {
		if err := copyFile(filepath.Join(modules, m.Name()), filepath.Join(tree, "modules", m.Name()), 0o644); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	var list bytes.Buffer
	err = filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tree, p)
		list.WriteString(rel + "\n")
		return nil
	})
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	cpioPath, err := exec.LookPath("cpio")
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer os.Remove(tmp)
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, cpioPath, "--quiet", "-o", "-H", "newc", "-R", "0:0")
	cmd.Dir = tree
	cmd.Stdin = &list
	cmd.Stdout = zw
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		f.Close()
		return fmt.Errorf("initramfs: cpio: %w\n%s", err, stderr.Bytes())
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return os.Rename(tmp, out)
}
