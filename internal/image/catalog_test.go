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
