package build

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/testenv"
)

func write(t *testing.T, p, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestApplyOverlay makes a real overlay over a lower tree, changes it the
// ways a RUN step can (and a hostile one would: symlinks to the host's
// paths, a replaced directory, an opaque one, a hard link), and checks
// that Apply on a clone gives exactly the merged view, leaves the lower
// tree and the host alone, and follows no link.
func TestApplyOverlay(t *testing.T) {
	testenv.RequireRoot(t, "overlayfs and tmpfs mounts")
	dir := t.TempDir()
	lower := filepath.Join(dir, "lower")
	write(t, filepath.Join(lower, "keep"), "keep\n")
	write(t, filepath.Join(lower, "gone"), "gone\n")
	write(t, filepath.Join(lower, "mod"), "old\n")
	write(t, filepath.Join(lower, "d/x"), "x\n")
	write(t, filepath.Join(lower, "opq/old"), "old\n")
	write(t, filepath.Join(lower, "tofile/y"), "y\n")
	outside := filepath.Join(dir, "outside")
	write(t, filepath.Join(outside, "secret"), "host\n")

	ov, err := MountOverlay(filepath.Join(dir, "ov"), lower, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer ov.Release()
	m := ov.Merged
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Remove(filepath.Join(m, "gone")))
	must(os.WriteFile(filepath.Join(m, "mod"), []byte("new\n"), 0o600)) // in place: lower's inode must not change
	must(os.WriteFile(filepath.Join(m, "d/new"), []byte("n\n"), 0o644))
	must(os.RemoveAll(filepath.Join(m, "opq")))
	must(os.Mkdir(filepath.Join(m, "opq"), 0o750))
	must(os.WriteFile(filepath.Join(m, "opq/fresh"), []byte("f\n"), 0o644))
	must(os.RemoveAll(filepath.Join(m, "tofile")))
	must(os.WriteFile(filepath.Join(m, "tofile"), []byte("now a file\n"), 0o644))
	// Hostile: a symlink to the host's directory, then a name under it in
	// the guest's view would resolve outside; a link to the host's file.
	must(os.Symlink(outside, filepath.Join(m, "escape")))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(m, "d/secret-link")))
	must(os.WriteFile(filepath.Join(m, "h1"), []byte("hard\n"), 0o644))
	must(os.Link(filepath.Join(m, "h1"), filepath.Join(m, "h2")))
	must(os.Chmod(filepath.Join(m, "keep"), 0o600)) // metadata-only change: copied up
	must(ov.Unmount())

	dst := filepath.Join(dir, "dst")
	must(Clone(lower, dst))
	st, err := Apply(ov.Upper, dst)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	t.Logf("applied: %+v", st)
	read := func(root, p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return "<missing>"
		}
		return string(b)
	}
	want := map[string]string{"keep": "keep\n", "gone": "<missing>", "mod": "new\n", "d/x": "x\n", "d/new": "n\n",
		"opq/old": "<missing>", "opq/fresh": "f\n", "tofile": "now a file\n", "h1": "hard\n", "h2": "hard\n"}
	for p, w := range want {
		if got := read(dst, p); got != w {
			t.Errorf("dst/%s = %q, want %q", p, got, w)
		}
	}
	if got := read(lower, "mod"); got != "old\n" {
		t.Errorf("lower/mod changed to %q: a write went through a shared inode", got)
	}
	if fi, _ := os.Stat(filepath.Join(lower, "keep")); fi.Mode().Perm() != 0o644 {
		t.Errorf("lower/keep mode changed to %v", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(dst, "keep")); fi.Mode().Perm() != 0o600 {
		t.Errorf("dst/keep mode %v, want 0600", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(dst, "opq")); fi.Mode().Perm() != 0o750 {
		t.Errorf("dst/opq mode %v, want 0750", fi.Mode())
	}
	if l, err := os.Readlink(filepath.Join(dst, "escape")); err != nil || l != outside {
		t.Errorf("escape link = %q, %v (kept as data)", l, err)
	}
	a, _ := os.Stat(filepath.Join(dst, "h1"))
	b, _ := os.Stat(filepath.Join(dst, "h2"))
	if !os.SameFile(a, b) {
		t.Errorf("h1 and h2 are no longer one file")
	}
	if got := read(outside, "secret"); got != "host\n" {
		t.Errorf("the host's file changed: %q", got)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("something was written outside: %v", entries)
	}
}

// TestApplyRefusesThroughSymlink hand-writes an upper layer (as a guest
// with a writable root could shape one) whose directory entry stands
// where the clone has a symlink to the outside: Apply replaces the link
// with a directory instead of writing through it.
func TestApplyRefusesThroughSymlink(t *testing.T) {
	testenv.RequireRoot(t, "chown in Apply")
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "dst")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dst, "link")); err != nil {
		t.Fatal(err)
	}
	upper := filepath.Join(dir, "upper")
	write(t, filepath.Join(upper, "link/planted"), "x\n")
	if _, err := Apply(upper, dst); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("Apply wrote through a symlink: %v", entries)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "link")); err != nil || !fi.IsDir() {
		t.Errorf("dst/link is not a directory now: %v", err)
	}
	// A whiteout device is a removal; any other device is never made.
	if err := unix.Mknod(filepath.Join(upper, "dev"), syscall.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	st, err := Apply(upper, dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "dev")); !errors.Is(err, os.ErrNotExist) || st.Skipped != 1 {
		t.Errorf("a device node was made in the template (%v, skipped %d)", err, st.Skipped)
	}
}

// TestCacheGC: entries unused for CacheTTL go, then the least recently
// used while the cache is over CacheMaxBytes; config-only markers expire
// too.
func TestCacheGC(t *testing.T) {
	dir := t.TempDir()
	b := &Builder{Dir: dir, CacheMaxBytes: 250}
	now := time.Now()
	mk := func(key string, bytes int64, used time.Time) {
		d := filepath.Join(b.cacheDir(), key)
		if err := os.MkdirAll(filepath.Join(d, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
		j, _ := json.Marshal(cacheEntry{Key: key, Bytes: bytes})
		meta := filepath.Join(d, "entry.json")
		if err := os.WriteFile(meta, j, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(meta, used, used)
	}
	mk("stale", 10, now.Add(-CacheTTL-time.Hour))
	mk("oldest", 100, now.Add(-3*time.Hour))
	mk("older", 100, now.Add(-2*time.Hour))
	mk("newest", 100, now.Add(-time.Hour))
	b.mark("seen-old")
	os.Chtimes(filepath.Join(b.cacheDir(), "seen-old.seen"), now.Add(-CacheTTL-time.Hour), now.Add(-CacheTTL-time.Hour))
	b.mark("seen-new")

	if n := b.GC(now); n != 2 {
		t.Errorf("GC removed %d entries, want 2 (stale by age, oldest by size)", n)
	}
	for key, want := range map[string]bool{"stale": false, "oldest": false, "older": true, "newest": true} {
		_, ok := b.lookup(key)
		if ok != want {
			t.Errorf("entry %s kept = %v, want %v", key, ok, want)
		}
	}
	if b.seen("seen-old") || !b.seen("seen-new") {
		t.Errorf("markers: old kept %v, new kept %v", b.seen("seen-old"), b.seen("seen-new"))
	}
}
