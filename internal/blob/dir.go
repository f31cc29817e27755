package blob

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// Dir is the file backend: a directory whose files are the objects, a key's
// slashes its subdirectories. Put writes ".tmp-*" in the target directory,
// fsyncs it, renames it over the key and fsyncs the directory, so an object
// is either whole or absent after a crash; List skips dot names.
type Dir struct {
	root string
}

var _ Store = (*Dir)(nil)

// OpenDir opens (creating it, mode 0700) the directory backend at dir,
// which must be an absolute path.
func OpenDir(dir string) (*Dir, error) {
	if !filepath.IsAbs(dir) {
		return nil, model.Errorf(model.ErrInvalid, "blob directory %q is not an absolute path (file:///DIR)", dir)
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	return &Dir{root: dir}, nil
}

func (d *Dir) String() string { return "file://" + d.root }

func (d *Dir) path(key string) (string, error) {
	if err := ValidKey(key); err != nil {
		return "", err
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

// Put implements Store.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader, size int64) (err error) {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return model.Errorf(model.ErrInvalid, "blob %s: size %d", key, size)
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	cr := &countingReader{r: &ctxReader{ctx: ctx, r: r}, limit: size}
	if _, err := io.Copy(f, cr); err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	if cr.n != size {
		return fmt.Errorf("blob: put %s: read %d bytes, size given %d", key, cr.n, size)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	return syncDir(dir)
}

// Get implements Store.
func (d *Dir) Get(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, 0, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("blob: get %s: %w", key, err)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%s is not a regular file: %w", key, ErrNotFound)
	}
	return f, st.Size(), nil
}

// Stat implements Store.
func (d *Dir) Stat(ctx context.Context, key string) (Object, error) {
	p, err := d.path(key)
	if err != nil {
		return Object{}, err
	}
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) || err == nil && !st.Mode().IsRegular() {
		return Object{}, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	if err != nil {
		return Object{}, fmt.Errorf("blob: stat %s: %w", key, err)
	}
	return Object{Key: key, Size: st.Size(), Modified: st.ModTime()}, nil
}

// Delete implements Store. Directories a delete leaves empty are removed,
// up to the root.
func (d *Dir) Delete(ctx context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob: delete %s: %w", key, err)
	}
	for dir := filepath.Dir(p); dir != d.root && strings.HasPrefix(dir, d.root+string(filepath.Separator)); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil { // not empty (or gone): stop
			break
		}
	}
	return nil
}

// List implements Store.
func (d *Dir) List(ctx context.Context, prefix string) ([]Object, error) {
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	// Walk the deepest directory the prefix names whole.
	start := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = filepath.Join(d.root, filepath.FromSlash(prefix[:i]))
	}
	var out []Object
	err := filepath.WalkDir(start, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(e.Name(), ".") && p != start {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !e.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(d.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		info, err := e.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		out = append(out, Object{Key: key, Size: info.Size(), Modified: info.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("blob: list %s: %w", prefix, err)
	}
	slices.SortFunc(out, func(a, b Object) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("blob: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("blob: sync %s: %w", dir, err)
	}
	return nil
}

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
