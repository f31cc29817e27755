package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Path walking for the file API's writes (write, mkdir, move, remove).
//
// The agent is root, and guest code running as any user can plant symlinks
// in directories it can write (its home, /tmp). Were the agent to follow
// them, a write to /home/user/link/passwd could land in /etc. So a path's
// parent directories are walked one component at a time from "/", each
// opened relative to the one before with O_NOFOLLOW|O_DIRECTORY, and a
// symlink among them is followed only if root owns it (the template's
// own, such as /bin -> usr/bin); one owned by any other user is refused
// with an error naming it and its target. New directories are made with
// mkdirat and then chmodded and chowned through their own fd, never by
// path. The last component is never followed: a write replaces a symlink
// there with the file, a remove removes the symlink.

// maxSymlinks bounds the symlinks followed in one walk (Linux: 40).
const maxSymlinks = 40

// symlinkRefused is the error for a symlink the walk does not follow (400).
func symlinkRefused(path, target string, uid int) error {
	return errorf(errInvalid, "%s is a symlink to %s made by uid %d: the file API follows only symlinks owned by root "+
		"in a path's directories (guest code can plant the others); use the path it points to", path, target, uid)
}

// walker walks directories by fd.
type walker struct {
	// create makes missing directories with mode, chowned to u if chown.
	create bool
	mode   fs.FileMode
	u      user
	chown  bool
}

// openDir opens dir (absolute, clean) as a directory fd, following only
// root-owned symlinks, creating missing components when w.create. The
// caller closes the file.
func (w walker) openDir(dir string) (*os.File, error) {
	if !filepath.IsAbs(dir) {
		return nil, errorf(errInvalid, "path %s is not absolute", dir)
	}
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /: %w", err)
	}
	cur := "/" // the path walked so far, for messages and symlink targets
	comps := splitPath(dir)
	hops := 0
	for len(comps) > 0 {
		c := comps[0]
		comps = comps[1:]
		if c == "." || c == "" {
			continue
		}
		next, err := openDirAt(fd, c)
		if err == nil {
			unix.Close(fd)
			fd, cur = next, joinPath(cur, c)
			continue
		}
		here := joinPath(cur, c)
		switch {
		case errors.Is(err, unix.ENOENT) && w.create && c != "..":
			next, err = w.mkdirAt(fd, c, here, len(comps) == 0)
			if err != nil {
				unix.Close(fd)
				return nil, err
			}
			unix.Close(fd)
			fd, cur = next, here
			continue
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			var st unix.Stat_t
			if serr := unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW); serr != nil {
				unix.Close(fd)
				return nil, &fs.PathError{Op: "stat", Path: here, Err: serr}
			}
			if st.Mode&unix.S_IFMT != unix.S_IFLNK {
				unix.Close(fd)
				return nil, errorf(errConflict, "%s exists and is not a directory", here)
			}
			target, rerr := readlinkAt(fd, c)
			if rerr != nil {
				unix.Close(fd)
				return nil, &fs.PathError{Op: "readlink", Path: here, Err: rerr}
			}
			if st.Uid != 0 {
				unix.Close(fd)
				return nil, symlinkRefused(here, target, int(st.Uid))
			}
			if hops++; hops > maxSymlinks {
				unix.Close(fd)
				return nil, &fs.PathError{Op: "open", Path: dir, Err: syscall.ELOOP}
			}
			comps = append(splitPath(target), comps...)
			if strings.HasPrefix(target, "/") {
				root, oerr := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
				if oerr != nil {
					unix.Close(fd)
					return nil, fmt.Errorf("open /: %w", oerr)
				}
				unix.Close(fd)
				fd, cur = root, "/"
			}
			continue
		default:
			unix.Close(fd)
			return nil, &fs.PathError{Op: "open", Path: here, Err: err}
		}
	}
	return os.NewFile(uintptr(fd), cur), nil
}

// mkdirAt makes directory name in dirfd and opens it without following a
// symlink (one swapped in after mkdirat fails the open). Intermediate
// directories get 0755, the last w.mode. A directory that appeared
// concurrently is used as is.
func (w walker) mkdirAt(dirfd int, name, path string, last bool) (int, error) {
	mode := fs.FileMode(0o755)
	if last {
		mode = w.mode
	}
	made := true
	if err := unix.Mkdirat(dirfd, name, uint32(mode.Perm())); err != nil {
		if !errors.Is(err, unix.EEXIST) {
			return -1, &fs.PathError{Op: "mkdir", Path: path, Err: err}
		}
		made = false
	}
	fd, err := openDirAt(dirfd, name)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			if !made {
				return -1, errorf(errConflict, "%s exists and is not a directory", path)
			}
			return -1, errorf(errConflict, "%s was replaced by something that is not a directory while it was created", path)
		}
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	if !made {
		return fd, nil
	}
	if err := unix.Fchmod(fd, uint32(syscallMode(mode))); err != nil {
		unix.Close(fd)
		return -1, &fs.PathError{Op: "chmod", Path: path, Err: err}
	}
	if w.chown {
		if err := unix.Fchown(fd, w.u.UID, w.u.GID); err != nil {
			unix.Close(fd)
			return -1, &fs.PathError{Op: "chown", Path: path, Err: err}
		}
	}
	return fd, nil
}

// openDirAt opens directory name in dirfd without following a symlink
// (ELOOP) and fails with ENOTDIR on anything but a directory. Not with
// O_DIRECTORY: gVisor follows a final symlink under O_DIRECTORY even with
// O_NOFOLLOW. O_NONBLOCK keeps a FIFO from blocking the open.
func openDirAt(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return -1, unix.ENOTDIR
	}
	return fd, nil
}

// syscallMode is mode's permission and setuid/setgid/sticky bits.
func syscallMode(m fs.FileMode) uint32 {
	o := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		o |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		o |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		o |= unix.S_ISVTX
	}
	return o
}

func readlinkAt(dirfd int, name string) (string, error) {
	for n := 256; ; n *= 2 {
		buf := make([]byte, n)
		k, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if k < n {
			return string(buf[:k]), nil
		}
	}
}

func splitPath(p string) []string {
	return strings.FieldsFunc(p, func(r rune) bool { return r == '/' })
}

func joinPath(dir, name string) string {
	if name == ".." {
		return filepath.Dir(dir)
	}
	return filepath.Join(dir, name)
}

// openParent opens the directory that holds path (absolute, clean) and
// returns it with path's last component.
func (w walker) openParent(path string) (*os.File, string, error) {
	base := filepath.Base(path)
	if path == "/" || base == "/" || base == "." || base == ".." {
		return nil, "", errorf(errInvalid, "%s has no parent directory and name", path)
	}
	d, err := w.openDir(filepath.Dir(path))
	if err != nil {
		return nil, "", err
	}
	return d, base, nil
}

// removeAt removes name in dir (recursive: a whole tree), never following
// a symlink.
func removeAt(dir *os.File, name string, recursive bool) error {
	dfd := int(dir.Fd())
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "remove", Path: filepath.Join(dir.Name(), name), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(dfd, name, 0); err != nil {
			return &fs.PathError{Op: "remove", Path: filepath.Join(dir.Name(), name), Err: err}
		}
		return nil
	}
	if recursive {
		fd, err := openDirAt(dfd, name)
		if err != nil {
			return &fs.PathError{Op: "remove", Path: filepath.Join(dir.Name(), name), Err: err}
		}
		sub := os.NewFile(uintptr(fd), filepath.Join(dir.Name(), name))
		for {
			names, err := sub.Readdirnames(1024)
			for _, n := range names {
				if rerr := removeAt(sub, n, true); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
					sub.Close()
					return rerr
				}
			}
			if err != nil || len(names) == 0 {
				break
			}
			// Entries were removed: read the directory from its start again.
			if _, err := sub.Seek(0, 0); err != nil {
				break
			}
		}
		sub.Close()
	}
	if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil {
		return &fs.PathError{Op: "remove", Path: filepath.Join(dir.Name(), name), Err: err}
	}
	return nil
}
