package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

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
// created directory to u when chown is set.
func mkdirAll(dir string, mode fs.FileMode, u user, chown bool) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if fi.IsDir() {
			return nil
		}
		return errorf(errConflict, "%s exists and is not a directory", dir)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(parent, 0o755, u, chown); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, mode); err != nil {
		if fi, serr := os.Stat(dir); serr == nil && fi.IsDir() {
			return nil // created concurrently
		}
		return err
	}
	if err := os.Chmod(dir, mode); err != nil {
		return err
	}
	if chown {
		if err := os.Lchown(dir, u.UID, u.GID); err != nil {
			return err
		}
	}
	return nil
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
	dir := filepath.Dir(path)
	if err := mkdirAll(dir, 0o755, u, chown); err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("create parent directories: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil && fi.IsDir() {
		return agentapi.FileInfo{}, errorf(errConflict, "%s is a directory", path)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".airlock-*")
	if err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("create temp file: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
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
	if err := os.Rename(tmp, path); err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("rename into %s: %w", path, err)
	}
	ok = true
	return a.stat(db, path)
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
	if _, err := os.Lstat(from); err != nil {
		return agentapi.FileInfo{}, err
	}
	db := a.users()
	u, chown, _ := a.owner(db, "")
	if err := mkdirAll(filepath.Dir(to), 0o755, u, chown); err != nil {
		return agentapi.FileInfo{}, fmt.Errorf("create parent directories: %w", err)
	}
	if err := os.Rename(from, to); err != nil {
		if !errors.Is(err, syscall.EXDEV) {
			return agentapi.FileInfo{}, err
		}
		// Across filesystems (e.g. into the /tmp tmpfs): copy, then remove.
		if err := copyTree(from, to); err != nil {
			os.RemoveAll(to)
			return agentapi.FileInfo{}, fmt.Errorf("move across filesystems: %w", err)
		}
		if err := os.RemoveAll(from); err != nil {
			return agentapi.FileInfo{}, fmt.Errorf("move across filesystems: remove source: %w", err)
		}
	}
	return a.stat(db, to)
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
	if _, err := os.Lstat(path); err != nil {
		writeError(w, err)
		return
	}
	if q.Get("recursive") == "1" || q.Get("recursive") == "true" {
		err = os.RemoveAll(path)
	} else {
		err = os.Remove(path)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
