package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/model"
)

// Whiteout names of the OCI image layer format.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// ErrRefused marks a layer entry that would reach outside the root or
// through a symbolic link; the import stops at it.
var ErrRefused = errors.New("refused")

// applier writes image layers, one after the other, into one root
// directory. Every operation goes through an os.Root (so nothing resolves
// outside the root), and on top of that no path is ever resolved through a
// symbolic link: an entry whose parent is a symlink is refused, a name is
// removed before it is created (O_EXCL, never written through), and a hard
// link's target must be a non-directory reached without symlinks.
type applier struct {
	root   *os.Root
	owners bool // chown entries to the layer's uid/gid (needs root)
	limits Limits
	report *Report
	// copy, for CopyTar: no whiteouts, and every entry's owner (and
	// perhaps permission bits) overridden.
	copy *CopyOptions

	bytes   int64           // uncompressed layer bytes read, all layers
	entries int             // tar entries, all layers
	devices map[string]bool // device nodes not created (a hard link to one is skipped too)

	// Per layer.
	layer     int             // 1-based, for errors
	written   map[string]bool // paths this layer wrote
	ancestors map[string]bool // directories above a path this layer wrote
	dirs      []dirMeta       // metadata applied when the layer ends
}

// dirMeta is a directory's mode and times, set after its children are
// written (a read-only directory must still take them; writing a child
// changes its mtime).
type dirMeta struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

func (a *applier) errorf(name, format string, args ...any) error {
	return fmt.Errorf("layer %d: entry %q: %s: %w", a.layer, name, fmt.Sprintf(format, args...), ErrRefused)
}

// apply reads one layer's tar stream and writes it into the root.
func (a *applier) apply(ctx context.Context, r io.Reader, layer int) error {
	a.layer = layer
	a.written = map[string]bool{}
	a.ancestors = map[string]bool{}
	a.dirs = a.dirs[:0]
	lr := &limitedReader{r: r, left: a.limits.MaxBytes - a.bytes}
	defer func() { a.bytes += lr.n }()
	tooLarge := func() error {
		return fmt.Errorf("layer %d: the image's layers hold more than %d bytes (Limits.MaxBytes): %w", layer, a.limits.MaxBytes, model.ErrInvalid)
	}
	tr := tar.NewReader(lr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if lr.over {
			return tooLarge()
		}
		if err != nil {
			return fmt.Errorf("layer %d: read tar: %w", layer, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		a.entries++
		if a.entries > a.limits.MaxEntries {
			return fmt.Errorf("layer %d: the image has more than %d entries (Limits.MaxEntries): %w", layer, a.limits.MaxEntries, model.ErrInvalid)
		}
		if err := a.entry(hdr, tr); err != nil {
			if lr.over {
				return tooLarge()
			}
			return err
		}
	}
	// The rest of the stream (tar padding) counts and is hashed by the caller.
	if _, err := io.Copy(io.Discard, lr); err != nil {
		if lr.over {
			return tooLarge()
		}
		return fmt.Errorf("layer %d: read: %w", layer, err)
	}
	// Deepest first, so that setting a parent's mtime comes after its children.
	for i := len(a.dirs) - 1; i >= 0; i-- {
		d := a.dirs[i]
		fi, err := a.root.Lstat(d.name)
		if err != nil || !fi.IsDir() {
			continue // replaced later in the layer
		}
		if err := a.root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("layer %d: chmod %s: %w", layer, d.name, err)
		}
		if err := a.root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return fmt.Errorf("layer %d: set times of %s: %w", layer, d.name, err)
		}
	}
	return nil
}

// limitedReader reads at most left bytes; one byte more sets over and fails.
type limitedReader struct {
	r    io.Reader
	left int64
	n    int64
	over bool
}

var errTooLarge = errors.New("size limit reached")

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One probe byte tells a stream that ends exactly at the limit
		// from one that goes on.
		var b [1]byte
		n, err := l.r.Read(b[:])
		if n > 0 {
			l.over = true
			return 0, errTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	l.n += int64(n)
	return n, err
}

// cleanName turns a tar name into a path relative to the root ("." is the
// root itself), refusing absolute names and any ".." component.
func cleanName(name string) (string, bool) {
	if strings.HasPrefix(name, "/") || strings.ContainsRune(name, 0) {
		return "", false
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", false
		}
	}
	return path.Clean(name), true
}

func (a *applier) entry(hdr *tar.Header, tr *tar.Reader) error {
	name, ok := cleanName(hdr.Name)
	if !ok {
		return a.errorf(hdr.Name, "the name leaves the root (an absolute path or a .. component)")
	}
	if c := a.copy; c != nil && c.Rename != nil {
		if n, ok := c.Rename[name]; ok {
			if name, ok = cleanName(n); !ok || name == "." {
				return a.errorf(hdr.Name, "renamed to %q, which leaves the root", n)
			}
		}
	}
	dir, base := path.Split(name)
	dir = path.Clean(dir)
	if c := a.copy; c != nil {
		hdr.Uid, hdr.Gid = c.UID, c.GID
		if c.Mode != nil && (hdr.Typeflag == tar.TypeDir || hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA) {
			hdr.Mode = hdr.Mode&^0o7777 | int64(*c.Mode&0o7777)
		}
		base = "" // a copied file named .wh.* is a file
	}

	// Whiteouts delete from the layers below; they are never files.
	if base == opaqueMarker {
		if err := a.parents(name, hdr.Name, true); err != nil {
			return err
		}
		return a.opaque(dir)
	}
	if base != "" && strings.HasPrefix(base, whiteoutPrefix) {
		target := strings.TrimPrefix(base, whiteoutPrefix)
		if strings.HasPrefix(target, whiteoutPrefix) {
			return nil // other AUFS metadata (.wh..wh.plnk, …): nothing to apply
		}
		if target == "" || target == "." || target == ".." {
			return a.errorf(hdr.Name, "a whiteout of %q", target)
		}
		if err := a.parents(name, hdr.Name, false); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // nothing below to hide
			}
			return err
		}
		p := path.Join(dir, target)
		if a.written[p] || a.ancestors[p] {
			return nil // a whiteout hides lower layers only
		}
		if err := a.root.RemoveAll(p); err != nil {
			return fmt.Errorf("layer %d: whiteout %s: %w", a.layer, p, err)
		}
		return nil
	}

	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock:
		// Never created: a device node in the template directory would be
		// a device of the host, usable by whoever reaches the file; in a
		// sandbox, /dev is its own.
		a.report.skipDevice(name)
		if a.devices == nil {
			a.devices = map[string]bool{}
		}
		if len(a.devices) < 1<<16 {
			a.devices[name] = true
		}
		return nil
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return a.errorf(hdr.Name, "the root must be a directory")
		}
		return a.dir(name, hdr)
	}
	if err := a.parents(name, hdr.Name, true); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		err := a.dir(name, hdr)
		a.mark(name)
		return err
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		if err := a.replace(name, false); err != nil {
			return err
		}
		a.mark(name)
		return a.file(name, hdr, tr)
	case tar.TypeSymlink:
		if err := a.replace(name, false); err != nil {
			return err
		}
		a.mark(name)
		return a.symlink(name, hdr)
	case tar.TypeLink:
		return a.link(name, hdr)
	case tar.TypeFifo:
		if err := a.replace(name, false); err != nil {
			return err
		}
		a.mark(name)
		return a.fifo(name, hdr)
	default:
		return fmt.Errorf("layer %d: entry %q: unsupported tar entry type %q: %w", a.layer, hdr.Name, hdr.Typeflag, model.ErrInvalid)
	}
}

// mark records that this layer wrote name.
func (a *applier) mark(name string) {
	a.written[name] = true
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		if a.ancestors[d] {
			break
		}
		a.ancestors[d] = true
	}
	a.ancestors["."] = true
}

// parents checks every directory above name: each must be a directory, not
// a symbolic link; a missing one is created (0755, root) when create is
// set and otherwise reported as fs.ErrNotExist.
func (a *applier) parents(name, raw string, create bool) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fi, err := a.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if !create {
				return fs.ErrNotExist
			}
			if err := a.root.Mkdir(p, 0o755); err != nil {
				return fmt.Errorf("layer %d: create directory %s: %w", a.layer, p, err)
			}
			if err := a.root.Chmod(p, 0o755); err != nil { // past the umask
				return fmt.Errorf("layer %d: chmod %s: %w", a.layer, p, err)
			}
			a.mark(p)
		case err != nil:
			return fmt.Errorf("layer %d: %s: %w", a.layer, p, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			return a.errorf(raw, "its parent %q is a symbolic link; writing through symbolic links is refused", p)
		case !fi.IsDir():
			return a.errorf(raw, "its parent %q is not a directory", p)
		}
	}
	return nil
}

// replace removes what is at name unless both it and the new entry are
// directories (then the directory stays and takes the new metadata).
func (a *applier) replace(name string, isDir bool) error {
	fi, err := a.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("layer %d: %s: %w", a.layer, name, err)
	}
	if isDir && fi.IsDir() {
		return nil
	}
	if err := a.root.RemoveAll(name); err != nil {
		return fmt.Errorf("layer %d: replace %s: %w", a.layer, name, err)
	}
	return nil
}

// opaque removes from dir everything the layers below put there, keeping
// what this layer wrote (before the marker, or as a parent of a later entry).
func (a *applier) opaque(dir string) error {
	if dir != "." {
		fi, err := a.root.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("layer %d: opaque %s: %w", a.layer, dir, err)
		}
		if !fi.IsDir() {
			return nil // no directory below to make opaque
		}
	}
	f, err := a.root.Open(dir)
	if err != nil {
		return fmt.Errorf("layer %d: opaque %s: %w", a.layer, dir, err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("layer %d: opaque %s: %w", a.layer, dir, err)
	}
	slices.Sort(names)
	for _, n := range names {
		p := path.Join(dir, n)
		if !a.written[p] && !a.ancestors[p] {
			if err := a.root.RemoveAll(p); err != nil {
				return fmt.Errorf("layer %d: opaque %s: %w", a.layer, dir, err)
			}
			continue
		}
		if fi, err := a.root.Lstat(p); err == nil && fi.IsDir() {
			if err := a.opaque(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// fileMode turns a tar mode into a FileMode with setuid, setgid and sticky.
func fileMode(m int64) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

func (a *applier) dir(name string, hdr *tar.Header) error {
	if err := a.replace(name, true); err != nil {
		return err
	}
	if name != "." {
		if err := a.root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("layer %d: mkdir %s: %w", a.layer, name, err)
		}
	}
	f, err := a.root.OpenFile(name, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("layer %d: open %s: %w", a.layer, name, err)
	}
	defer f.Close()
	if err := a.meta(f, name, hdr); err != nil {
		return err
	}
	// Mode and times once the children are in.
	a.dirs = append(a.dirs, dirMeta{name: name, mode: fileMode(hdr.Mode), mtime: hdr.ModTime})
	return nil
}

// meta sets the owner and the extended attributes of an open entry.
func (a *applier) meta(f *os.File, name string, hdr *tar.Header) error {
	if a.owners {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("layer %d: chown %s: %w", a.layer, name, err)
		}
	}
	return a.xattrs(f, name, hdr)
}

func (a *applier) file(name string, hdr *tar.Header, tr *tar.Reader) error {
	f, err := a.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("layer %d: create %s: %w", a.layer, name, err)
	}
	if _, err := io.Copy(f, tr); err != nil {
		f.Close()
		return fmt.Errorf("layer %d: write %s: %w", a.layer, name, err)
	}
	// chown before chmod: a chown clears setuid and setgid.
	if err := a.meta(f, name, hdr); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(fileMode(hdr.Mode)); err != nil {
		f.Close()
		return fmt.Errorf("layer %d: chmod %s: %w", a.layer, name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("layer %d: write %s: %w", a.layer, name, err)
	}
	if err := a.root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
		return fmt.Errorf("layer %d: set times of %s: %w", a.layer, name, err)
	}
	return nil
}

func (a *applier) symlink(name string, hdr *tar.Header) error {
	if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
		return fmt.Errorf("layer %d: entry %q: symbolic link without a valid target: %w", a.layer, hdr.Name, model.ErrInvalid)
	}
	// The target is data, whatever it says (it may well be absolute): it is
	// never followed here, and in the sandbox it resolves in the sandbox.
	if err := a.root.Symlink(hdr.Linkname, name); err != nil {
		return fmt.Errorf("layer %d: symlink %s: %w", a.layer, name, err)
	}
	if a.owners {
		if err := a.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("layer %d: chown %s: %w", a.layer, name, err)
		}
	}
	if n := len(xattrsOf(hdr)); n > 0 {
		a.report.XattrsSkipped += n // no fd for a symlink; none are kept
	}
	return nil
}

func (a *applier) link(name string, hdr *tar.Header) error {
	target, ok := cleanName(hdr.Linkname)
	if !ok || target == "." {
		return a.errorf(hdr.Name, "hard link to %q, which leaves the root", hdr.Linkname)
	}
	if target == name {
		return a.errorf(hdr.Name, "hard link to itself")
	}
	if a.devices[target] {
		a.report.skipDevice(name) // a second name of a device node
		return nil
	}
	if err := a.parents(target, hdr.Name, false); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return a.errorf(hdr.Name, "hard link to %q, which does not exist", hdr.Linkname)
		}
		return err
	}
	fi, err := a.root.Lstat(target)
	if err != nil {
		return a.errorf(hdr.Name, "hard link to %q, which does not exist", hdr.Linkname)
	}
	if fi.IsDir() {
		return a.errorf(hdr.Name, "hard link to the directory %q", hdr.Linkname)
	}
	if err := a.replace(name, false); err != nil {
		return err
	}
	a.mark(name)
	// linkat without AT_SYMLINK_FOLLOW: a link to a symlink links the
	// symlink itself.
	if err := a.root.Link(target, name); err != nil {
		return fmt.Errorf("layer %d: hard link %s to %s: %w", a.layer, name, target, err)
	}
	return nil
}

func (a *applier) fifo(name string, hdr *tar.Header) error {
	dir, base := path.Split(name)
	d, err := a.root.OpenFile(path.Clean(dir), os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("layer %d: open %s: %w", a.layer, dir, err)
	}
	defer d.Close()
	fd := int(d.Fd())
	if err := unix.Mkfifoat(fd, base, 0o600); err != nil {
		return fmt.Errorf("layer %d: mkfifo %s: %w", a.layer, name, err)
	}
	if a.owners {
		if err := unix.Fchownat(fd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("layer %d: chown %s: %w", a.layer, name, err)
		}
	}
	if err := unix.Fchmodat(fd, base, uint32(hdr.Mode&0o7777), 0); err != nil {
		return fmt.Errorf("layer %d: chmod %s: %w", a.layer, name, err)
	}
	return nil
}

// xattrsOf returns the entry's extended attributes (PAX SCHILY.xattr.*).
func xattrsOf(hdr *tar.Header) map[string]string {
	var out map[string]string
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			if out == nil {
				out = map[string]string{}
			}
			out[name] = v
		}
	}
	return out
}

// keptXattr reports whether an extended attribute is restored: user.*
// (except user.overlay.*, which overlayfs would read as its own) and file
// capabilities. trusted.* (overlayfs' own, again), security.selinux and
// other security labels are the host's business, not an image's.
func keptXattr(name string) bool {
	switch {
	case name == "security.capability":
		return true
	case strings.HasPrefix(name, "user.overlay."):
		return false
	case strings.HasPrefix(name, "user."):
		return true
	}
	return false
}

// xattrs sets the kept extended attributes on the open file; a file system
// that takes none (ENOTSUP), or refuses one (EPERM), is counted, not fatal.
func (a *applier) xattrs(f *os.File, name string, hdr *tar.Header) error {
	xs := xattrsOf(hdr)
	if len(xs) == 0 {
		return nil
	}
	keys := make([]string, 0, len(xs))
	for k := range xs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !keptXattr(k) {
			a.report.XattrsSkipped++
			continue
		}
		err := unix.Fsetxattr(int(f.Fd()), k, []byte(xs[k]), 0)
		switch {
		case err == nil:
			a.report.Xattrs++
		case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EPERM), errors.Is(err, unix.EINVAL):
			a.report.XattrsSkipped++
		default:
			return fmt.Errorf("layer %d: set %s on %s: %w", a.layer, k, name, err)
		}
	}
	return nil
}

// CopyOptions configure CopyTar.
type CopyOptions struct {
	// UID and GID own every entry written (a COPY's files are root's
	// unless --chown says otherwise, whatever the tar says).
	UID, GID int
	// Mode, if set, replaces the permission bits of files and directories.
	Mode *fs.FileMode
	// Rename maps entry names (cleaned, as "a/b") to the names written.
	Rename map[string]string
	Limits Limits
}

// CopyTar writes the entries of tar stream r into root with the
// confinement of an image layer (nothing resolves outside root or through
// a symbolic link; a name is removed before it is written, never written
// through, so a hard link into another tree is replaced, not changed), but
// with no whiteouts: a file named .wh.x is a file. It is the COPY of a
// template build.
func CopyTar(ctx context.Context, root *os.Root, r io.Reader, o CopyOptions) (Report, error) {
	var rep Report
	a := &applier{root: root, owners: true, limits: o.Limits.withDefaults(), report: &rep, copy: &o}
	err := a.apply(ctx, r, 1)
	return rep, err
}

// AddAgent puts the guest agent binary at AgentPath in root (root-owned,
// 0755), replacing whatever is there without writing through it; the
// template builder uses it on every result, as Import does.
func AddAgent(root *os.Root, agent string) error {
	var rep Report
	return addAgent(&applier{root: root, owners: true, report: &rep}, agent)
}

// KeptXattr reports whether a template keeps an extended attribute
// (user.* but user.overlay.*, and file capabilities): as an image layer's
// are filtered, so are a build step's.
func KeptXattr(name string) bool { return keptXattr(name) }
