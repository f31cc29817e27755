package image

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/testenv"
)

func writeTree(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "etc/sub"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc/a"), []byte("alpha\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "etc/sub/b"), []byte("beta\n"), 0o600))
	must(os.Symlink("../etc/a", filepath.Join(root, "etc/link")))
	must(os.Link(filepath.Join(root, "etc/a"), filepath.Join(root, "etc/hard")))
}

func TestDigest(t *testing.T) {
	tests := []struct {
		name    string
		change  func(root string) error
		changes bool
	}{
		{"recomputed", func(string) error { return nil }, false},
		{"mtime only", func(r string) error {
			return os.Chtimes(filepath.Join(r, "etc/a"), time.Unix(1, 0), time.Unix(1, 0))
		}, false},
		{"content", func(r string) error { return os.WriteFile(filepath.Join(r, "etc/sub/b"), []byte("gamma\n"), 0o600) }, true},
		{"same size content", func(r string) error { return os.WriteFile(filepath.Join(r, "etc/sub/b"), []byte("betA\n"), 0o600) }, true},
		{"mode", func(r string) error { return os.Chmod(filepath.Join(r, "etc/a"), 0o755) }, true},
		{"owner", func(r string) error { return os.Lchown(filepath.Join(r, "etc/a"), 1000, 1000) }, true},
		{"symlink target", func(r string) error {
			os.Remove(filepath.Join(r, "etc/link"))
			return os.Symlink("../etc/hard", filepath.Join(r, "etc/link"))
		}, true},
		{"new empty dir", func(r string) error { return os.Mkdir(filepath.Join(r, "opt"), 0o755) }, true},
		{"removed file", func(r string) error { return os.Remove(filepath.Join(r, "etc/hard")) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "owner" {
				testenv.RequireRoot(t, "chown")
			}
			root := t.TempDir()
			writeTree(t, root)
			before, size, err := Digest(root)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(before, "sha256:") || len(before) != len("sha256:")+64 {
				t.Fatalf("digest %q is not sha256:<hex>", before)
			}
			if size != int64(len("alpha\n")*2+len("beta\n")) {
				t.Errorf("size = %d", size)
			}
			if err := tt.change(root); err != nil {
				t.Fatal(err)
			}
			after, _, err := Digest(root)
			if err != nil {
				t.Fatal(err)
			}
			if (before != after) != tt.changes {
				t.Errorf("digest changed = %v, want %v (%s → %s)", before != after, tt.changes, before, after)
			}
		})
	}
}

func TestDigestSameTreeTwoPlaces(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	writeTree(t, a)
	time.Sleep(10 * time.Millisecond) // different mtimes; not a timing assertion
	writeTree(t, b)
	da, _, err := Digest(a)
	if err != nil {
		t.Fatal(err)
	}
	db, _, err := Digest(b)
	if err != nil {
		t.Fatal(err)
	}
	if da != db {
		t.Errorf("same content, different digests: %s, %s", da, db)
	}
}
