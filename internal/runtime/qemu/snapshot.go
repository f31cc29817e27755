package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
)

// A snapshot directory holds:
//
//	qemu.json   the machine description a restore must match (memory, vCPUs, accel, cmdline, image)
//	state.bin   device state (QMP migrate to a descriptor the worker passes, x-ignore-shared: guest RAM is not in it)
//	mem.ram     guest RAM (the memory-backend-file, copied sparse)
//	disk.ext4   the writable disk (copied sparse)

// migrateFD names the state.bin descriptor handed to QEMU for a migration.
const migrateFD = "airlock-state"

// Checkpoint stops the guest, migrates its device state into dir and copies
// its RAM file and disk. With leaveRunning a guest that was running
// continues; without it the guest stays stopped for the caller's Delete.
func (d *Driver) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	unlock := d.lock(id)
	defer unlock()
	st, err := readState(d.dir(id))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("qemu checkpoint %s: %w", id, runtime.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("qemu checkpoint %s: %w", id, err)
	}
	status, err := d.queryStatus(ctx, id)
	if err != nil {
		return fmt.Errorf("qemu checkpoint %s: %w", id, err)
	}
	wasRunning := status == "running"
	err = d.checkpoint(ctx, st, dir)
	if (err != nil || leaveRunning) && wasRunning {
		if cerr := d.qmp(context.WithoutCancel(ctx), id, "cont", nil, nil); cerr != nil {
			err = errors.Join(err, fmt.Errorf("resume after checkpoint: %w", cerr))
		}
	}
	if err != nil {
		return fmt.Errorf("qemu checkpoint %s: %w", id, err)
	}
	return nil
}

func (d *Driver) checkpoint(ctx context.Context, st state, dir string) error {
	if strings.ContainsAny(dir, "'\n") {
		return fmt.Errorf("snapshot dir %q: %w", dir, model.ErrInvalid)
	}
	// The device state goes to a file the worker opens and hands to QEMU
	// (getfd): the confined QEMU may not exec (spawn=deny) and, running as
	// an unprivileged user, could not open the snapshot dir anyway.
	f, err := os.OpenFile(filepath.Join(dir, "state.bin"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	err = d.qmpSeq(ctx, st.ID, []qmpCmd{
		{name: "stop"},
		{name: "migrate-set-capabilities", args: ignoreShared},
		{name: "getfd", args: map[string]any{"fdname": migrateFD}, fd: f},
		{name: "migrate", args: map[string]any{"uri": "fd:" + migrateFD}},
	})
	if err != nil {
		return err
	}
	if err := d.waitMigration(ctx, st.ID); err != nil {
		return err
	}
	run := d.dir(st.ID)
	for _, f := range []string{"mem.ram", "disk.ext4"} {
		if err := sparseCopy(ctx, filepath.Join(run, f), filepath.Join(dir, f)); err != nil {
			return err
		}
	}
	return writeJSON(filepath.Join(dir, "qemu.json"), st)
}

// Restore boots spec.ID from a snapshot: same machine, RAM and disk copied
// from dir (which stays untouched, so it can be restored again), QEMU
// started with -incoming defer, the device state migrated in, then cont.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	if err := validID(spec.ID); err != nil {
		return nil, fmt.Errorf("qemu restore: %w", err)
	}
	if strings.ContainsAny(dir, "'\n") {
		return nil, fmt.Errorf("qemu restore: snapshot dir %q: %w", dir, model.ErrInvalid)
	}
	var snap state
	b, err := os.ReadFile(filepath.Join(dir, "qemu.json"))
	if err == nil {
		err = json.Unmarshal(b, &snap)
	}
	if err != nil {
		return nil, fmt.Errorf("qemu restore %s: read snapshot: %w", spec.ID, err)
	}
	if err := checkNetwork(spec.Network); err != nil {
		return nil, fmt.Errorf("qemu restore %s: %w", spec.ID, err)
	}
	if err := sameGuestNetwork(snap, spec.Network); err != nil {
		return nil, fmt.Errorf("qemu restore %s: %w", spec.ID, err)
	}
	unlock := d.lock(spec.ID)
	defer unlock()
	if _, err := os.Lstat(d.dir(spec.ID)); err == nil {
		return nil, fmt.Errorf("qemu restore %s: %w", spec.ID, model.ErrConflict)
	}
	if accel := d.Accel(ctx); accel != snap.Accel {
		return nil, fmt.Errorf("qemu restore %s: the snapshot was taken under %s, this worker runs %s: %w", spec.ID, snap.Accel, accel, model.ErrConflict)
	}
	if _, err := os.Stat(snap.Image); err != nil {
		// The image cache was cleared: rebuild it from the template.
		if spec.RootFS == "" {
			return nil, fmt.Errorf("qemu restore %s: template image: %w", spec.ID, err)
		}
		if snap.Image, err = d.image(ctx, spec.RootFS); err != nil {
			return nil, fmt.Errorf("qemu restore %s: %w", spec.ID, err)
		}
	}
	st := snap
	st.ID = spec.ID
	st.Network = spec.Network
	if spec.RootFS != "" {
		st.RootFS = spec.RootFS
	}
	sb, err := d.restore(ctx, st, dir)
	if err != nil {
		d.deleteLocked(context.WithoutCancel(ctx), spec.ID)
		return nil, fmt.Errorf("qemu restore %s: %w", spec.ID, err)
	}
	return sb, nil
}

func (d *Driver) restore(ctx context.Context, st state, dir string) (*sandbox, error) {
	sb, err := d.boot(ctx, st, dir)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(dir, "state.bin"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	err = d.qmpSeq(ctx, st.ID, []qmpCmd{
		{name: "migrate-set-capabilities", args: ignoreShared},
		{name: "getfd", args: map[string]any{"fdname": migrateFD}, fd: f},
		{name: "migrate-incoming", args: map[string]any{"uri": "fd:" + migrateFD}},
	})
	if err != nil {
		return nil, err
	}
	if err := d.waitMigration(ctx, st.ID); err != nil {
		return nil, err
	}
	if err := d.qmp(ctx, st.ID, "cont", nil, nil); err != nil {
		return nil, err
	}
	return sb, nil
}

// sameGuestNetwork refuses to restore snap's guest into network n when the
// guest was configured for another: its NIC's MAC, addresses, route and
// resolvers are in its memory (the kernel command line it booted with), so
// it would send from an address or MAC the filter drops, or believe in a
// network it does not have.
func sameGuestNetwork(snap state, n runtime.Network) error {
	had := agentapi.ParseVMCmdline(snap.Append).Net
	want := guestNet(n)
	if had.String() != want.String() {
		what := func(g agentapi.VMNet) string {
			if g.IsZero() {
				return "none (eth0 down)"
			}
			return g.String()
		}
		return fmt.Errorf("the snapshot's guest network is %s, this worker hands it %s (egress on one and off on the other?): %w",
			what(had), what(want), model.ErrInvalid)
	}
	if nicMAC(snap.Network) != nicMAC(n) {
		return fmt.Errorf("the snapshot's guest NIC is %s, this worker's network wants %s: %w", nicMAC(snap.Network), nicMAC(n), model.ErrInvalid)
	}
	return nil
}
