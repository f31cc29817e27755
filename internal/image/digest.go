package image

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Digest returns the content digest "sha256:<hex>" of the tree at root and
// its size in bytes (the sum of regular file sizes). The digest is the
// sha256 of a manifest with one line per entry in lexical path order: path,
// type, permission bits, uid, gid, size, and the content sha256 of a regular
// file, the target of a symlink or the device number of a device. Modification
// times are not part of it, so two builds of the same content agree.
func Digest(root string) (digest string, size int64, err error) {
	h := sha256.New()
	w := bufio.NewWriterSize(h, 64<<10)
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{} // hardlinks: hash each inode once
	err = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat data", p)
		}
		mode := fi.Mode()
		var typ, extra string
		var sz int64
		switch {
		case mode.IsRegular():
			typ, sz = "file", fi.Size()
			key := inode{uint64(st.Dev), st.Ino}
			sum, ok := seen[key]
			if !ok {
				if sum, err = fileSHA256(p); err != nil {
					return err
				}
				seen[key] = sum
			}
			extra = sum
			size += sz
		case mode.IsDir():
			typ = "dir"
		case mode&fs.ModeSymlink != 0:
			typ = "symlink"
			if extra, err = os.Readlink(p); err != nil {
				return err
			}
		case mode&fs.ModeDevice != 0:
			typ = "device"
			if mode&fs.ModeCharDevice != 0 {
				typ = "chardev"
			}
			extra = strconv.FormatUint(st.Rdev, 10)
		case mode&fs.ModeNamedPipe != 0:
			typ = "fifo"
		case mode&fs.ModeSocket != 0:
			typ = "socket"
		default:
			typ = "other"
		}
		// Permission bits plus setuid, setgid and sticky, as in stat(2).
		perm := st.Mode & 0o7777
		fmt.Fprintf(w, "%s %s %04o %d %d %d %s\n", strconv.Quote(rel), typ, perm, st.Uid, st.Gid, sz, strconv.Quote(extra))
		return nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("digest %s: %w", root, err)
	}
	if err := w.Flush(); err != nil {
		return "", 0, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), size, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
