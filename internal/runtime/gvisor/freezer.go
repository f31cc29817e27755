package gvisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Pausing with the cgroup v1 freezer (Config.FreezerPause; experimental).
//
// `runsc pause` is a CLI process (~10 ms, nearly all of it starting runsc;
// the driver used to run `runsc state` before it as well, ~18 ms in all).
// With FreezerPause, Pause instead writes FROZEN to freezer.state of the
// sandbox's own cgroup CgroupParent/<id> and waits until the kernel reports
// every task frozen (~0.3 ms); Resume writes THAWED. Every process of a
// sandbox sits in that cgroup: runsc creates it from the spec's cgroupsPath
// and places the gofer and the sandbox (the sentry) in it, and the sentry's
// systrap stub processes inherit it (checked on this runsc version:
// runsc-gofer, runsc-sandbox and the stubs are all in its cgroup.procs,
// nothing of the sandbox outside). Freezing the gofer is not needed to stop
// the guest (guest code only runs in the stubs, driven by the sentry) but
// is harmless: while the sentry is frozen nothing sends the gofer work.
//
// Why it is not the default: with the systrap platform the sentry drives
// its stubs with ptrace and shared-memory handshakes, and the freezer stops
// the sentry's threads and the stubs in no particular order and at any
// point. In stress runs (a guest forking in a tight loop, Pause/Resume
// every few ms) sandboxes died: after ~700 cycles ("systrap corrupted
// memory: subprocess died": stubs SIGKILLed, the guest killed), and a
// freeze right after `runsc restore` crashed the sentry within ~20 tries
// ("panic: failed getting response from syscall thread", apparently a
// ptrace request to a stub the freezer had already stopped). Freezing a child cgroup holding only
// the sentry first, and thawing it last, fixed the restore case but not
// the fork storm (a death after ~1200 cycles), and migrating the sentry
// between cgroups cost ~15 ms, as much as runsc pause; it was dropped.
// Idle or lightly loaded sandboxes, the conformance suite (with
// FreezerPause too) and checkpoints of frozen sandboxes pass. `runsc
// pause` stops the tasks inside the sentry and has no such problem. After
// a restore the driver always pauses with runsc (see resumeInPlace).
//
// Guest time is host time (the sentry reads the host clocks), as with
// `runsc pause`: the guest's clocks keep going while it is frozen, and its
// timers that expired meanwhile fire on thaw.
//
// A frozen sentry cannot answer its control socket, and every runsc command
// that talks to it blocks until the thaw: `runsc state` and `runsc list`
// (for a running container they ask the sentry whether it is still alive),
// pause, resume, checkpoint, delete. Hence, whether or not FreezerPause is
// set (a sandbox may have been frozen by an earlier worker):
//   - Status reports a frozen sandbox as paused without asking runsc; List
//     uses `runsc list -quiet`, which only reads the state dir.
//   - Checkpoint first turns the freeze into a `runsc pause` (see
//     freezeToRunscPause), so the guest stays paused while runsc saves it.
//   - Delete thaws first; a frozen task does not even die of SIGKILL
//     before it is thawed (killStragglers thaws after killing).
//   - Resume thaws and, when runsc also has the sandbox paused (paused by
//     runsc pause, or left so by a failed Checkpoint), runs `runsc resume`.
//     It reads runsc's status from its state file (runscStatusFile) rather
//     than running `runsc state`.
//
// The operations on one id are serialised (Driver.lock), so that no runsc
// command of Status or Delete starts while Pause freezes the same sandbox.

// freezeTimeout bounds the wait for every task of a sandbox to freeze.
const freezeTimeout = 5 * time.Second

// freezer.state values.
const (
	stateFrozen   = "FROZEN"
	stateFreezing = "FREEZING"
	stateThawed   = "THAWED"
)

// errNoFreezer says a sandbox has no usable freezer cgroup (no freezer
// hierarchy, no cgroup, or no process in it): the caller asks runsc.
var errNoFreezer = errors.New("no freezer cgroup with processes")

// findFreezer returns the mount point of the cgroup v1 hierarchy with the
// freezer controller, or "" and the reason there is none.
func findFreezer() (string, string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "cannot read mountinfo: " + err.Error()
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superopts
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld != "-" || i+3 >= len(fields) || i < 5 {
				continue
			}
			if fields[i+1] == "cgroup" && slices.Contains(strings.Split(fields[i+3], ","), "freezer") {
				mp := unescapeMount(fields[4])
				if _, err := os.Stat(mp); err != nil {
					return "", "freezer hierarchy at " + mp + ": " + err.Error()
				}
				return mp, ""
			}
			break
		}
	}
	if err := sc.Err(); err != nil {
		return "", "read mountinfo: " + err.Error()
	}
	return "", "no cgroup v1 hierarchy with the freezer controller is mounted"
}

// freezerDir is the sandbox's cgroup in the freezer hierarchy, "" without
// one.
func (d *Driver) freezerDir(id string) string {
	if d.freezerRoot == "" {
		return ""
	}
	return filepath.Join(d.freezerRoot, d.cfg.CgroupParent, id)
}

// freezerState reads the freezer state of the sandbox's cgroup. It returns
// errNoFreezer when the cgroup does not exist or holds no process.
func (d *Driver) freezerState(id string) (string, error) {
	dir := d.freezerDir(id)
	if dir == "" {
		return "", errNoFreezer
	}
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", errNoFreezer
		}
		return "", fmt.Errorf("read freezer state: %w", err)
	}
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", errNoFreezer
		}
		return "", fmt.Errorf("read freezer cgroup.procs: %w", err)
	}
	if len(strings.TrimSpace(string(procs))) == 0 {
		return "", errNoFreezer
	}
	return strings.TrimSpace(string(b)), nil
}

// frozen says whether the sandbox's freezer cgroup is frozen or freezing
// (a Pause in progress or one a crash interrupted; the guest is not running
// either way). Errors count as not frozen.
func (d *Driver) frozen(id string) bool {
	st, err := d.freezerState(id)
	return err == nil && (st == stateFrozen || st == stateFreezing)
}

// freeze freezes the sandbox's cgroup and waits until every task in it is
// frozen. On failure it thaws the cgroup again. It returns errNoFreezer
// when the sandbox has no freezer cgroup with processes.
func (d *Driver) freeze(ctx context.Context, id string) error {
	st, err := d.freezerState(id)
	if err != nil {
		return err
	}
	if st == stateFrozen {
		return nil
	}
	if err := waitFrozen(ctx, d.freezerDir(id), time.Now().Add(freezeTimeout)); err != nil {
		// Do not leave the sandbox half frozen.
		return errors.Join(fmt.Errorf("freeze: %w (thawed again)", err), d.thaw(id))
	}
	return nil
}

// waitFrozen freezes the freezer cgroup dir and waits until all its tasks
// are frozen.
func waitFrozen(ctx context.Context, dir string, deadline time.Time) error {
	file := filepath.Join(dir, "freezer.state")
	if err := os.WriteFile(file, []byte(stateFrozen), 0); err != nil {
		return err
	}
	wait := 20 * time.Microsecond
	for {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		switch strings.TrimSpace(string(b)) {
		case stateFrozen:
			return nil
		case stateFreezing:
		default: // THAWED: someone thawed it meanwhile; ask again
			if err := os.WriteFile(file, []byte(stateFrozen), 0); err != nil {
				return err
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			// A task that does not freeze (in uninterruptible sleep, say).
			return fmt.Errorf("not all tasks of %s froze within %v", dir, freezeTimeout)
		}
		time.Sleep(wait)
		wait = min(2*wait, time.Millisecond)
	}
}

// thaw thaws the sandbox's cgroup. Thawing is synchronous in cgroup v1: the
// tasks are runnable when the write returns. A missing cgroup is not an
// error.
func (d *Driver) thaw(id string) error {
	dir := d.freezerDir(id)
	if dir == "" {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "freezer.state"), []byte(stateThawed), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("thaw: %w", err)
	}
	return nil
}

// thawCgroups thaws every freezer cgroup among dirs (those that have a
// freezer.state) and their children.
func thawCgroups(dirs []string) {
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "freezer.state")); err != nil {
			continue
		}
		filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				os.WriteFile(filepath.Join(p, "freezer.state"), []byte(stateThawed), 0)
			}
			return nil
		})
	}
}

// runscStatusFile reads the status runsc last recorded for the container
// from its state file ("running", "paused", ...) without running runsc,
// which takes 10-15 ms. ok is false when the file is missing, being
// rewritten or in a format this code does not know; the caller then asks
// `runsc state`. The file is runsc's own; the status field is what
// `runsc state` prints, before runsc's check that the sandbox is alive.
func (d *Driver) runscStatusFile(id string) (status string, ok bool) {
	b, err := os.ReadFile(d.statePath(id))
	if err != nil {
		return "", false
	}
	var st struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.ID != id {
		return "", false
	}
	switch st.Status {
	case "creating", "created", "running", "paused", "stopped":
		return st.Status, true
	}
	return "", false
}

// runscStatus is runsc's status of the container: from the state file when
// it can be read, else from `runsc state`. The sandbox must not be frozen
// (runsc state would block). found is false when runsc has no such
// container.
func (d *Driver) runscStatus(ctx context.Context, id string) (status string, found bool, err error) {
	if s, ok := d.runscStatusFile(id); ok {
		return s, true, nil
	}
	st, found, err := d.state(ctx, id)
	return st.Status, found, err
}

// freezeToRunscPause turns a sandbox paused by the freezer into one paused
// by runsc and thawed, as `runsc checkpoint` needs a sentry that runs. It
// starts `runsc pause` while the sandbox is still frozen, gives it a head
// start to reach the sentry's control socket (where it waits for the
// frozen sentry), and only then thaws: the sentry then handles the pause as
// soon as it runs again, and the guest runs for about a millisecond instead
// of the ~10 ms runsc needs to start. (A thaw before runsc reached the
// socket only widens that window.) If runsc cannot pause it, the sandbox is
// frozen again and the error returned. The caller holds lock(id).
func (d *Driver) freezeToRunscPause(ctx context.Context, id string) error {
	if s, ok := d.runscStatusFile(id); ok && s == "paused" {
		// Paused by runsc too (an older driver paused it): just thaw.
		return d.thaw(id)
	}
	cmd := d.runscCmd(ctx, "pause", id)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("runsc pause: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	exited := false
	select {
	case err = <-done:
		exited = true
	case <-time.After(pauseHeadStart):
	}
	if terr := d.thaw(id); terr != nil {
		if !exited {
			cmd.Process.Kill()
			<-done
		}
		return terr
	}
	if !exited {
		err = <-done
	}
	if err == nil {
		return nil
	}
	err = fmt.Errorf("runsc pause: %w: %s", err, strings.TrimSpace(out.String()))
	// Perhaps runsc had it paused after all; otherwise keep it paused with
	// the freezer.
	if s, found, serr := d.runscStatus(context.WithoutCancel(ctx), id); serr == nil && found && s == "paused" {
		return nil
	}
	if ferr := d.freeze(context.WithoutCancel(ctx), id); ferr != nil {
		return errors.Join(err, fmt.Errorf("and freezing it again failed: %w", ferr))
	}
	return err
}

// pauseHeadStart is how long freezeToRunscPause lets `runsc pause` start
// before it thaws the sandbox (runsc pause takes ~10 ms here).
const pauseHeadStart = 100 * time.Millisecond

// idLock serialises the operations on one sandbox id.
type idLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks id against the other operations on it and returns the unlock.
func (d *Driver) lock(id string) (unlock func()) {
	d.mu.Lock()
	l := d.locks[id]
	if l == nil {
		l = &idLock{}
		d.locks[id] = l
	}
	l.refs++
	d.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		d.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(d.locks, id)
		}
		d.mu.Unlock()
	}
}
