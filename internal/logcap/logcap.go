// Package logcap bounds host files that a sandbox's guest can make grow:
// a QEMU guest's console (serial.log) and a gVisor sandbox's stdio
// (runsc.log). Their writers (QEMU, runsc and the sentry) hold them open
// with O_APPEND and outlive the worker, so the files cannot be pipes read by
// the worker; instead the driver checks them often (Keep) and at the points
// where it reads them, and a file over its limit has its tail copied to
// "<file>.1" and is truncated to zero. O_APPEND writers then go on writing
// at the new end of file, so nothing is left sparse or corrupt.
//
// The bound is a soft one: between two checks a guest can add what it
// writes in one Interval. On disk a file takes at most Max plus that, and
// "<file>.1" at most Keep bytes.
package logcap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Defaults for the files the runtime drivers cap.
const (
	// Max is the size at which a capped file is cut (1 MiB).
	Max = 1 << 20
	// Keep is how much of a cut file's tail is kept in "<file>.1" (256 KiB).
	Keep = 256 << 10
	// Interval is how often Keep checks the files.
	Interval = 100 * time.Millisecond
)

// Enforce cuts path if it is larger than limit: its last keep bytes go to
// path+".1" (replaced) and path is truncated to zero. It reports whether it
// cut. A missing file is not an error.
func Enforce(path string, limit, keep int64) (bool, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("logcap: %w", err)
	}
	if fi.Size() <= limit || !fi.Mode().IsRegular() {
		return false, nil
	}
	// O_RDWR: read the tail and truncate through one descriptor, so a
	// file replaced under the path in between is not the one cut.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Errorf("logcap: %w", err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return false, fmt.Errorf("logcap: %w", err)
	}
	off := max(size-keep, 0)
	tmp := path + ".1.tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return false, fmt.Errorf("logcap: %w", err)
	}
	_, cerr := io.Copy(out, io.NewSectionReader(f, off, size-off))
	if err := errors.Join(cerr, out.Close()); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("logcap: keep the tail of %s: %w", filepath.Base(path), err)
	}
	if err := os.Rename(tmp, path+".1"); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("logcap: %w", err)
	}
	if err := f.Truncate(0); err != nil {
		return false, fmt.Errorf("logcap: cut %s: %w", filepath.Base(path), err)
	}
	return true, nil
}

// KeepCapped calls Enforce(p, Max, Keep) every Interval for every path that
// paths returns, until ctx ends or paths returns nil with ok false (the
// driver's run dir is gone). Errors go to report (may be nil).
func KeepCapped(ctx context.Context, paths func() (files []string, ok bool), report func(path string, err error)) {
	t := time.NewTicker(Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		files, ok := paths()
		if !ok {
			return
		}
		for _, p := range files {
			if _, err := Enforce(p, Max, Keep); err != nil && report != nil {
				report(p, err)
			}
		}
	}
}

// Tail returns at most n trailing bytes of path, continued backwards into
// path+".1" when path itself is shorter (just cut). A missing file reads
// as empty.
func Tail(path string, n int64) []byte {
	b := tailOf(path, n)
	if int64(len(b)) < n {
		b = append(tailOf(path+".1", n-int64(len(b))), b...)
	}
	return b
}

func tailOf(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil
	}
	off := max(size-n, 0)
	b, _ := io.ReadAll(io.NewSectionReader(f, off, size-off))
	return b
}
