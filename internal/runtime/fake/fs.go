package fake

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"
)

// errNotFound, errInvalid and errConflict classify the guest's failures
// as the agent does (agentapi.Error codes).
var (
	errNotFound = errors.New("not_found")
	errInvalid  = errors.New("invalid")
	errConflict = errors.New("conflict")
)

func errorf(kind error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", kind, fmt.Sprintf(format, args...))
}

// node is one file or directory of the guest's writable layer.
type node struct {
	Dir   bool        `json:"dir,omitempty"`
	Data  []byte      `json:"data,omitempty"`
	Mode  fs.FileMode `json:"mode"`
	UID   int         `json:"uid"`
	MTime time.Time   `json:"mtime"`
	// Opaque hides the template's entries below a directory that was
	// deleted and made again.
	Opaque bool `json:"opaque,omitempty"`
}

// guestFS is an overlay: the template (read only, confined by os.Root) under
// an in-memory writable layer; deletions of template entries are
// whiteouts. Paths are absolute and clean. Callers hold the guest's lock.
type guestFS struct {
	lower *os.Root
	upper map[string]*node
	gone  map[string]bool
	// meminfo is what /proc/meminfo says (the sandbox's memory).
	meminfo string
}

// entry is what a lookup finds.
type entry struct {
	node
	fromLower bool
	link      string // symlink target (template only)
}

func clean(p string) string { return path.Clean("/" + p) }

// hidden reports whether the template's p is covered by a whiteout or an
// opaque directory above it.
func (f *guestFS) hidden(p string) bool {
	for q := p; ; q = path.Dir(q) {
		if f.gone[q] {
			return true
		}
		if n, ok := f.upper[q]; ok && n.Opaque && q != p {
			return true
		}
		if q == "/" {
			return false
		}
	}
}

func (f *guestFS) lookup(p string) (entry, error) {
	p = clean(p)
	if p == "/proc/meminfo" {
		return entry{node: node{Data: []byte(f.meminfo), Mode: 0o444}}, nil
	}
	if n, ok := f.upper[p]; ok {
		return entry{node: *n}, nil
	}
	if f.lower == nil || f.hidden(p) {
		return entry{}, errorf(errNotFound, "%s: no such file or directory", p)
	}
	rel := "." + p
	if p == "/" {
		rel = "."
	}
	fi, err := f.lower.Lstat(rel)
	if err != nil {
		return entry{}, errorf(errNotFound, "%s: no such file or directory", p)
	}
	e := entry{node: node{Dir: fi.IsDir(), Mode: fi.Mode().Perm(), MTime: fi.ModTime()}, fromLower: true}
	if fi.Mode()&fs.ModeSymlink != 0 {
		e.link, _ = f.lower.Readlink(rel)
	}
	return e, nil
}

// read returns the contents of file p.
func (f *guestFS) read(p string) ([]byte, error) {
	e, err := f.lookup(p)
	if err != nil {
		return nil, err
	}
	if e.Dir {
		return nil, errorf(errInvalid, "%s: is a directory", p)
	}
	if !e.fromLower {
		return e.Data, nil
	}
	r, err := f.lower.Open("." + clean(p))
	if err != nil {
		return nil, errorf(errNotFound, "%s: %v", p, err)
	}
	defer r.Close()
	return io.ReadAll(r)
}

// isDir reports whether p is a directory.
func (f *guestFS) isDir(p string) bool {
	e, err := f.lookup(p)
	return err == nil && e.Dir
}

// write makes p a file with data (its parent must be a directory).
func (f *guestFS) write(p string, data []byte, mode fs.FileMode, uid int) error {
	p = clean(p)
	if p == "/" || strings.HasPrefix(p, "/proc/") {
		return errorf(errInvalid, "%s: read-only", p)
	}
	if !f.isDir(path.Dir(p)) {
		return errorf(errNotFound, "%s: no such directory", path.Dir(p))
	}
	if e, err := f.lookup(p); err == nil && e.Dir {
		return errorf(errConflict, "%s: is a directory", p)
	}
	f.upper[p] = &node{Data: data, Mode: mode, UID: uid, MTime: time.Now()}
	return nil
}

// mkdirAll makes p and its missing parents.
func (f *guestFS) mkdirAll(p string, mode fs.FileMode, uid int) error {
	p = clean(p)
	if e, err := f.lookup(p); err == nil {
		if !e.Dir {
			return errorf(errConflict, "%s: not a directory", p)
		}
		return nil
	}
	if err := f.mkdirAll(path.Dir(p), mode, uid); err != nil {
		return err
	}
	n := &node{Dir: true, Mode: mode, UID: uid, MTime: time.Now()}
	if f.gone[p] {
		delete(f.gone, p)
		n.Opaque = true
	}
	f.upper[p] = n
	return nil
}

// remove deletes p (with recursive, a directory and everything below).
func (f *guestFS) remove(p string, recursive bool) error {
	p = clean(p)
	e, err := f.lookup(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return errorf(errInvalid, "will not remove /")
	}
	if e.Dir {
		kids, err := f.list(p)
		if err != nil {
			return err
		}
		if len(kids) > 0 && !recursive {
			return errorf(errConflict, "%s: directory not empty", p)
		}
		for q := range f.upper {
			if strings.HasPrefix(q, p+"/") {
				delete(f.upper, q)
			}
		}
	}
	delete(f.upper, p)
	if f.lower != nil && !f.hidden(p) {
		if _, err := f.lower.Lstat("." + p); err == nil {
			f.gone[p] = true
		}
	}
	return nil
}

// list returns the names in directory p, sorted.
func (f *guestFS) list(p string) ([]string, error) {
	p = clean(p)
	e, err := f.lookup(p)
	if err != nil {
		return nil, err
	}
	if !e.Dir {
		return nil, errorf(errInvalid, "%s: not a directory", p)
	}
	names := map[string]bool{}
	if f.lower != nil && !f.hidden(p) && !(f.upper[p] != nil && f.upper[p].Opaque) {
		if d, err := f.lower.Open("." + p); err == nil {
			ents, _ := d.ReadDir(-1)
			d.Close()
			for _, de := range ents {
				if !f.gone[path.Join(p, de.Name())] {
					names[de.Name()] = true
				}
			}
		}
	}
	for q := range f.upper {
		if q != p && path.Dir(q) == p {
			names[path.Base(q)] = true
		}
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// move renames from to to (a file, or a directory of the writable layer).
func (f *guestFS) move(from, to string) error {
	from, to = clean(from), clean(to)
	e, err := f.lookup(from)
	if err != nil {
		return err
	}
	if !f.isDir(path.Dir(to)) {
		return errorf(errNotFound, "%s: no such directory", path.Dir(to))
	}
	if e.Dir {
		if e.fromLower {
			return errorf(errInvalid, "%s: moving a template directory is not supported by the fake runtime", from)
		}
		for q, n := range f.upper {
			if strings.HasPrefix(q, from+"/") {
				delete(f.upper, q)
				f.upper[to+strings.TrimPrefix(q, from)] = n
			}
		}
		n := e.node
		f.upper[to] = &n
	} else {
		data, err := f.read(from)
		if err != nil {
			return err
		}
		if err := f.write(to, data, e.Mode, e.UID); err != nil {
			return err
		}
	}
	delete(f.upper, from)
	if e.fromLower {
		f.gone[from] = true
	}
	return nil
}

// clone is an independent copy of the writable layer over the same template.
func (f *guestFS) clone() *guestFS {
	c := &guestFS{lower: f.lower, upper: make(map[string]*node, len(f.upper)), gone: make(map[string]bool, len(f.gone)), meminfo: f.meminfo}
	for p, n := range f.upper {
		cp := *n
		cp.Data = slices.Clone(n.Data)
		c.upper[p] = &cp
	}
	for p := range f.gone {
		c.gone[p] = true
	}
	return c
}
