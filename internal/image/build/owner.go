package build

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/airlock/airlock/internal/model"
)

// lookupOwner resolves a COPY's --chown (user[:group], names or ids) in
// the tree's /etc/passwd and /etc/group; a user alone takes its own
// primary group, as Docker does.
func lookupOwner(root *os.Root, chown string) (uid, gid int, err error) {
	u, g, hasGroup := strings.Cut(chown, ":")
	uid, pgid, err := lookupID(root, "etc/passwd", u, true)
	if err != nil {
		return 0, 0, err
	}
	gid = pgid
	if hasGroup {
		if gid, _, err = lookupID(root, "etc/group", g, false); err != nil {
			return 0, 0, err
		}
	}
	return uid, gid, nil
}

// lookupID finds name (or a number) in a passwd or group file of root;
// for passwd it also returns the primary group.
func lookupID(root *os.Root, file, name string, passwd bool) (id, group int, err error) {
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		if !passwd {
			return n, 0, nil
		}
		group = n
		// A numeric user takes its group from passwd when listed.
		if f, err := root.Open(file); err == nil {
			defer f.Close()
			sc := bufio.NewScanner(io.LimitReader(f, 4<<20))
			for sc.Scan() {
				fs := strings.Split(sc.Text(), ":")
				if len(fs) >= 4 && fs[2] == name {
					if g, err := strconv.Atoi(fs[3]); err == nil {
						group = g
					}
					break
				}
			}
		}
		return n, group, nil
	}
	f, err := root.Open(file)
	if err != nil {
		return 0, 0, model.Errorf(model.ErrInvalid, "--chown=%s: the template has no /%s to look %q up in; use ids", name, file, name)
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 4<<20))
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ":")
		if len(fs) < 3 || fs[0] != name {
			continue
		}
		id, err := strconv.Atoi(fs[2])
		if err != nil {
			break
		}
		if passwd && len(fs) >= 4 {
			group, _ = strconv.Atoi(fs[3])
		}
		return id, group, nil
	}
	return 0, 0, model.Errorf(model.ErrInvalid, "--chown: %q is not in the template's /%s", name, file)
}

// maybeGunzip reads f as a gzip stream when it starts like one.
func maybeGunzip(f *os.File) (io.Reader, error) {
	var magic [2]byte
	n, _ := io.ReadFull(f, magic[:])
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	if n == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("decompress the files: %w", err)
		}
		return zr, nil
	}
	return f, nil
}

// singleEntry returns the name of the one regular file in tar file p (a
// COPY with ToFile).
func singleEntry(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	r, err := maybeGunzip(f)
	if err != nil {
		return "", err
	}
	tr := tar.NewReader(r)
	var name string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("read the files: %w", err)
		}
		if hdr.Typeflag == tar.TypeDir && path.Clean(hdr.Name) == "." {
			continue
		}
		if name != "" || (hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA) {
			return "", model.Errorf(model.ErrInvalid, "a COPY to a file needs exactly one file in its tar")
		}
		name = path.Clean(strings.TrimPrefix(hdr.Name, "/"))
	}
	if name == "" {
		return "", model.Errorf(model.ErrInvalid, "a COPY to a file needs exactly one file in its tar")
	}
	return name, nil
}
