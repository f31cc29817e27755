package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/agentapi"
)

// copyBuf is the buffer size for file bodies.
const copyBuf = 1 << 20

// resolve makes p absolute against the default home and cleans it.
func (a *Agent) resolve(p string) (string, error) {
	if p == "" {
		return "", errorf(errInvalid, "path is required")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(a.cfg.Home, p)
	}
	return filepath.Clean(p), nil
}

func parseMode(s string, def fs.FileMode) (fs.FileMode, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 0o7777 {
		return 0, errorf(errInvalid, "mode %q is not an octal permission", s)
	}
	m := fs.FileMode(n & 0o777)
	if n&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if n&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if n&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m, nil
}

// owner resolves the owner for new files. ok is false when the default user
// does not exist (then nothing is chowned); an explicit unknown owner is an error.
func (a *Agent) owner(db *userDB, name string) (u user, ok bool, err error) {
	if name == "" {
		u, ok = db.lookup(agentapi.DefaultUser)
		return u, ok, nil
	}
	u, ok = db.lookup(name)
	if !ok {
		return user{}, false, errorf(errInvalid, "owner %q does not exist", name)
	}
	return u, true, nil
}

func (a *Agent) fileInfo(db *userDB, path string, fi fs.FileInfo) agentapi.FileInfo {
	info := agentapi.FileInfo{Path: path, Name: fi.Name(), Size: fi.Size(), ModTime: fi.ModTime().UTC()}
	if path == "/" {
		info.Name = "/"
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		info.Type = "file"
	case m.IsDir():
		info.Type = "dir"
	case m&fs.ModeSymlink != 0:
		info.Type = "symlink"
		info.Target, _ = os.Readlink(path)
	default:
		info.Type = "other"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Mode = fmt.Sprintf("%04o", st.Mode&0o7777)
		info.UID, info.GID = int(st.Uid), int(st.Gid)
		info.Owner = db.userName(info.UID)
	} else {
		info.Mode = fmt.Sprintf("%04o", fi.Mode().Perm())
	}
	return info
}

func (a *Agent) stat(db *userDB, path string) (agentapi.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	return a.fileInfo(db, path, fi), nil
}

// mkdirAll creates dir and its missing parents with mode, chowning each
// created directory to u when chown is set. It follows only root-owned
// symlinks (see safepath.go).
func mkdirAll(dir string, mode fs.FileMode, u user, chown bool) error {
	d, err := walker{create: true, mode: mode, u: u, chown: chown}.openDir(dir)
	if err != nil {
		return err
	}
	return d.Close()
}

func (a *Agent) handleReadFile(w http.ResponseWriter, r *http.Request) {
	path, err := a.resolve(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	f, err := os.Open(path)
	if err != nil {
		writeError(w, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, err)
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, errorf(errInvalid, "%s is not a regular file", path))
		return
	}
	mode := fi.Mode().Perm()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		mode = fs.FileMode(st.Mode & 0o7777)
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	h.Set("X-Airlock-Mode", fmt.Sprintf("%04o", mode))
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, copyBuf)
	// Hide ReaderFrom/WriterTo so the 1 MiB buffer is used.
	_, _ = io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{io.LimitReader(f, fi.Size())}, buf)
}

func (a *Agent) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	info, err := a.writeFile(r, q.Get("path"), q.Get("mode"), q.Get("owner"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (a *Agent) writeFile(r *http.Request, rawPath, rawMode, ownerName string) (agentapi.FileInfo, error) {
	path, err := a.resolve(rawPath)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	mode, err := parseMode(rawMode, 0o644)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	db := a.users()
	u, chown, err := a.owner(db, ownerName)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	dir, base, err := walker{create: true, mode: 0o755, u: u, chown: chown}.openParent(path)
	if err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("create parent directories: %w", err)
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return agentapi.FileInfo{}, errorf(errConflict, "%s is a directory", path)
	}
	var tmp string
	var fd int
	for {
		tmp = "." + base + ".airlock-" + strconv.FormatUint(rand.Uint64(), 36)
		if len(tmp) > 255 {
			tmp = ".airlock-" + strconv.FormatUint(rand.Uint64(), 36)
		}
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("create temp file in %s: %w", dir.Name(), err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir.Name(), tmp))
	ok := false
	defer func() {
		if !ok {
			f.Close()
			_ = unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	buf := make([]byte, copyBuf)
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, struct{ io.Reader }{r.Body}, buf)
	if err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("write %s: %w", path, err)
	}
	if r.ContentLength >= 0 && n != r.ContentLength {
		return agentapi.FileInfo{}, errorf(errInvalid, "body has %d bytes, Content-Length says %d", n, r.ContentLength)
	}
	if err := f.Chmod(mode); err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("chmod %s: %w", path, err)
	}
	if chown {
		if err := f.Chown(u.UID, u.GID); err != nil {
			return agentapi.FileInfo{}, fmt.Errorf("chown %s: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("close %s: %w", path, err)
	}
	if err := unix.Renameat(dfd, tmp, dfd, base); err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("rename into %s: %w", path, err)
	}
	ok = true
	info, err := a.stat(db, filepath.Join(dir.Name(), base))
	info.Path = path
	return info, err
}

func (a *Agent) handleStat(w http.ResponseWriter, r *http.Request) {
	path, err := a.resolve(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	info, err := a.stat(a.users(), path)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (a *Agent) handleListDir(w http.ResponseWriter, r *http.Request) {
	path, err := a.resolve(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	limit, err := pageLimit(r)
	if err != nil {
		writeError(w, err)
		return
	}
	after := r.URL.Query().Get("after")
	d, err := os.Open(path)
	if err != nil {
		writeError(w, err)
		return
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		writeError(w, err)
		return
	}
	if !fi.IsDir() {
		writeError(w, errorf(errInvalid, "%s is not a directory", path))
		return
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		writeError(w, err)
		return
	}
	sort.Strings(names)
	i := sort.SearchStrings(names, after)
	if i < len(names) && names[i] == after {
		i++
	}
	names = names[i:]
	db := a.users()
	out := make([]agentapi.FileInfo, 0, min(len(names), limit+1))
	for _, n := range names {
		if len(out) > limit {
			break // one more tells whether a next page exists
		}
		p := filepath.Join(path, n)
		efi, err := os.Lstat(p)
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, a.fileInfo(db, p, efi))
	}
	writePage(w, out, limit, func(fi agentapi.FileInfo) string { return fi.Name })
}

func (a *Agent) handleMkdir(w http.ResponseWriter, r *http.Request) {
	var req agentapi.Mkdir
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	info, err := a.mkdir(req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (a *Agent) mkdir(req agentapi.Mkdir) (agentapi.FileInfo, error) {
	path, err := a.resolve(req.Path)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	mode, err := parseMode(req.Mode, 0o755)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	db := a.users()
	u, chown, err := a.owner(db, req.Owner)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	if err := mkdirAll(path, mode, u, chown); err != nil {
		return agentapi.FileInfo{}, err
	}
	return a.stat(db, path)
}

func (a *Agent) handleMove(w http.ResponseWriter, r *http.Request) {
	var req agentapi.Move
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	info, err := a.move(req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (a *Agent) move(req agentapi.Move) (agentapi.FileInfo, error) {
	from, err := a.resolve(req.From)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	to, err := a.resolve(req.To)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	src, srcBase, err := walker{}.openParent(from)
	if err != nil {
		return agentapi.FileInfo{}, err
	}
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(src.Fd()), srcBase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return agentapi.FileInfo{}, &fs.PathError{Op: "move", Path: from, Err: err}
	}
	db := a.users()
	u, chown, _ := a.owner(db, "")
	dst, dstBase, err := walker{create: true, mode: 0o755, u: u, chown: chown}.openParent(to)
	if err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("create parent directories: %w", err)
	}
	defer dst.Close()
	realFrom, realTo := filepath.Join(src.Name(), srcBase), filepath.Join(dst.Name(), dstBase)
	if err := unix.Renameat(int(src.Fd()), srcBase, int(dst.Fd()), dstBase); err != nil {
		if !errors.Is(err, syscall.EXDEV) {
			return agentapi.FileInfo{}, &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
		}
		// Across filesystems (e.g. into the /tmp tmpfs): copy, then remove.
		if err := copyTree(realFrom, realTo); err != nil {
			os.RemoveAll(realTo)
			return agentapi.FileInfo{}, fmt.Errorf("move across filesystems: %w", err)
		}
		if err := removeAt(src, srcBase, true); err != nil {
			return agentapi.FileInfo{}, fmt.Errorf("move across filesystems: remove source: %w", err)
		}
	}
	info, err := a.stat(db, realTo)
	info.Path = to
	return info, err
}

// copyTree copies a file, symlink or directory tree with modes and owners.
func copyTree(from, to string) error {
	fi, err := os.Lstat(from)
	if err != nil {
		return err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(from)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, to); err != nil {
			return err
		}
	case fi.IsDir():
		if err := os.Mkdir(to, fi.Mode().Perm()); err != nil {
			return err
		}
		entries, err := os.ReadDir(from)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := copyTree(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
				return err
			}
		}
	case fi.Mode().IsRegular():
		src, err := os.Open(from)
		if err != nil {
			return err
		}
		defer src.Close()
		dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.CopyBuffer(dst, src, make([]byte, 1<<20)); err != nil {
			dst.Close()
			return err
		}
		if err := dst.Close(); err != nil {
			return err
		}
	default:
		return errorf(errInvalid, "cannot move %s: not a regular file, directory or symlink", from)
	}
	if st != nil {
		if err := os.Lchown(to, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	if fi.Mode()&os.ModeSymlink == 0 {
		return os.Chmod(to, fi.Mode().Perm())
	}
	return nil
}

func (a *Agent) handleRemove(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := a.resolve(q.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	if path == "/" {
		writeError(w, errorf(errInvalid, "refusing to remove /"))
		return
	}
	dir, base, err := walker{}.openParent(path)
	if err != nil {
		writeError(w, err)
		return
	}
	defer dir.Close()
	if err := removeAt(dir, base, q.Get("recursive") == "1" || q.Get("recursive") == "true"); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
