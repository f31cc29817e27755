package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

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

// RemoveTemplate removes the template with the given digest from the
// catalog under dir, and its ext4 image (images/<hex>.ext4), unless the
// copy there was made (CreatedAt) after notAfter: then it is a newer
// import of the same content, kept, and removed is false. An entry that is
// not there is removed already (true). The entry is renamed away under the
// catalog lock first (ListTemplates no longer sees it), then deleted.
func RemoveTemplate(dir, digest string, notAfter time.Time) (removed bool, err error) {
	hexPart, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hexPart) != 64 || strings.Trim(hexPart, "0123456789abcdef") != "" {
		return false, fmt.Errorf("remove template %q: not a sha256 digest: %w", digest, model.ErrInvalid)
	}
	unlock, err := Lock(dir)
	if err != nil {
		return false, fmt.Errorf("remove template %s: %w", digest, err)
	}
	defer unlock()
	tdir := templateDir(dir, digest)
	if t, err := readTemplate(tdir); err == nil && t.CreatedAt.After(notAfter) {
		return false, nil
	}
	img := filepath.Join(dir, "images", hexPart+".ext4")
	for _, p := range []string{img + ".done", img, img + ".tmp"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("remove template %s: %w", digest, err)
		}
	}
	gone := filepath.Join(dir, "templates", ".removing-"+hexPart)
	removeAll(gone) // left by a removal that stopped half-way
	if err := os.Rename(tdir, gone); errors.Is(err, os.ErrNotExist) {
		return true, nil
	} else if err != nil {
		return false, fmt.Errorf("remove template %s: %w", digest, err)
	}
	if err := removeAll(gone); err != nil {
		return true, fmt.Errorf("remove template %s: %w", digest, err)
	}
	return true, nil
}

// removeAll removes tree; without root, read-only directories of an
// image (0555) are made writable first.
func removeAll(tree string) error {
	if os.RemoveAll(tree) == nil {
		return nil
	}
	filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(tree)
}

// RenameTemplate rewrites the entry of t.Digest, complete already, as t
// (its name, tag, creation time and config), leaving its tree alone: a
// build whose result is content the catalog holds moves the name there.
// The caller holds the catalog lock.
func RenameTemplate(dir string, t model.Template) error {
	tdir := templateDir(dir, t.Digest)
	b, _ := json.MarshalIndent(t, "", "  ")
	tmp := filepath.Join(tdir, templateFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(tdir, templateFile))
}
