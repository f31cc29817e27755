package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/snapshot"
)

// Checkpoint writes the sandbox's state into dir with `runsc checkpoint`:
// the sentry's kernel state (checkpoint.img), guest memory (pages*.img) and
// the overlay's upper layer, which lives in the sentry's memory file whether
// its filestore is in RAM or in RunDir/<id>/overlay (verified by the
// conformance suite's SuspendWake case: files written before a checkpoint
// come back byte for byte). dir must exist.
//
// A paused sandbox stays paused throughout; a failed Checkpoint leaves it
// paused, which Status reports and Resume undoes.
//
// Without leaveRunning the guest stops ("stopped" in runsc) and the caller
// releases it with Delete. With leaveRunning the sandbox is restored in
// place right after the checkpoint (see resumeInPlace for why), paused again
// if it was paused. runsc kills the sandbox when a checkpoint fails
// (for example with a bound host socket inside); the error then says the
// sandbox was lost, and the caller must Delete it.
//
// Crash safety: the work is done by a helper process (this binary
// re-executed in its own session, see helper.go) that outlives the caller,
// so a worker SIGKILLed half-way does not cut the checkpoint or the resume
// in place short. The helper holds an exclusive flock on
// dir+snapshot.LockSuffix if that file exists (the snapshot store's
// Pending.Detach creates it), from before it starts until it exits, and
// once `runsc checkpoint` has succeeded it renames dir+snapshot.IntentSuffix
// (if present) to dir+snapshot.CompleteSuffix and fsyncs the directory:
// the snapshot store's Recover waits for the lock and commits what was
// marked complete, whether or not the caller lived to see it.
func (d *Driver) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	if err := validID(id); err != nil {
		return err
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("gvisor: checkpoint %s: image dir %q must be absolute: %w", id, dir, model.ErrInvalid)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("gvisor: checkpoint %s: image dir %q: not a directory (%v): %w", id, dir, err, model.ErrInvalid)
	}
	defer d.lock(id)()
	st, found, err := d.state(ctx, id)
	if err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	if !found {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, runtime.ErrNotFound)
	}
	if st.Status != "running" && st.Status != "paused" {
		return fmt.Errorf("gvisor: checkpoint %s: sandbox is %s, not running or paused: %w", id, st.Status, model.ErrConflict)
	}
	return d.checkpointDetached(ctx, id, dir, leaveRunning)
}

// checkpoint is Checkpoint's work, run by the helper process.
func (d *Driver) checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	st, found, err := d.state(ctx, id)
	if err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, err)
	}
	if !found {
		return fmt.Errorf("gvisor: checkpoint %s: %w", id, runtime.ErrNotFound)
	}
	if st.Status != "running" && st.Status != "paused" {
		return fmt.Errorf("gvisor: checkpoint %s: sandbox is %s, not running or paused: %w", id, st.Status, model.ErrConflict)
	}
	out, err := d.runsc(ctx, "checkpoint", "--image-path="+dir, "--exclude-committed-zero-pages", id)
	if err != nil {
		cerr := fmt.Errorf("runsc checkpoint: %w: %s", err, strings.TrimSpace(string(out)))
		// A failed checkpoint may have killed the sandbox: say so, so that
		// the caller does not report it running.
		after, serr := d.status(context.WithoutCancel(ctx), id)
		switch {
		case serr != nil:
			return fmt.Errorf("gvisor: checkpoint %s: %w (and its status is unknown: %v)", id, cerr, serr)
		case after == runtime.StatusRunning || after == runtime.StatusPaused:
			return fmt.Errorf("gvisor: checkpoint %s: %w (the sandbox is still %s)", id, cerr, after)
		default:
			return fmt.Errorf("gvisor: checkpoint %s failed and the sandbox was lost (now %s; Delete it): %w", id, after, cerr)
		}
	}
	if err := markComplete(dir); err != nil {
		d.log.Warn("mark checkpoint complete", "id", id, "err", err)
	}
	d.log.Info("sandbox checkpointed", "id", id, "dir", dir, "leave_running", leaveRunning)
	if !leaveRunning {
		return nil
	}
	if err := d.resumeInPlace(ctx, id, dir, st.Status == "paused"); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: the image is complete, but the sandbox was lost while resuming it (Delete it; it can be restored from the image): %w", id, err)
	}
	return nil
}

// markComplete renames dir's intent file to its completion marker (see
// Checkpoint) and fsyncs their directory; without an intent file it does
// nothing.
func markComplete(dir string) error {
	if err := os.Rename(dir+snapshot.IntentSuffix, dir+snapshot.CompleteSuffix); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	f, err := os.Open(filepath.Dir(dir))
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// resumeInPlace brings a sandbox that Checkpoint stopped back under the same
// id from the image it just wrote, keeping its run dir, bundle and channel
// listener (the agent's connection sees EOF and it redials the same socket).
//
// This is what Checkpoint does instead of `runsc checkpoint --leave-running`:
// with that flag the sandbox keeps running, but the guest's host-UDS
// connections lose their host side without ever seeing EOF (observed on this
// runsc version: the sandbox process holds no connection to agent.sock any
// more while the guest sockets stay "connected"), so the agent never redials
// and the channel is dead for good. A restore is ~0.1-0.3 s more.
//
// With paused, the restored sandbox is paused again right away. The caller
// holds lock(id).
func (d *Driver) resumeInPlace(ctx context.Context, id, dir string, paused bool) error {
	ctx = context.WithoutCancel(ctx) // half-way is the worst place to stop
	if out, err := d.runsc(ctx, "delete", "-force", id); err != nil && !notExist(out) {
		return fmt.Errorf("runsc delete: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := killStragglers(ctx, id, d.cgroupDirs(id)); err != nil {
		return err
	}
	for _, cg := range d.cgroupDirs(id) {
		if err := removeCgroup(cg); err != nil {
			return err
		}
	}
	sdir := d.sandboxDir(id)
	logPath := filepath.Join(sdir, "runsc.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	netns := d.networkNamespace(id)
	if netns != "" {
		// runsc took the guest's address and route off eth0 when it
		// started; the restore takes them again.
		if err := d.restoreGuestLink(id); err != nil {
			return err
		}
	}
	args := append(d.globalArgs(), d.sandboxArgs(id, d.diskMiB(id), netns != "")...)
	args = append(args, "restore", "--image-path="+dir, "--bundle", filepath.Join(sdir, "bundle"), "--detach", id)
	cmd := exec.CommandContext(ctx, d.cfg.RunscPath, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc restore: %w: %s", err, tail(logPath, 2048))
	}
	if paused {
		// Retried briefly: a pause right after restore has been seen to
		// find the control server not yet accepting (under load).
		var err error
		for attempt := 0; attempt < 10; attempt++ {
			if err = d.simple(ctx, "pause", id); err == nil {
				return nil
			}
			err = fmt.Errorf("pause after restore: %w", err)
			if st, found, serr := d.state(ctx, id); serr != nil || !found || st.Status != "running" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		return err
	}
	return nil
}

// Restore starts spec.ID from an image Checkpoint wrote into dir, with the
// same runsc flags as Start and a fresh run dir: new bundle, new channel
// listener (the agent's old connection sees EOF and it dials the new
// socket), new overlay dir. dir is only read, so one image can be restored
// under several ids (forks); each copy gets its own channel and overlay and
// takes spec.Hostname (runsc applies the new spec's hostname on restore;
// seen in the conformance Fork case), while everything else in the guest is
// the checkpointed state. spec.RootFS must be the template the image was
// taken on. Guest memory loads in the background (`--background`): the
// sandbox runs as soon as the kernel state is loaded and a page not yet
// loaded is waited for when touched; the image's files stay readable
// through the sentry's open descriptors even if dir is removed meanwhile.
// Checkpoints leave committed zero pages out (--exclude-committed-zero-pages).
// On failure nothing of spec.ID is left.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("gvisor: restore %s: image dir %q must be absolute: %w", spec.ID, dir, model.ErrInvalid)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("gvisor: restore %s: image dir %q: not a directory (%v): %w", spec.ID, dir, err, model.ErrInvalid)
	}
	if err := validID(spec.ID); err != nil {
		return nil, err
	}
	// runsc state without a run dir (a crash half-way through Delete) would
	// make the restore fail late; refuse early without touching it. runsc knows a container by its state file: looking for it saves a
	// `runsc state` process (~7 ms) on every wake.
	if _, err := os.Stat(d.statePath(spec.ID)); err == nil {
		return nil, fmt.Errorf("gvisor: restore %s: sandbox exists: %w", spec.ID, model.ErrConflict)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("gvisor: restore %s: %w", spec.ID, err)
	}
	return d.launch(ctx, "restore", spec, func(bundle string) []string {
		return []string{"restore", "--image-path=" + dir, "--background", "--bundle", bundle, "--detach", spec.ID}
	})
}
