package gvisor

// The checkpoint helper: Checkpoint runs `runsc checkpoint` (and, with
// leaveRunning, the restore in place) in a child process of its own
// session, so that a worker SIGKILLed half-way does not leave a sandbox
// stopped with nobody to record that its image is complete, or stopped
// between checkpoint and restore. The child is this very binary
// (/proc/self/exe: the airlock daemon, or a test binary that links this
// package) started with helperEnv set; this package's init sees it, does
// the checkpoint and exits before main runs.
//
// Protocol: helperEnv holds a JSON helperRequest. fd 3, if passed, is the
// snapshot store's lock file (dir+snapshot.LockSuffix), already flocked by
// the parent; the open file description, and so the lock, stays held by
// the helper until it exits, also when the parent is gone. stdout is a
// file that receives the error text on failure (exit status 1); stderr is
// appended to the sandbox's runsc.log.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/airlock/airlock/internal/cgroup"
	"github.com/airlock/airlock/internal/snapshot"
)

// helperEnv names the environment variable that turns this binary into a
// checkpoint helper.
const helperEnv = "AIRLOCK_GVISOR_CHECKPOINT_HELPER"

// helperRequest is what the helper is asked to do.
type helperRequest struct {
	RunscPath, StateDir, RunDir, Platform, CgroupParent string

	ID, Dir      string
	LeaveRunning bool
	Deadline     time.Time
}

func init() {
	req, ok := os.LookupEnv(helperEnv)
	if !ok {
		return
	}
	os.Unsetenv(helperEnv) // not for runsc and the sandbox it starts
	os.Exit(runHelper(req))
}

// runHelper does one checkpoint for a parent that may die meanwhile.
func runHelper(reqJSON string) int {
	// The parent's death must not take the helper with it: no SIGHUP from
	// its session, no SIGPIPE, no ^C of a foreground worker.
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE, syscall.SIGINT)
	// fd 3 (the lock) must not leak into runsc and the sandbox it
	// restores: the lock would be held for the sandbox's lifetime.
	syscall.CloseOnExec(3)
	var req helperRequest
	if err := json.Unmarshal([]byte(reqJSON), &req); err != nil {
		fmt.Fprintf(os.Stdout, "gvisor: checkpoint helper: bad request: %v", err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "gvisor-checkpoint-helper", "pid", os.Getpid())
	d := &Driver{
		cfg: Config{RunscPath: req.RunscPath, StateDir: req.StateDir, RunDir: req.RunDir, Platform: req.Platform,
			CgroupParent: req.CgroupParent, Logger: log},
		log: log, handles: map[string]*sandbox{}, locks: map[string]*idLock{},
	}
	d.cg, d.cgErr = cgroup.Detect(cgroup.DefaultRoot)
	ctx, cancel := context.WithDeadline(context.Background(), req.Deadline)
	defer cancel()
	if err := d.checkpoint(ctx, req.ID, req.Dir, req.LeaveRunning); err != nil {
		log.Error("checkpoint failed", "id", req.ID, "err", err)
		fmt.Fprint(os.Stdout, err.Error())
		return 1
	}
	return 0
}

// checkpointDetached runs checkpoint in a helper process and waits for it.
// When ctx ends first the helper and its runsc are killed (as a runsc
// child of the worker would be). The caller holds lock(id).
func (d *Driver) checkpointDetached(ctx context.Context, id, dir string, leaveRunning bool) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(24 * time.Hour)
	}
	req, err := json.Marshal(helperRequest{
		RunscPath: d.cfg.RunscPath, StateDir: d.cfg.StateDir, RunDir: d.cfg.RunDir, Platform: d.cfg.Platform,
		CgroupParent: d.cfg.CgroupParent, ID: id, Dir: dir, LeaveRunning: leaveRunning, Deadline: deadline,
	})
	if err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	sdir := d.sandboxDir(id)
	result, err := os.CreateTemp(sdir, ".checkpoint-result-")
	if err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	defer os.Remove(result.Name())
	defer result.Close()
	logf, err := os.OpenFile(filepath.Join(sdir, "runsc.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: open log: %w", id, err)
	}
	defer logf.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(req))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, result, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	lockf, err := os.OpenFile(dir+snapshot.LockSuffix, os.O_RDWR, 0)
	switch {
	case err == nil:
		defer lockf.Close()
		if err := syscall.Flock(int(lockf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			return fmt.Errorf("gvisor: checkpoint %s: image dir %s is being written by another process: %w", id, dir, err)
		}
		cmd.ExtraFiles = []*os.File{lockf} // fd 3
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: start the checkpoint helper: %w", id, err)
	}
	if lockf != nil {
		lockf.Close() // the helper holds the lock now, for as long as it runs
	}
	stop := context.AfterFunc(ctx, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	werr := cmd.Wait()
	stop()
	if werr == nil {
		return nil
	}
	msg, _ := os.ReadFile(result.Name())
	if len(msg) == 0 {
		if ctx.Err() != nil {
			return fmt.Errorf("gvisor: checkpoint %s: %w (checkpoint helper killed: %v)", id, ctx.Err(), werr)
		}
		return fmt.Errorf("gvisor: checkpoint %s: checkpoint helper: %v: %s", id, werr, tail(filepath.Join(sdir, "runsc.log"), 2048))
	}
	return errors.New(strings.TrimSpace(string(msg)))
}
