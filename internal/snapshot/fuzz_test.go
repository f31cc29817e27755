package snapshot_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock/airlock/internal/snapshot"
)

// FuzzImport feeds Store.Import arbitrary archives, as a tenant can: it
// must never panic, and whatever it accepts must be a committed snapshot
// that verifies, while whatever it refuses must leave nothing behind in the
// store (no pending directory, no partial files).
func FuzzImport(f *testing.F) {
	body := []byte("pages")
	f.Add(stream(manifestEntry(art("pages.img", body)), reg("pages.img", body)))
	f.Add(stream(manifestEntry(art("pages.img", body), art("sub/x", nil)), reg("pages.img", body), reg("sub/x", nil)))
	f.Add(stream(reg("pages.img", body), manifestEntry(art("pages.img", body))))
	f.Add(stream(manifestEntry(art("../evil", body)), reg("../evil", body)))
	f.Add([]byte("not a tar at all"))
	// On tmpfs where there is one: the store fsyncs every step, and a disk's
	// fsyncs would make this a few executions a second.
	tmp, err := os.MkdirTemp(shm(), "airlock-fuzz-import-")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(tmp) })
	root := filepath.Join(tmp, "snapshots")
	s, err := snapshot.Open(root)
	if err != nil {
		f.Fatal(err)
	}
	s.SetMaxImportBytes(1 << 20)
	n := 0
	f.Fuzz(func(t *testing.T, archive []byte) {
		n++
		sid := fmt.Sprintf("sb-fuzz%019d", n)
		m, ierr := s.Import(context.Background(), sid, bytes.NewReader(archive))
		if ierr == nil {
			if err := s.Verify(sid, m.ID); err != nil {
				t.Fatalf("imported snapshot does not verify: %v", err)
			}
			if err := s.DeleteSandbox(sid); err != nil {
				t.Fatal(err)
			}
			return
		}
		// Refused: nothing may remain but empty bookkeeping directories.
		filepath.Walk(filepath.Join(root, sid), func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				t.Fatalf("refused import (%v) left %s behind", ierr, p)
			}
			return nil
		})
	})
}

func shm() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return ""
}
