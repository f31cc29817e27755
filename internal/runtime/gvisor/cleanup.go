package gvisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock/airlock/internal/cgroup"
)

// cleanup removes everything the driver may have created for id, whatever
// state it is in: runsc state, processes, mounts, cgroups, the run dir. Each
// step runs even if an earlier one failed; the failures are joined.
func (d *Driver) cleanup(ctx context.Context, id string) error {
	d.closeHandle(id)
	defer d.lock(id)()
	var errs []error

	// runsc resolves ids by prefix: only delete when state names exactly id.
	_, found, err := d.state(ctx, id)
	if err != nil || found {
		if out, derr := d.runsc(ctx, "delete", "-force", id); derr != nil && !notExist(out) {
			errs = append(errs, fmt.Errorf("runsc delete: %w: %s", derr, strings.TrimSpace(string(out))))
		}
	}

	if err := killStragglers(ctx, id, d.cgroupDirs(id)); err != nil {
		errs = append(errs, err)
	}
	if err := unmountAll(d.sandboxDir(id), id); err != nil {
		errs = append(errs, err)
	}
	for _, dir := range d.cgroupDirs(id) {
		if err := removeCgroup(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := d.removeState(id); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.sandboxDir(id)); err != nil {
		errs = append(errs, fmt.Errorf("remove run dir: %w", err))
	}
	return errors.Join(errs...)
}

// cgroupDirs lists the sandbox's cgroup directories, whether or not they
// exist: CgroupParent/<id> in every v1 hierarchy, or the one v2 cgroup.
func (d *Driver) cgroupDirs(id string) []string {
	if d.cgErr != nil {
		return nil
	}
	return d.cg.Dirs(d.cgroupPath(id))
}

// killStragglers SIGKILLs every process whose command line mentions id or
// that sits in one of the sandbox's cgroups, and waits for them to go.
func killStragglers(ctx context.Context, id string, cgroups []string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := sandboxPids(id, cgroups)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes of %s still alive after SIGKILL: %v", id, pids)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for processes of %s to exit: %w", id, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// sandboxPids finds live (non-zombie) processes belonging to the sandbox.
func sandboxPids(id string, cgroups []string) []int {
	self := os.Getpid()
	set := map[int]bool{}
	for _, cg := range cgroups {
		filepath.WalkDir(cg, func(p string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					set[pid] = true
				}
			}
			return nil
		})
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		// Only runsc's own processes (runsc, runsc-gofer, runsc-sandbox):
		// anything else that merely names the id, such as a client running
		// `airlock sandbox rm <id>`, is not ours to kill.
		if argv0, _, _ := strings.Cut(string(b), "\x00"); !strings.HasPrefix(filepath.Base(argv0), "runsc") {
			continue
		}
		for _, arg := range strings.Split(string(b), "\x00") {
			if strings.Contains(arg, id) {
				set[pid] = true
				break
			}
		}
	}
	var pids []int
	for pid := range set {
		if pid != self && !zombie(pid) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // gone
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// mountPoints returns the mount points in /proc/self/mountinfo that lie
// under dir or whose mount point, root or source mentions id, deepest first.
func mountPoints(dir, id string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		root, mp := unescapeMount(fields[3]), unescapeMount(fields[4])
		source := ""
		for i, f := range fields {
			if f == "-" && i+2 < len(fields) {
				source = unescapeMount(fields[i+2])
			}
		}
		if mp == dir || strings.HasPrefix(mp, dir+"/") || strings.Contains(mp, id) ||
			strings.Contains(root, id) || strings.Contains(source, id) {
			mps = append(mps, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	// Deepest first; mountinfo order is mount order, so reverse it too.
	slices.Reverse(mps)
	slices.SortStableFunc(mps, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return mps, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll detaches every mount mountPoints finds.
func unmountAll(dir, id string) error {
	var errs []error
	for attempt := 0; attempt < 3; attempt++ {
		mps, err := mountPoints(dir, id)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
			}
		}
	}
	if mps, _ := mountPoints(dir, id); len(mps) > 0 {
		errs = append(errs, fmt.Errorf("mounts of %s remain: %v", id, mps))
	}
	return errors.Join(errs...)
}

// removeCgroup removes a cgroup directory and its children, deepest first.
func removeCgroup(dir string) error { return cgroup.RemoveDir(dir) }

// removeState removes runsc state files naming id, in case runsc delete
// could not (a crash between create and start, a corrupt state file).
func (d *Driver) removeState(id string) error {
	entries, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read state dir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if strings.Contains(e.Name(), id) {
			if err := os.RemoveAll(filepath.Join(d.cfg.StateDir, e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("remove runsc state: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
