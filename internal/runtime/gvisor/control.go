package gvisor

// Pause and resume through the sentry's control socket.
//
// `runsc pause` is: take the container's state-file lock, check the status,
// send "containerManager.Pause" to the sandbox's control server (a urpc
// JSON call over the unix socket named in the state file), record status
// "paused" in the state file, unlock; resume is the same with
// "containerManager.Resume" and "running". Nearly all of its ~7 ms is
// starting the runsc binary. controlPause does exactly those steps in
// process (well under a millisecond), so runsc sees the same state as after
// its own pause: `runsc resume`, `runsc state`, checkpoint and delete keep
// working, and a sandbox paused this way survives a worker restart as
// paused. The kernel is paused by the sentry itself (all tasks stopped at a
// safe point), unlike a cgroup freeze (see the package comment).
//
// The state file and the urpc call are runsc internals of the pinned runsc
// version (internal/setup); anything unexpected (no state file, a field
// missing, no socket) makes the caller fall back to the runsc CLI, so a
// different runsc is slower, not broken.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// errNoControl says the in-process path does not apply; use the runsc CLI.
var errNoControl = errors.New("control socket path not usable")

// controlTimeout bounds one control call.
const controlTimeout = 10 * time.Second

// Control server methods (runsc/boot/controller.go).
const (
	ctlPause  = "containerManager.Pause"
	ctlResume = "containerManager.Resume"
)

// statePath and stateLockPath are runsc's state file and its lock: runsc
// names them <container id>_sandbox:<sandbox id>.state/.lock, and the
// driver's single-container sandboxes use one id for both.
func (d *Driver) statePath(id string) string {
	return filepath.Join(d.cfg.StateDir, id+"_sandbox:"+id+".state")
}

func (d *Driver) stateLockPath(id string) string {
	return filepath.Join(d.cfg.StateDir, id+"_sandbox:"+id+".lock")
}

// controlPause pauses (pause) or resumes (!pause) sandbox id as `runsc
// pause`/`runsc resume` would. A sandbox already in the wanted state is
// left alone. errNoControl: use the CLI. The caller holds lock(id).
func (d *Driver) controlPause(ctx context.Context, id string, pause bool) error {
	from, to, method := "running", "paused", ctlPause
	if !pause {
		from, to, method = "paused", "running", ctlResume
	}
	lf, err := os.OpenFile(d.stateLockPath(id), os.O_RDWR, 0)
	if err != nil {
		return errNoControl
	}
	defer lf.Close()
	if err := flock(ctx, lf); err != nil {
		return err
	}
	defer syscall.Flock(int(lf.Fd()), syscall.LOCK_UN)

	raw, err := os.ReadFile(d.statePath(id))
	if err != nil {
		return errNoControl
	}
	var st map[string]json.RawMessage
	if json.Unmarshal(raw, &st) != nil {
		return errNoControl
	}
	var status string
	var sb struct {
		ControlSocketPath string `json:"controlSocketPath"`
	}
	if json.Unmarshal(st["status"], &status) != nil || json.Unmarshal(st["sandbox"], &sb) != nil || sb.ControlSocketPath == "" {
		return errNoControl
	}
	switch status {
	case to:
		return nil
	case from:
	default:
		return fmt.Errorf("gvisor: %s %s: sandbox is %s", verbOf(pause), id, status)
	}
	if err := controlCall(ctx, sb.ControlSocketPath, method); err != nil {
		return fmt.Errorf("gvisor: %s %s: %w", verbOf(pause), id, err)
	}
	st["status"], _ = json.Marshal(to)
	out, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := writeReplace(d.statePath(id), out); err != nil {
		// The kernel is paused (resumed) but runsc would not know: undo.
		undo := ctlResume
		if !pause {
			undo = ctlPause
		}
		_ = controlCall(context.WithoutCancel(ctx), sb.ControlSocketPath, undo)
		return fmt.Errorf("gvisor: %s %s: record the state: %w", verbOf(pause), id, err)
	}
	return nil
}

func verbOf(pause bool) string {
	if pause {
		return "pause"
	}
	return "resume"
}

// flock takes an exclusive flock on f, as runsc does on the state lock,
// giving up when ctx ends.
func flock(ctx context.Context, f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("lock runsc state: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// writeReplace replaces path with data atomically (same mode as runsc's).
func writeReplace(path string, data []byte) error {
	tmp := path + ".airlock-tmp"
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// controlCall makes one argument-less urpc call: the request is the JSON
// {"method": m, "arg": null}, the answer {"success": bool, "err": string,
// "result": …}.
func controlCall(ctx context.Context, sockPath, method string) error {
	addr := sockPath
	if len(addr) >= 108 { // UNIX_PATH_MAX: reach it through an O_PATH fd, as runsc does
		fd, err := syscall.Open(sockPath, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open control socket: %w", err)
		}
		defer syscall.Close(fd)
		addr = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", addr)
	if err != nil {
		return fmt.Errorf("connect to the control server: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if err := json.NewEncoder(conn).Encode(struct {
		Method string `json:"method"`
		Arg    any    `json:"arg"`
	}{method, nil}); err != nil {
		return fmt.Errorf("call %s: %w", method, err)
	}
	var res struct {
		Success bool   `json:"success"`
		Err     string `json:"err"`
	}
	if err := json.NewDecoder(conn).Decode(&res); err != nil {
		return fmt.Errorf("call %s: read the answer: %w", method, err)
	}
	if !res.Success {
		return fmt.Errorf("call %s: %s", method, res.Err)
	}
	return nil
}
