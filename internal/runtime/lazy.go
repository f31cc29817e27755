package runtime

import (
	"context"
	"fmt"
	"slices"
)

// LazyConfig describes a runtime whose driver is set up in the background.
type LazyConfig struct {
	// Info is the runtime's name and powers, known before the set-up ends
	// (the worker registers it at once).
	Info Info
	// Setup makes the driver (downloads, builds, probes); it runs once, in
	// its own goroutine, under the context given to NewLazy. An error makes
	// the runtime unavailable with that reason.
	Setup func(ctx context.Context) (Driver, error)
	// Traces lists the ids this runtime has left a trace of on the host
	// (their run dirs), read without the driver: before the set-up ends
	// (or after it failed) these are the runtime's sandboxes, whose calls
	// wait for the set-up (or fail with its reason), and every other id is
	// not one of them. Nil: no sandbox survives a worker restart.
	Traces func() []string
}

// Lazy is a Driver set up in the background (the qemu runtime: a minute of
// packages, a kernel and an initramfs on a first start), so that the
// worker, and the other runtimes' sandboxes, need not wait for it. Calls
// for one of its sandboxes wait for the set-up; List, and Delete and
// Status of an id it has no trace of, never do. A failed set-up makes it
// unavailable (Availability): its own sandboxes fail with the reason and
// Multi keeps the others unaffected.
type Lazy struct {
	cfg   LazyConfig
	ready chan struct{}
	drv   Driver
	err   error
}

var (
	_ Driver        = (*Lazy)(nil)
	_ Pauser        = (*Lazy)(nil)
	_ Snapshotter   = (*Lazy)(nil)
	_ Describer     = (*Lazy)(nil)
	_ Availability  = (*Lazy)(nil)
	_ AutoPreferrer = (*Lazy)(nil)
	_ StopReasoner  = (*Lazy)(nil)
)

// NewLazy starts cfg.Setup and returns the driver that waits for it.
func NewLazy(ctx context.Context, cfg LazyConfig) *Lazy {
	l := &Lazy{cfg: cfg, ready: make(chan struct{})}
	go func() {
		defer close(l.ready)
		d, err := cfg.Setup(ctx)
		if err == nil && d == nil {
			err = fmt.Errorf("set-up returned no driver")
		}
		if err != nil {
			l.err = &UnavailableError{Runtime: cfg.Info.Name, Err: fmt.Errorf("%s runtime set-up: %w", cfg.Info.Name, err)}
			return
		}
		l.drv = d
	}()
	return l
}

// Ready is closed once the set-up has ended, well or not.
func (l *Lazy) Ready() <-chan struct{} { return l.ready }

// Driver returns the driver once set up (nil before, or after a failure).
func (l *Lazy) Driver() Driver {
	select {
	case <-l.ready:
		return l.drv
	default:
		return nil
	}
}

func (l *Lazy) get(ctx context.Context) (Driver, error) {
	select {
	case <-l.ready:
		return l.drv, l.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%s runtime is still being set up: %w", l.cfg.Info.Name, ctx.Err())
	}
}

// Unavailable is the reason the set-up failed; nil while it runs or after
// it succeeded.
func (l *Lazy) Unavailable() error {
	select {
	case <-l.ready:
		return l.err
	default:
		return nil
	}
}

// usable reports whether the driver is set up and working.
func (l *Lazy) usable() bool { return l.Driver() != nil }

// traces lists the ids the runtime has a trace of.
func (l *Lazy) traces() []string {
	if l.cfg.Traces == nil {
		return nil
	}
	return l.cfg.Traces()
}

// mine reports whether calls for id go to the driver: once it is set up;
// before (or after a failed set-up) only for ids with a trace, which then
// wait for the set-up (or fail with its reason).
func (l *Lazy) mine(id string) bool {
	return l.usable() || slices.Contains(l.traces(), id)
}

func (l *Lazy) Name() string { return l.cfg.Info.Name }

// Describe is the configured Info, also before the set-up ends.
func (l *Lazy) Describe(context.Context) Info { return l.cfg.Info }

func (l *Lazy) Start(ctx context.Context, spec Spec) (Sandbox, error) {
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return d.Start(ctx, spec)
}

func (l *Lazy) Adopt(ctx context.Context, id string) (Sandbox, error) {
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return d.Adopt(ctx, id)
}

func (l *Lazy) Delete(ctx context.Context, id string) error {
	if !l.mine(id) {
		return nil // not this runtime's: never wait for, or fail on, the set-up
	}
	d, err := l.get(ctx)
	if err != nil {
		return err
	}
	return d.Delete(ctx, id)
}

// List, until the driver is usable, is the ids with a trace: listing (a
// worker's adoption, a lookup of another runtime's id) never waits for the
// set-up; those sandboxes then wait for it, or fail with its reason.
func (l *Lazy) List(ctx context.Context) ([]string, error) {
	if !l.usable() {
		return l.traces(), nil
	}
	return l.drv.List(ctx)
}

func (l *Lazy) Status(ctx context.Context, id string) (Status, error) {
	if !l.mine(id) {
		return StatusGone, nil
	}
	d, err := l.get(ctx)
	if err != nil {
		return "", err
	}
	return d.Status(ctx, id)
}

func (l *Lazy) Pause(ctx context.Context, id string) error {
	d, err := l.get(ctx)
	if err != nil {
		return err
	}
	p, ok := d.(Pauser)
	if !ok {
		return Unsupported(l.Name(), "pause", "pause sandboxes")
	}
	return p.Pause(ctx, id)
}

func (l *Lazy) Resume(ctx context.Context, id string) error {
	d, err := l.get(ctx)
	if err != nil {
		return err
	}
	p, ok := d.(Pauser)
	if !ok {
		return Unsupported(l.Name(), "pause", "resume sandboxes")
	}
	return p.Resume(ctx, id)
}

func (l *Lazy) Checkpoint(ctx context.Context, id, dir string, leaveRunning bool) error {
	d, err := l.get(ctx)
	if err != nil {
		return err
	}
	s, ok := d.(Snapshotter)
	if !ok {
		return Unsupported(l.Name(), "snapshot", "snapshot sandboxes")
	}
	return s.Checkpoint(ctx, id, dir, leaveRunning)
}

func (l *Lazy) Restore(ctx context.Context, spec Spec, dir string) (Sandbox, error) {
	d, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	s, ok := d.(Snapshotter)
	if !ok {
		return nil, Unsupported(l.Name(), "snapshot", "restore sandboxes")
	}
	return s.Restore(ctx, spec, dir)
}

// PreferredForAuto asks the driver once it is set up; before, never.
func (l *Lazy) PreferredForAuto(ctx context.Context) bool {
	p, ok := l.Driver().(AutoPreferrer)
	return ok && p.PreferredForAuto(ctx)
}

// StopReason asks the driver once it is set up.
func (l *Lazy) StopReason(id string) string {
	if sr, ok := l.Driver().(StopReasoner); ok {
		return sr.StopReason(id)
	}
	return ""
}
