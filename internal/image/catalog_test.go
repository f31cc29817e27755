package image

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// TestCatalog adds templates as setup does (a build dir moved in) and
// reads them back; incomplete and foreign entries are not templates.
func TestCatalog(t *testing.T) {
	dir := t.TempDir()
	if list, err := ListTemplates(dir); err != nil || len(list) != 0 {
		t.Fatalf("empty catalog lists %v, %v", list, err)
	}
	add := func(name string, created time.Time) model.Template {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, "templates"), 0o755); err != nil {
			t.Fatal(err)
		}
		build, err := os.MkdirTemp(filepath.Join(dir, "templates"), ".build-")
		if err != nil {
			t.Fatal(err)
		}
		writeTree(t, filepath.Join(build, "rootfs"))
		os.WriteFile(filepath.Join(build, "rootfs", "name"), []byte(name), 0o644)
		digest, size, err := Digest(filepath.Join(build, "rootfs"))
		if err != nil {
			t.Fatal(err)
		}
		tpl := model.Template{Name: name, Tag: "latest", Digest: digest, SizeBytes: size, CreatedAt: created}
		if err := AddTemplate(dir, build, tpl); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(build); !os.IsNotExist(err) {
			t.Errorf("build dir %s still there: %v", build, err)
		}
		return tpl
	}
	now := time.Now().UTC().Truncate(time.Second)
	newer := add("newer", now)
	older := add("older", now.Add(-time.Hour))

	got, err := ReadTemplate(dir, newer.Digest)
	if err != nil || got != newer {
		t.Errorf("ReadTemplate = %+v, %v; want %+v", got, err, newer)
	}
	if b, err := os.ReadFile(filepath.Join(TemplateRootFS(dir, newer.Digest), "name")); err != nil || string(b) != "newer" {
		t.Errorf("TemplateRootFS holds %q, %v", b, err)
	}
	// Foreign and incomplete entries: a dot dir, a dir without rootfs.
	os.MkdirAll(filepath.Join(dir, "templates", ".build-x", "rootfs"), 0o755)
	os.MkdirAll(filepath.Join(dir, "templates", "0000"), 0o755)
	os.WriteFile(filepath.Join(dir, "templates", "0000", templateFile), []byte(`{"name":"half"}`), 0o644)
	if _, err := ReadTemplate(dir, "sha256:0000"); err == nil {
		t.Error("a template without rootfs was read")
	}
	list, err := ListTemplates(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0] != older || list[1] != newer {
		t.Errorf("ListTemplates = %+v, want older then newer", list)
	}
}

// TestRemoveTemplate: the entry, its ext4 image and a half-removed leftover
// go; another template stays; a copy made after the deletion is kept; a
// malformed digest is refused before any path is built from it.
func TestRemoveTemplate(t *testing.T) {
	dir := t.TempDir()
	add := func(fill byte, created time.Time) model.Template {
		t.Helper()
		build := filepath.Join(dir, "templates", ".build-"+string(fill))
		if err := os.MkdirAll(filepath.Join(build, "rootfs", "ro"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(build, "rootfs", "ro", "f"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(build, "rootfs", "ro"), 0o555) // as images have them
		hex := ""
		for range 64 {
			hex += string(fill)
		}
		tpl := model.Template{Name: "t" + string(fill), Tag: "latest", Digest: "sha256:" + hex, CreatedAt: created}
		if err := AddTemplate(dir, build, tpl); err != nil {
			t.Fatal(err)
		}
		img := filepath.Join(dir, "images", hex+".ext4")
		os.MkdirAll(filepath.Dir(img), 0o755)
		for _, p := range []string{img, img + ".done"} {
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return tpl
	}
	deletedAt := time.Now()
	gone := add('a', deletedAt.Add(-time.Minute))
	keep := add('b', deletedAt.Add(-time.Minute))
	newer := add('c', deletedAt.Add(time.Minute))
	goneHex := gone.Digest[len("sha256:"):]
	if err := os.MkdirAll(filepath.Join(dir, "templates", ".removing-"+goneHex, "x"), 0o755); err != nil {
		t.Fatal(err)
	}

	for _, bad := range []string{"", "sha256:../../etc", "sha256:" + goneHex[:63], "md5:" + goneHex, "sha256:" + goneHex[:63] + "A"} {
		if _, err := RemoveTemplate(dir, bad, deletedAt); err == nil {
			t.Errorf("RemoveTemplate(%q) = nil error", bad)
		}
	}
	removed, err := RemoveTemplate(dir, gone.Digest, deletedAt)
	if err != nil || !removed {
		t.Fatalf("RemoveTemplate = %v, %v", removed, err)
	}
	for _, p := range []string{"templates/" + goneHex, "templates/.removing-" + goneHex, "images/" + goneHex + ".ext4", "images/" + goneHex + ".ext4.done"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want it gone", p, err)
		}
	}
	if removed, err := RemoveTemplate(dir, gone.Digest, deletedAt); err != nil || !removed {
		t.Errorf("RemoveTemplate of a removed template = %v, %v, want true, nil", removed, err)
	}
	if removed, err := RemoveTemplate(dir, newer.Digest, deletedAt); err != nil || removed {
		t.Errorf("RemoveTemplate of a copy made after the deletion = %v, %v, want false, nil", removed, err)
	}
	ts, err := ListTemplates(dir)
	if err != nil || len(ts) != 2 || ts[0].Digest != keep.Digest && ts[1].Digest != keep.Digest {
		t.Fatalf("catalog after the removal = %+v %v, want %s and %s", ts, err, keep.Digest, newer.Digest)
	}
	for _, tpl := range []model.Template{keep, newer} {
		if _, err := os.Stat(filepath.Join(dir, "images", tpl.Digest[len("sha256:"):]+".ext4")); err != nil {
			t.Errorf("image of %s: %v", tpl.Name, err)
		}
	}
}
