// Package templates holds the recipes of the templates Airlock ships,
// built by the same builder as users' (internal/image/build) when a worker
// starts: base (FROM debian:bookworm, the debootstrap'ed layer) first,
// then code-interpreter (FROM base). Each recipe is a directory: its
// Dockerfile and the build context its COPY steps read.
package templates

import (
	"embed"
	"io/fs"
	"os"
	"path/filepath"
)

//go:embed base/Dockerfile code-interpreter/Dockerfile code-interpreter/packages.txt code-interpreter/server/server.py code-interpreter/server/start.sh
var files embed.FS

// Shipped is one shipped template.
type Shipped struct {
	Name string // the template's name (tag latest)
	Dir  string // its recipe's directory in the embedded files
}

// All are the shipped templates in build order (each may build on the
// ones before it).
var All = []Shipped{{Name: "base", Dir: "base"}, {Name: "code-interpreter", Dir: "code-interpreter"}}

// WriteContext writes recipe dir's files (its Dockerfile and build
// context) under dst and returns the path of the Dockerfile there.
func WriteContext(dir, dst string) (string, error) {
	sub, err := fs.Sub(files, dir)
	if err != nil {
		return "", err
	}
	err = fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out := filepath.Join(dst, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		b, err := fs.ReadFile(sub, p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
	return filepath.Join(dst, "Dockerfile"), err
}
