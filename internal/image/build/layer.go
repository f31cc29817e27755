package build

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/image/oci"
)

// Overlay is the root filesystem of one RUN step: an overlayfs mount of
// the parent's tree (read-only lower) with its upper layer on a tmpfs of
// bounded size, so that a step cannot write more than that to the host,
// and what it changed is exactly the upper layer.
type Overlay struct {
	dir    string // scratch: tmpfs at dir/t (upper, work), mount at dir/merged
	Merged string
	Upper  string
	tmpfs  bool
	merged bool
}

// MountOverlay mounts lower under a fresh directory dir (which must not
// exist) with an upper layer of at most sizeMiB.
func MountOverlay(dir, lower string, sizeMiB int) (_ *Overlay, err error) {
	if strings.ContainsAny(lower, ",:") {
		return nil, fmt.Errorf("build: overlay lower %q: commas and colons cannot be passed to overlayfs", lower)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("build: overlay: %w", err)
	}
	o := &Overlay{dir: dir, Merged: filepath.Join(dir, "merged"), Upper: filepath.Join(dir, "t", "upper")}
	defer func() {
		if err != nil {
			err = errors.Join(err, o.Release())
		}
	}()
	t := filepath.Join(dir, "t")
	for _, d := range []string{t, o.Merged} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return o, fmt.Errorf("build: overlay: %w", err)
		}
	}
	if err := unix.Mount("tmpfs", t, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.Itoa(sizeMiB)+"m,mode=0700"); err != nil {
		return o, fmt.Errorf("build: mount the step's upper layer (tmpfs): %w", err)
	}
	o.tmpfs = true
	work := filepath.Join(t, "work")
	for _, d := range []string{o.Upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return o, fmt.Errorf("build: overlay: %w", err)
		}
	}
	// The upper layer must stand on its own: no redirects, metadata-only
	// copies or index entries that point back into lower.
	opts := "lowerdir=" + lower + ",upperdir=" + o.Upper + ",workdir=" + work + ",redirect_dir=off,metacopy=off,index=off,xino=off"
	if err := unix.Mount("overlay", o.Merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return o, fmt.Errorf("build: mount the step's root (overlayfs): %w", err)
	}
	o.merged = true
	return o, nil
}

// Unmount unmounts the merged view (the upper layer stays, for Apply).
func (o *Overlay) Unmount() error {
	if !o.merged {
		return nil
	}
	if err := unix.Unmount(o.Merged, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		if err2 := unix.Unmount(o.Merged, unix.MNT_DETACH); err2 != nil {
			return fmt.Errorf("build: unmount %s: %w", o.Merged, err)
		}
	}
	o.merged = false
	return nil
}

// Release unmounts everything and removes the scratch directory.
func (o *Overlay) Release() error {
	err := o.Unmount()
	if o.tmpfs {
		t := filepath.Join(o.dir, "t")
		if uerr := unix.Unmount(t, 0); uerr != nil && !errors.Is(uerr, unix.EINVAL) {
			if uerr = unix.Unmount(t, unix.MNT_DETACH); uerr != nil {
				return errors.Join(err, fmt.Errorf("build: unmount %s: %w", t, uerr))
			}
		}
		o.tmpfs = false
	}
	return errors.Join(err, os.RemoveAll(o.dir))
}

// ReleaseStale releases what MountOverlay left under dir after a crash:
// every mount below it, then the tree.
func ReleaseStale(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mounts = append(mounts, f[4])
		}
	}
	// Deepest first: the merged view, then the tmpfs under it.
	for i := len(mounts) - 1; i >= 0; i-- {
		unix.Unmount(mounts[i], unix.MNT_DETACH)
	}
	return os.RemoveAll(dir)
}

// Clone makes dst (which must not exist) a copy of the tree src in which
// every non-directory is a hard link to src's: instant, and safe because
// template trees are never written in place (sandboxes write to overlays,
// and Apply and the COPY step replace a name instead of writing through
// it).
func Clone(src, dst string) error {
	// cp -a keeps owners, modes, times and extended attributes of the
	// directories it creates; -l links everything else.
	out, err := exec.Command("cp", "-a", "-l", "--no-target-directory", src, dst).CombinedOutput()
	if err != nil && strings.Contains(string(out), "cross-device") {
		// src on another file system (a catalog moved by hand): a copy.
		os.RemoveAll(dst)
		out, err = exec.Command("cp", "-a", "--no-target-directory", src, dst).CombinedOutput()
	}
	if err != nil {
		return fmt.Errorf("build: clone %s: %v: %s", src, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ApplyStats counts what Apply did.
type ApplyStats struct {
	Files, Dirs, Symlinks, Removed int
	Bytes                          int64
	Skipped                        int // device nodes, sockets, fifos: never kept
}

// Apply writes an overlayfs upper layer (a RUN step's changes) onto dst,
// a clone of the step's lower tree: whiteouts remove, opaque directories
// drop what was below, everything else replaces the name in dst (never
// written through: dst's files are hard links shared with other trees).
// The upper layer was written by a hostile guest: nothing in it is
// followed (symbolic links are data), and every write into dst goes
// through an os.Root.
func Apply(upper, dst string) (ApplyStats, error) {
	var st ApplyStats
	root, err := os.OpenRoot(dst)
	if err != nil {
		return st, fmt.Errorf("build: apply: %w", err)
	}
	defer root.Close()
	type inode struct{ dev, ino uint64 }
	linked := map[inode]string{} // upper files with several names: the first one's name in dst
	type dirMeta struct {
		rel string
		fi  fs.FileInfo
		src string
	}
	var dirs []dirMeta
	err = filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		sys := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode()
		switch {
		case mode.IsDir():
			if rel != "." {
				if cur, err := root.Lstat(rel); err == nil && !cur.IsDir() {
					if err := root.RemoveAll(rel); err != nil {
						return err
					}
				}
				if err := root.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
					return err
				}
			}
			if isOpaque(p) {
				if err := clearDir(root, rel); err != nil {
					return err
				}
			}
			st.Dirs++
			dirs = append(dirs, dirMeta{rel, fi, p})
			return nil
		case mode&fs.ModeCharDevice != 0 && sys.Rdev == 0:
			// A whiteout: the name is gone.
			if err := root.RemoveAll(rel); err != nil {
				return err
			}
			st.Removed++
			return nil
		case mode.IsRegular():
			if err := root.RemoveAll(rel); err != nil {
				return err
			}
			key := inode{uint64(sys.Dev), sys.Ino}
			if first, ok := linked[key]; ok {
				st.Files++
				return root.Link(first, rel)
			}
			if sys.Nlink > 1 {
				linked[key] = rel
			}
			n, err := copyFile(root, rel, p, fi)
			st.Files++
			st.Bytes += n
			return err
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := root.RemoveAll(rel); err != nil {
				return err
			}
			if err := root.Symlink(target, rel); err != nil {
				return err
			}
			st.Symlinks++
			return root.Lchown(rel, int(sys.Uid), int(sys.Gid))
		default:
			// Device nodes, fifos, sockets: a template holds none (in a
			// sandbox /dev is its own), as an imported image holds none.
			if err := root.RemoveAll(rel); err != nil {
				return err
			}
			st.Skipped++
			return nil
		}
	})
	if err != nil {
		return st, fmt.Errorf("build: apply the step's changes: %w", err)
	}
	// Directories' owners, modes, attributes and times once their children
	// are in (deepest first).
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		sys := d.fi.Sys().(*syscall.Stat_t)
		if err := setMeta(root, d.rel, d.src, d.fi, int(sys.Uid), int(sys.Gid)); err != nil {
			return st, fmt.Errorf("build: apply the step's changes: %w", err)
		}
	}
	return st, nil
}

// isOpaque reports whether upper directory p hides everything below it.
func isOpaque(p string) bool {
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// clearDir removes every entry of directory rel of root.
func clearDir(root *os.Root, rel string) error {
	f, err := root.Open(rel)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := root.RemoveAll(filepath.Join(rel, n)); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies upper file src to rel in root, with its owner, mode,
// kept attributes and times.
func copyFile(root *os.Root, rel, src string, fi fs.FileInfo) (int64, error) {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, err
	}
	sys := fi.Sys().(*syscall.Stat_t)
	return n, setMeta(root, rel, src, fi, int(sys.Uid), int(sys.Gid))
}

// setMeta gives rel in root the owner, permission bits, kept extended
// attributes and modification time of upper entry src (fi). The owner
// comes first: a chown clears setuid and setgid.
func setMeta(root *os.Root, rel, src string, fi fs.FileInfo, uid, gid int) error {
	f, err := root.OpenFile(rel, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Chown(uid, gid); err != nil {
		return err
	}
	if err := copyXattrs(src, int(f.Fd())); err != nil {
		return err
	}
	if err := f.Chmod(fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)); err != nil {
		return err
	}
	return root.Chtimes(rel, fi.ModTime(), fi.ModTime())
}

// copyXattrs copies src's kept extended attributes to fd (bounded: 64 KiB
// of names, 64 KiB per value).
func copyXattrs(src string, fd int) error {
	names := make([]byte, 64<<10)
	n, err := unix.Llistxattr(src, names)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ERANGE) {
			return nil
		}
		return err
	}
	val := make([]byte, 64<<10)
	for _, name := range strings.Split(string(names[:n]), "\x00") {
		if name == "" || !oci.KeptXattr(name) {
			continue
		}
		vn, err := unix.Lgetxattr(src, name, val)
		if err != nil {
			continue
		}
		if err := unix.Fsetxattr(fd, name, val[:vn], 0); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}
