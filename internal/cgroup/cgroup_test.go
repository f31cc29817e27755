package cgroup

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock/airlock/internal/testenv"
)

func testRel(t *testing.T) string {
	b := make([]byte, 4)
	rand.Read(b)
	return "/airlock-cgtest-" + hex.EncodeToString(b) + "/sb"
}

// TestDetectHost: the host's layout is found and agrees with statfs.
func TestDetectHost(t *testing.T) {
	h, err := Detect(DefaultRoot)
	if err != nil {
		t.Skipf("SKIP: no cgroup file system at %s: %v", DefaultRoot, err)
	}
	var fs unix.Statfs_t
	unix.Statfs(DefaultRoot, &fs)
	want := V1
	if fs.Type == unix.CGROUP2_SUPER_MAGIC {
		want = V2
	}
	if h.Version != want {
		t.Fatalf("Detect = %v, statfs says %v", h.Version, want)
	}
	t.Logf("this host: cgroup %v at %s", h.Version, h.Root)
	if _, err := Detect(t.TempDir()); err == nil {
		t.Error("Detect of a plain directory succeeded")
	}
}

// exercise creates rel with limits, moves a process in, finds it, and
// removes the cgroup after the process is gone.
func exercise(t *testing.T, h Hierarchy, rel string, l Limits, want map[string]string) {
	t.Helper()
	if err := h.Create(rel, l); err != nil {
		t.Fatalf("Create %s on %v: %v", rel, h.Version, err)
	}
	top := "/" + strings.Split(strings.Trim(rel, "/"), "/")[0]
	t.Cleanup(func() { h.Remove(top) })
	for file, v := range want {
		var p string
		if h.Version == V2 {
			p = filepath.Join(h.Root, rel, file)
		} else {
			ctl, _, _ := strings.Cut(file, ".")
			dir, err := h.controllerDir(ctl, rel)
			if err != nil {
				t.Fatal(err)
			}
			p = filepath.Join(dir, file)
		}
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != v {
			t.Errorf("%s = %q, %v; want %q", p, b, err, v)
		}
	}
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	files, err := h.ProcsFiles(rel, l)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := os.WriteFile(f, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			t.Fatalf("join %s: %v", f, err)
		}
	}
	if pids := h.Pids(top); !slices.Contains(pids, cmd.Process.Pid) {
		t.Fatalf("Pids(%s) = %v, want %d in it", top, pids, cmd.Process.Pid)
	}
	if err := h.Remove(top); err == nil {
		t.Error("Remove of a cgroup with a live process succeeded")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := h.Remove(top); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	for _, d := range h.Dirs(top) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s remains after Remove", d)
		}
	}
}

// TestHostLimits: on this host's own layout, a cgroup gets its CPU,
// memory and pids limits, holds a process and is removed without a trace.
func TestHostLimits(t *testing.T) {
	testenv.RequireRoot(t, "creates cgroups")
	h, err := Detect(DefaultRoot)
	if err != nil {
		t.Skipf("SKIP: no cgroup file system: %v", err)
	}
	l := Limits{CPUQuota: 150000, CPUPeriod: 100000, MemoryBytes: 64 << 20, Pids: 100}
	want := map[string]string{"cpu.cfs_quota_us": "150000", "cpu.cfs_period_us": "100000", "memory.limit_in_bytes": "67108864", "pids.max": "100"}
	if h.Version == V2 {
		want = map[string]string{"cpu.max": "150000 100000", "memory.max": "67108864", "pids.max": "100"}
	}
	t.Logf("host layout %v", h.Version)
	exercise(t, h, testRel(t), l, want)
}

// TestV2Mount runs the v2 code path against a real cgroup2 file system:
// the host's own when it is unified, else a private cgroup2 mount (on a v1
// or hybrid host it carries only the controllers v1 leaves free).
func TestV2Mount(t *testing.T) {
	testenv.RequireRoot(t, "creates cgroups")
	root := DefaultRoot
	if h, err := Detect(DefaultRoot); err != nil || h.Version != V2 {
		root = t.TempDir()
		if err := syscall.Mount("none", root, "cgroup2", 0, ""); err != nil {
			t.Skipf("SKIP: cannot mount cgroup2 here: %v", err)
		}
		t.Cleanup(func() { syscall.Unmount(root, syscall.MNT_DETACH) })
	}
	h, err := Detect(root)
	if err != nil || h.Version != V2 {
		t.Fatalf("Detect(cgroup2 mount) = %+v, %v", h, err)
	}
	offered, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	t.Logf("cgroup2 at %s offers %q", root, strings.TrimSpace(string(offered)))
	// Membership, Pids and Remove need no controller.
	exercise(t, h, testRel(t), Limits{}, nil)

	l := Limits{CPUQuota: 150000, CPUPeriod: 100000, MemoryBytes: 64 << 20, Pids: 100}
	ctls := strings.Fields(string(offered))
	if !slices.Contains(ctls, "cpu") || !slices.Contains(ctls, "memory") || !slices.Contains(ctls, "pids") {
		// A controller the host lacks is a clear error, never a cgroup
		// without its limit.
		rel := testRel(t)
		err := h.Create(rel, l)
		if err == nil || !strings.Contains(err.Error(), "does not offer the") {
			t.Fatalf("Create with controllers the mount lacks = %v, want an error naming the controller", err)
		}
		h.Remove("/" + strings.Split(strings.Trim(rel, "/"), "/")[0])
		t.Logf("error: %v", err)
		t.Skipf("SKIP: cgroup v2 limits (cpu.max, memory.max, pids.max) untested here: this host's cgroup2 offers only %q; cpu, memory and pids are bound to its v1 hierarchies", strings.TrimSpace(string(offered)))
	}
	exercise(t, h, testRel(t), l, map[string]string{"cpu.max": "150000 100000", "memory.max": "67108864", "pids.max": "100"})
}
