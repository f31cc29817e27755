// Package cgroup creates, limits and removes the per-sandbox cgroups of the
// runtime drivers on both cgroup layouts: v1 (one hierarchy per controller
// under /sys/fs/cgroup, including "hybrid" hosts whose v2 mount at
// /sys/fs/cgroup/unified carries no controllers the drivers use) and v2
// (the unified hierarchy mounted at /sys/fs/cgroup itself).
//
// A cgroup is named by its path relative to the hierarchy root, e.g.
// "/airlock/<id>": on v1 it exists once per controller hierarchy, on v2 once.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultRoot is where the hierarchies are mounted.
const DefaultRoot = "/sys/fs/cgroup"

// Version is the cgroup layout of a host.
type Version int

const (
	V1 Version = 1
	V2 Version = 2
)

func (v Version) String() string { return "v" + strconv.Itoa(int(v)) }

// Hierarchy is the cgroup file system of a host.
type Hierarchy struct {
	Root    string
	Version Version
}

// Detect finds the layout mounted at root: v2 when root is a cgroup2 file
// system, v1 when root holds v1 controller hierarchies (such as cpu).
func Detect(root string) (Hierarchy, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return Hierarchy{}, fmt.Errorf("cgroup: statfs %s: %w", root, err)
	}
	if fs.Type == unix.CGROUP2_SUPER_MAGIC {
		return Hierarchy{Root: root, Version: V2}, nil
	}
	for _, c := range []string{"cpu", "memory", "pids", "cpu,cpuacct"} {
		var sub unix.Statfs_t
		if err := unix.Statfs(filepath.Join(root, c), &sub); err == nil && sub.Type == unix.CGROUP_SUPER_MAGIC {
			return Hierarchy{Root: root, Version: V1}, nil
		}
	}
	return Hierarchy{}, fmt.Errorf("cgroup: %s is neither a cgroup2 mount nor holds cgroup v1 hierarchies (cpu, memory, pids): mount the cgroup file system", root)
}

// Limits of one cgroup; a zero field sets no limit.
type Limits struct {
	CPUQuota    int64 // µs of CPU time per CPUPeriod (N cores = N × CPUPeriod)
	CPUPeriod   int64 // µs; default 100000
	MemoryBytes int64
	Pids        int64
}

// Dirs returns the directories of cgroup rel, existing or not: on v1 one
// per hierarchy under Root, on v2 one.
func (h Hierarchy) Dirs(rel string) []string {
	if h.Version == V2 {
		return []string{filepath.Join(h.Root, rel)}
	}
	entries, err := os.ReadDir(h.Root)
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(h.Root, e.Name(), rel))
		}
	}
	return dirs
}

// controllerDir is rel's directory in the v1 hierarchy of controller c
// ("cpu" may be mounted as "cpu,cpuacct"; the name then is a symlink).
func (h Hierarchy) controllerDir(c, rel string) (string, error) {
	for _, name := range []string{c, c + ",cpuacct", "cpuacct," + c} {
		base := filepath.Join(h.Root, name)
		if fi, err := os.Stat(base); err == nil && fi.IsDir() {
			return filepath.Join(base, rel), nil
		}
	}
	return "", fmt.Errorf("cgroup: no %s controller hierarchy under %s", c, h.Root)
}

// needed lists the controllers limits l uses.
func (l Limits) needed() []string {
	var cs []string
	if l.CPUQuota > 0 {
		cs = append(cs, "cpu")
	}
	if l.MemoryBytes > 0 {
		cs = append(cs, "memory")
	}
	if l.Pids > 0 {
		cs = append(cs, "pids")
	}
	return cs
}

// Create makes cgroup rel (and its parents) and applies l. On v2 it enables
// the controllers l needs in every ancestor's cgroup.subtree_control; a
// controller the host does not offer is an error naming it.
func (h Hierarchy) Create(rel string, l Limits) error {
	if l.CPUPeriod == 0 {
		l.CPUPeriod = 100000
	}
	if !filepath.IsAbs(rel) || rel == "/" || filepath.Clean(rel) != rel {
		return fmt.Errorf("cgroup: path %q must be absolute, clean and not the root", rel)
	}
	if h.Version == V2 {
		return h.createV2(rel, l)
	}
	for _, c := range l.needed() {
		dir, err := h.controllerDir(c, rel)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
	}
	return h.apply(rel, l)
}

func (h Hierarchy) createV2(rel string, l Limits) error {
	need := l.needed()
	offered, err := os.ReadFile(filepath.Join(h.Root, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	for _, c := range need {
		if !slices.Contains(strings.Fields(string(offered)), c) {
			return fmt.Errorf("cgroup: the cgroup v2 hierarchy at %s does not offer the %s controller (offered: %q); on a hybrid host it is bound to a v1 hierarchy", h.Root, c, strings.TrimSpace(string(offered)))
		}
	}
	// Every ancestor passes the controllers down to its children.
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	dir := h.Root
	for _, p := range parts {
		if len(need) > 0 {
			enable := "+" + strings.Join(need, " +")
			if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), enable); err != nil {
				return fmt.Errorf("cgroup: enable %s below %s: %w", strings.Join(need, ", "), dir, err)
			}
		}
		dir = filepath.Join(dir, p)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup: %w", err)
		}
	}
	return h.apply(rel, l)
}

// apply writes l into the existing cgroup rel.
func (h Hierarchy) apply(rel string, l Limits) error {
	if l.CPUPeriod == 0 {
		l.CPUPeriod = 100000
	}
	if l.CPUQuota > 0 {
		if err := h.SetCPU(rel, l.CPUQuota, l.CPUPeriod); err != nil {
			return err
		}
	}
	if l.MemoryBytes > 0 {
		if err := h.write("memory", rel, "memory.limit_in_bytes", "memory.max", strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		if err := h.write("pids", rel, "pids.max", "pids.max", strconv.FormatInt(l.Pids, 10)); err != nil {
			return err
		}
	}
	return nil
}

// SetCPU sets the CPU quota of the existing cgroup rel (quota µs per
// period µs). A cgroup without a cpu controller is an error: a sandbox
// must not run without its limit.
func (h Hierarchy) SetCPU(rel string, quota, period int64) error {
	if h.Version == V2 {
		return h.write("cpu", rel, "", "cpu.max", strconv.FormatInt(quota, 10)+" "+strconv.FormatInt(period, 10))
	}
	dir, err := h.controllerDir("cpu", rel)
	if err != nil {
		return err
	}
	// The period first: a quota is checked against the current period.
	if err := writeFile(filepath.Join(dir, "cpu.cfs_period_us"), strconv.FormatInt(period, 10)); err != nil {
		return fmt.Errorf("cgroup: set the CPU period of %s: %w", rel, err)
	}
	if err := writeFile(filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)); err != nil {
		return fmt.Errorf("cgroup: set the CPU quota of %s: %w", rel, err)
	}
	return nil
}

// write sets one limit file: v1 in controller c's hierarchy, v2 in rel.
func (h Hierarchy) write(c, rel, v1file, v2file, value string) error {
	var p string
	if h.Version == V2 {
		p = filepath.Join(h.Root, rel, v2file)
	} else {
		dir, err := h.controllerDir(c, rel)
		if err != nil {
			return err
		}
		p = filepath.Join(dir, v1file)
	}
	if err := writeFile(p, value); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cgroup: %s has no %s controller (%s missing)", rel, c, filepath.Base(p))
		}
		return fmt.Errorf("cgroup: set %s of %s: %w", filepath.Base(p), rel, err)
	}
	return nil
}

// ProcsFiles are the cgroup.procs files a process is written into to join
// cgroup rel with the limits l (v1: one per controller l uses; v2: one).
func (h Hierarchy) ProcsFiles(rel string, l Limits) ([]string, error) {
	if h.Version == V2 {
		return []string{filepath.Join(h.Root, rel, "cgroup.procs")}, nil
	}
	var files []string
	for _, c := range l.needed() {
		dir, err := h.controllerDir(c, rel)
		if err != nil {
			return nil, err
		}
		files = append(files, filepath.Join(dir, "cgroup.procs"))
	}
	return files, nil
}

// Pids lists the processes in cgroup rel and its descendants.
func (h Hierarchy) Pids(rel string) []int {
	set := map[int]bool{}
	for _, cg := range h.Dirs(rel) {
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
	pids := make([]int, 0, len(set))
	for pid := range set {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

// Remove removes cgroup rel and its children, deepest first, in every
// hierarchy. A cgroup that does not exist is not an error; one whose last
// task just exited is retried for a second.
func (h Hierarchy) Remove(rel string) error {
	var errs []error
	for _, dir := range h.Dirs(rel) {
		if err := RemoveDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RemoveDir removes one cgroup directory and its children, deepest first.
func RemoveDir(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var dirs []string
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for _, p := range slices.Backward(dirs) {
		var err error
		for range 50 {
			if err = syscall.Rmdir(p); err == nil || errors.Is(err, syscall.ENOENT) || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func writeFile(p, value string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(value)
	return errors.Join(werr, f.Close())
}
