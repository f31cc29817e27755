package image

import (
	"compress/gzip"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/testenv"
)

func TestEnsureTemplateImage(t *testing.T) {
	testenv.RequireRoot(t, "chown in the tree")
	if _, err := exec.LookPath("debugfs"); err != nil {
		if _, err := os.Stat("/usr/sbin/debugfs"); err != nil {
			t.Skip("needs e2fsprogs (debugfs)")
		}
	}
	dir := t.TempDir()
	root := filepath.Join(t.TempDir(), "rootfs")
	writeTree(t, root)
	ctx := context.Background()
	img, err := EnsureTemplateImage(ctx, dir, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	cat := exec.Command("/usr/sbin/debugfs", "-R", "cat /etc/sub/b", img)
	out, err := cat.Output()
	if err != nil || string(out) != "beta\n" {
		t.Errorf("debugfs cat /etc/sub/b = %q, %v", out, err)
	}
	again, err := EnsureTemplateImage(ctx, dir, root, nil)
	if err != nil || again != img {
		t.Errorf("second call = %q, %v; want the cached %q", again, err, img)
	}
	if _, err := EnsureTemplateImage(ctx, dir, filepath.Join(dir, "missing"), nil); err == nil {
		t.Error("an image of a missing directory was built")
	}
}

func TestBuildInitrd(t *testing.T) {
	testenv.RequireRoot(t, "the initramfs's files are chowned to root")
	cpio := testenv.RequireTool(t, "cpio", "to build and list the initramfs")
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	if err := os.WriteFile(agent, []byte("#!agent\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	modules := filepath.Join(dir, "modules")
	os.Mkdir(modules, 0o755)
	for _, m := range []string{"00-virtio_ring.ko", "01-virtio.ko"} {
		if err := os.WriteFile(filepath.Join(modules, m), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "initrd.cpio.gz")
	if err := BuildInitrd(context.Background(), modules, agent, out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("initramfs is not gzip: %v", err)
	}
	list := exec.Command(cpio, "-it", "--quiet")
	list.Stdin = zr
	b, err := list.Output()
	if err != nil {
		t.Fatalf("cpio -t: %v", err)
	}
	names := strings.Fields(string(b))
	for _, w := range []string{"init", "modules/00-virtio_ring.ko", "modules/01-virtio.ko", "dev", "proc", "sys", "newroot", "mnt/ro", "mnt/rw"} {
		if !slices.Contains(names, w) {
			t.Errorf("initramfs lacks %s (has %v)", w, names)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".initrd-*")); len(m) > 0 || fileExists(out+".tmp") {
		t.Errorf("build leftovers: %v", m)
	}
	// A missing modules directory fails, and leaves no initramfs.
	bad := filepath.Join(dir, "bad.cpio.gz")
	if err := BuildInitrd(context.Background(), filepath.Join(dir, "none"), agent, bad); err == nil || fileExists(bad) {
		t.Errorf("BuildInitrd without modules = %v (file left: %v), want an error and no file", err, fileExists(bad))
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
