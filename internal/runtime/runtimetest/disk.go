package runtimetest

import (
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/runtime"
)

// diskLimitMiB is the disk_mib of the sandbox DiskLimit fills.
const diskLimitMiB = 64

// testDisk is the storage attack: a guest (root) with a 64 MiB disk limit
// writes 200 MiB. The write must fail with ENOSPC inside the guest, the
// sandbox's files on the host must stay within the limit, the space must
// come back when the guest deletes the file, and a second sandbox must be
// unaffected.
func (s *suite) testDisk(t *testing.T) {
	s.needLinux(t, "the disk limit check (dd, sync)")
	spec := s.spec(s.opts.NewID())
	spec.DiskMiB = diskLimitMiB
	small := s.startSpec(t, spec)
	other := s.start(t)

	out, code := s.exec(t, small, "sh", "-c", "dd if=/dev/zero of=/root/fill bs=1M count=200 2>&1; echo rc=$?; ls -l /root/fill")
	t.Logf("dd 200 MiB into a %d MiB disk: exit %d: %s", diskLimitMiB, code, out)
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "rc=0") {
		t.Errorf("writing 200 MiB into a %d MiB disk: want ENOSPC (No space left on device) and a non-zero exit; got %s", diskLimitMiB, out)
	}
	if s.opts.RunDir != "" {
		used := allocated(filepath.Join(s.opts.RunDir, small.id), s.opts.MemoryFiles)
		t.Logf("host blocks under %s: %.1f MiB", filepath.Join(s.opts.RunDir, small.id), float64(used)/(1<<20))
		// The limit plus a quarter for the filesystem's and runtime's own
		// bookkeeping (ext4 metadata, the sentry's filestore, logs).
		if limit := int64(diskLimitMiB) << 20 * 5 / 4; used > limit {
			t.Errorf("the sandbox holds %d MiB on the host; want at most %d MiB for a %d MiB disk", used>>20, limit>>20, diskLimitMiB)
		}
	}
	// The space is the guest's again once it deletes the file.
	s.sh(t, small, "rm /root/fill && sync && dd if=/dev/zero of=/root/again bs=1M count=16 2>&1")

	// Another sandbox (default disk) writes more than the small one's limit.
	s.sh(t, other, "dd if=/dev/zero of=/root/big bs=1M count=100 2>&1 && ls -l /root/big")

	// The limit holds across a suspend and wake (checkpoint, delete,
	// restore under the same spec).
	sn, ok := s.d.(runtime.Snapshotter)
	if !ok {
		return
	}
	ctx := s.ctx(t)
	dir := filepath.Join(t.TempDir(), "image")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := sn.Checkpoint(ctx, small.id, dir, false); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	small.c.Close()
	small.sb.Close()
	if err := s.d.Delete(ctx, small.id); err != nil {
		t.Fatalf("Delete after Checkpoint: %v", err)
	}
	sb, err := sn.Restore(ctx, spec, dir)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	small.sb = sb
	small.c = agentclient.New(func(ctx context.Context) (net.Conn, error) { return sb.AgentConn(ctx) })
	if err := small.c.WaitReady(ctx); err != nil {
		t.Fatalf("agent after Restore: %v", err)
	}
	out, _ = s.exec(t, small, "sh", "-c", "dd if=/dev/zero of=/root/after bs=1M count=200 2>&1; echo rc=$?")
	t.Logf("dd 200 MiB after wake: %s", out)
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "rc=0") {
		t.Errorf("writing 200 MiB after a wake: want ENOSPC; got %s", out)
	}
}

// allocated is the disk space (allocated blocks) of the files under dir,
// including files removed from it that a process still holds open (gVisor's
// overlay filestore is such a file), except those named in skip.
func allocated(dir string, skip []string) int64 {
	type key struct{ dev, ino uint64 }
	seen := map[key]bool{}
	var n int64
	add := func(fi os.FileInfo) {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || !fi.Mode().IsRegular() || seen[key{st.Dev, st.Ino}] {
			return
		}
		seen[key{st.Dev, st.Ino}] = true
		n += st.Blocks * 512
	}
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() && !slices.Contains(skip, e.Name()) {
			if fi, err := os.Stat(p); err == nil {
				add(fi)
			}
		}
		return nil
	})
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && strings.HasPrefix(target, dir+"/") && !slices.Contains(skip, filepath.Base(target)) {
			if fi, err := os.Stat(fd); err == nil {
				add(fi)
			}
		}
	}
	return n
}
