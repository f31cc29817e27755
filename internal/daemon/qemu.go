package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	airruntime "github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/qemu"
	"github.com/airlock/airlock/internal/setup"
)

// lazyQEMU is the qemu runtime, set up in the background: on a first start
// its set-up (QEMU packages, the Debian cloud kernel, the initramfs) takes a
// minute, and gVisor sandboxes need not wait for it. Calls for a qemu
// sandbox wait for the set-up; List, and Delete and Status of an id that is
// not a qemu sandbox (no run dir), never do.
type lazyQEMU struct {
	runDir string
	once   sync.Once
	ready  chan struct{}
	drv    *qemu.Driver
	err    error
}

var (
	_ airruntime.Driver      = (*lazyQEMU)(nil)
	_ airruntime.Pauser      = (*lazyQEMU)(nil)
	_ airruntime.Snapshotter = (*lazyQEMU)(nil)
)

var _ airruntime.Availability = (*lazyQEMU)(nil)

// newLazyQEMU starts setting up the qemu runtime under dataDir. A failed
// set-up makes the runtime unavailable (Unavailable says why): its own
// sandboxes fail with that reason, and gVisor's are not affected.
func newLazyQEMU(ctx context.Context, dataDir, agent string, progress io.Writer, log *slog.Logger) *lazyQEMU {
	l := &lazyQEMU{runDir: filepath.Join(dataDir, "qemu-run"), ready: make(chan struct{})}
	go func() {
		defer close(l.ready)
		assets, err := setup.EnsureQEMU(ctx, dataDir, agent, progress)
		if err == nil {
			l.drv, err = qemu.New(qemu.Config{Assets: assets, CacheDir: dataDir, RunDir: l.runDir, Logger: log.With("component", "qemu")})
		}
		if err != nil {
			l.drv = nil
			l.err = &airruntime.UnavailableError{Runtime: qemu.Name, Err: fmt.Errorf("qemu runtime set-up: %w", err)}
			log.Error("qemu runtime unavailable; gVisor sandboxes are not affected", "err", err)
			fmt.Fprintf(progress, "qemu: runtime unavailable: %v\n", err)
			return
		}
		fmt.Fprintf(progress, "qemu: runtime ready (guest kernel %s, accel %s)\n", assets.KernelRelease, l.drv.Accel(ctx))
	}()
	return l
}

func (l *lazyQEMU) get(ctx context.Context) (*qemu.Driver, error) {
	select {
	case <-l.ready:
		return l.drv, l.err
	case <-ctx.Done():
		return nil, fmt.Errorf("qemu runtime is still being set up: %w", ctx.Err())
	}
}

// Unavailable is the reason the set-up failed; nil while it runs or after
// it succeeded.
func (l *lazyQEMU) Unavailable() error {
	select {
	case <-l.ready:
		return l.err
	default:
		return nil
	}
}

// isReady reports whether the set-up has finished (well or not).
func (l *lazyQEMU) isReady() bool {
	select {
	case <-l.ready:
		return true
	default:
		return false
	}
}

// has reports whether a qemu sandbox id has left a trace here (its run dir:
// the driver creates it first and removes it last). Until the driver is
// usable this is all that is known, and enough: an id without a run dir is
// not a qemu sandbox, and its calls need not wait for the set-up.
func (l *lazyQEMU) has(id string) bool {
	if id == "" || id != filepath.Base(id) || id[0] == '.' {
		return false
	}
	_, err := os.Lstat(filepath.Join(l.runDir, id))
	return err == nil
}

// own lists the sandbox ids with a run dir.
func (l *lazyQEMU) own() []string {
	entries, _ := os.ReadDir(l.runDir)
	var ids []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// usable reports whether calls go to the driver: once it is set up; before
// (or after a failed set-up) only for ids with a run dir, which then wait
// for the set-up (or fail with its reason).
func (l *lazyQEMU) usable(id string) bool {
	return (l.isReady() && l.err == nil) || l.has(id)
}

func (l *lazyQEMU) Name() string { return qemu.Name }

func (l *lazyQEMU) Start(ctx context.Context, spec airruntime.Spec) (airruntime.Sandbox, error) {
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return d.Start(ctx, spec)
}

func (l *lazyQEMU) Adopt(ctx context.Context, id string) (airruntime.Sandbox, error) {
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return d.Adopt(ctx, id)
}

func (l *lazyQEMU) Delete(ctx context.Context, id string) error {
	if !l.usable(id) {
		return nil // not a qemu sandbox: never wait for, or fail on, the set-up
	}
	d, err := l.get(ctx)
	if err != nil {
		return err
	}
	return d.Delete(ctx, id)
}

// List, until the driver is usable, is the ids with a run dir: listing (a
// worker's adoption, a lookup of another runtime's id) never waits for the
// set-up; those sandboxes then wait for it, or fail with its reason.
func (l *lazyQEMU) List(ctx context.Context) ([]string, error) {
	if !l.isReady() || l.err != nil {
		return l.own(), nil
	}
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return d.List(ctx)
}

func (l *lazyQEMU) Status(ctx context.Context, id string) (airruntime.Status, error) {
	if !l.usable(id) {
		return airruntime.StatusGone, nil
	}
	d, err := l.get(ctx)
	if err != nil {
		return "", err
	}
	return d.Status(ctx, id)
}

func (l *lazyQEMU) Pause(ctx context.Context, id string) error {
	d, err := l.get(ctx)
	if err != nil {
		return err
	}
	return d.Pause(ctx, id)
}

func (l *lazyQEMU) Resume(ctx context.Context, id string) error {
	d, err := l.get(ctx)
	if err != nil {
		return err
	}
	return d.Resume(ctx, id)
}

func (l *lazyQEMU) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	d, err := l.get(ctx)
	if err != nil {
		return err
	}
	return d.Checkpoint(ctx, id, dir, leaveRunning)
}

func (l *lazyQEMU) Restore(ctx context.Context, spec airruntime.Spec, dir string) (airruntime.Sandbox, error) {
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return d.Restore(ctx, spec, dir)
}

// PreferredForAuto: "auto" sandboxes go to qemu only where hardware KVM
// boots guests; under TCG emulation gVisor is far faster.
func (l *lazyQEMU) PreferredForAuto(ctx context.Context) bool {
	select {
	case <-l.ready:
		return l.drv != nil && l.drv.Accel(ctx) == "kvm"
	default:
		return false
	}
}

// StopReason says why a stopped qemu sandbox stopped (guest panic, QEMU crash).
func (l *lazyQEMU) StopReason(id string) string {
	select {
	case <-l.ready:
		if l.drv != nil {
			return l.drv.StopReason(id)
		}
	default:
	}
	return ""
}
