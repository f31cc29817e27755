package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// templateFile is a template's model.Template, beside its rootfs.
const templateFile = "template.json"

// TemplateRootFS returns the root filesystem directory of the template with
// the given digest ("sha256:<hex>").
func TemplateRootFS(dir, digest string) string {
	return filepath.Join(templateDir(dir, digest), "rootfs")
}

// templateDir is dir/templates/<hex>.
func templateDir(dir, digest string) string {
	return filepath.Join(dir, "templates", strings.TrimPrefix(digest, "sha256:"))
}

// ListTemplates returns every complete template under dir, oldest first.
func ListTemplates(dir string) ([]model.Template, error) {
	entries, err := os.ReadDir(filepath.Join(dir, "templates"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []model.Template
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		t, err := readTemplate(filepath.Join(dir, "templates", e.Name()))
		if err != nil {
			continue // incomplete or foreign; not a template
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b model.Template) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// ReadTemplate returns the complete template with the given digest under
// dir: its template.json and its rootfs are there. The caller compares the
// returned Digest if it must be sure the entry is not foreign.
func ReadTemplate(dir, digest string) (model.Template, error) {
	return readTemplate(templateDir(dir, digest))
}

func readTemplate(tdir string) (model.Template, error) {
	var t model.Template
	b, err := os.ReadFile(filepath.Join(tdir, templateFile))
	if err != nil {
		return t, err
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return t, fmt.Errorf("decode %s: %w", tdir, err)
	}
	if _, err := os.Stat(filepath.Join(tdir, "rootfs")); err != nil {
		return t, err
	}
	return t, nil
}

// AddTemplate moves build, a directory on dir's file system holding the
// template's rootfs/, into the catalog as template t (t.Digest names it;
// compute it with Digest), replacing an incomplete entry of that digest.
// It writes t into build first, so the entry is complete the moment it
// appears.
func AddTemplate(dir, build string, t model.Template) error {
	final := templateDir(dir, t.Digest)
	os.RemoveAll(final) // an incomplete earlier attempt
	b, _ := json.MarshalIndent(t, "", "  ")
	if err := os.WriteFile(filepath.Join(build, templateFile), b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(build, final); err != nil {
		return fmt.Errorf("move template into place: %w", err)
	}
	return nil
}
