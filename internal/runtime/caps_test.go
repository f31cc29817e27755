package runtime_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/runtime"
)

// snapDriver is a fakeDriver that also snapshots and declares caps.
type snapDriver struct {
	*fakeDriver
	caps        runtime.Caps
	checkpoints int
}

func (d *snapDriver) Describe(context.Context) runtime.Info {
	return runtime.Info{Name: d.name, Caps: d.caps}
}
func (d *snapDriver) Checkpoint(context.Context, string, string, bool) error {
	d.checkpoints++
	return nil
}
func (d *snapDriver) Restore(ctx context.Context, spec runtime.Spec, _ string) (runtime.Sandbox, error) {
	return d.Start(ctx, spec)
}

func newFake(name string) *fakeDriver { return &fakeDriver{name: name, paused: map[string]bool{}} }

// TestMultiInfos: Multi reports each runtime's declared powers under its
// name, the implied powers of a driver that declares none, and for "auto"
// what every offered runtime has.
func TestMultiInfos(t *testing.T) {
	ctx := context.Background()
	all := runtime.Caps{Pause: true, Snapshot: true, LeaveRunning: true, Fork: true}
	m := &runtime.Multi{Default: "a", Drivers: map[string]runtime.Driver{
		"a": &snapDriver{fakeDriver: newFake("a"), caps: all},
		"b": newFake("b"), // Pauser only, no Describe
		"c": &snapDriver{fakeDriver: newFake("c"), caps: runtime.Caps{Pause: true, Snapshot: true, Network: true}},
	}}
	got := m.Infos(ctx)
	want := []runtime.Info{
		{Name: "a", Caps: all},
		{Name: "b", Caps: runtime.Caps{Pause: true}},
		{Name: "c", Caps: runtime.Caps{Pause: true, Snapshot: true, Network: true}},
		{Name: runtime.Auto, Caps: runtime.Caps{Pause: true}},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Infos =\n%+v\nwant\n%+v", got, want)
	}
	if d := m.Describe(ctx); d != want[0] {
		t.Errorf("Describe = %+v, want the default's %+v", d, want[0])
	}
	single := &runtime.Multi{Default: "a", Drivers: map[string]runtime.Driver{"a": newFake("a")}}
	if got := single.Infos(ctx); !slices.Equal(got, []runtime.Info{{Name: "a", Caps: runtime.Caps{Pause: true}}}) {
		t.Errorf("one runtime: Infos = %+v, want it alone (no auto)", got)
	}
}

// TestMultiUnsupported: a call for a power the sandbox's runtime lacks —
// no interface, or an interface whose power it does not declare — fails
// with ErrUnsupported naming the runtime and the power, and never reaches
// the driver.
func TestMultiUnsupported(t *testing.T) {
	ctx := context.Background()
	plain := newFake("plain") // pauses, cannot snapshot
	stopOnly := &snapDriver{fakeDriver: newFake("stoponly"), caps: runtime.Caps{Snapshot: true}}
	m := &runtime.Multi{Default: "plain", Drivers: map[string]runtime.Driver{"plain": plain, "stoponly": stopOnly}}
	for _, spec := range []runtime.Spec{{ID: "p"}, {ID: "s", Runtime: "stoponly"}} {
		if _, err := m.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, err error, runtimeName, capability string) {
		t.Helper()
		if !errors.Is(err, runtime.ErrUnsupported) {
			t.Errorf("%s = %v, want ErrUnsupported", what, err)
			return
		}
		for _, w := range []string{"runtime " + runtimeName, capability} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not name %q", what, err, w)
			}
		}
	}
	check("Checkpoint on a driver without Snapshotter", m.Checkpoint(ctx, "p", t.TempDir(), false), "plain", "snapshot")
	_, err := m.Restore(ctx, runtime.Spec{ID: "r"}, t.TempDir())
	check("Restore on a driver without Snapshotter", err, "plain", "snapshot")
	check("Pause on a driver that does not declare pause", m.Pause(ctx, "s"), "stoponly", "pause")
	check("Resume on a driver that does not declare pause", m.Resume(ctx, "s"), "stoponly", "pause")
	check("leave-running Checkpoint without leave_running", m.Checkpoint(ctx, "s", t.TempDir(), true), "stoponly", "leave_running")
	if stopOnly.checkpoints != 0 || stopOnly.paused["s"] {
		t.Fatalf("a refused call reached the driver (%d checkpoints, paused %v)", stopOnly.checkpoints, stopOnly.paused["s"])
	}
	if err := m.Checkpoint(ctx, "s", t.TempDir(), false); err != nil || stopOnly.checkpoints != 1 {
		t.Errorf("declared Checkpoint = %v (%d calls), want it done", err, stopOnly.checkpoints)
	}
	if err := m.Pause(ctx, "p"); err != nil {
		t.Errorf("Pause on a Pauser without Describe = %v", err)
	}
}

// TestLazy: while the set-up runs, the runtime's Info is known, List is
// the ids with a trace, calls for other ids neither wait nor fail, and
// calls for its own sandboxes wait; a failed set-up makes it unavailable
// with the reason; a finished one forwards every call.
func TestLazy(t *testing.T) {
	ctx := context.Background()
	info := runtime.Info{Name: "vm", Caps: runtime.Caps{Pause: true}}
	release := make(chan error)
	drv := newFake("vm")
	drv.ids = []string{"old"}
	l := runtime.NewLazy(ctx, runtime.LazyConfig{
		Info:   info,
		Traces: func() []string { return []string{"old"} },
		Setup: func(ctx context.Context) (runtime.Driver, error) {
			if err := <-release; err != nil {
				return nil, err
			}
			return drv, nil
		},
	})
	if got := l.Describe(ctx); got != info || l.Name() != "vm" {
		t.Errorf("Describe before set-up = %+v, want %+v", got, info)
	}
	if ids, err := l.List(ctx); err != nil || !slices.Equal(ids, []string{"old"}) {
		t.Errorf("List during set-up = %v, %v; want the traced ids", ids, err)
	}
	if st, err := l.Status(ctx, "other"); err != nil || st != runtime.StatusGone {
		t.Errorf("Status of another id during set-up = %q, %v; want gone at once", st, err)
	}
	if err := l.Delete(ctx, "other"); err != nil {
		t.Errorf("Delete of another id during set-up = %v", err)
	}
	if err := l.Unavailable(); err != nil {
		t.Errorf("Unavailable during set-up = %v", err)
	}
	if l.PreferredForAuto(ctx) {
		t.Error("preferred for auto before its set-up ended")
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := l.Status(short, "old"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "still being set up") {
		t.Errorf("Status of a traced id during set-up = %v, want it to wait for the set-up", err)
	}
	if _, err := l.Start(short, runtime.Spec{ID: "new"}); err == nil {
		t.Error("Start during set-up did not wait")
	}
	release <- nil
	<-l.Ready()
	if _, err := l.Start(ctx, runtime.Spec{ID: "new"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Pause(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	if st, err := l.Status(ctx, "new"); err != nil || st != runtime.StatusPaused {
		t.Errorf("Status after set-up = %q, %v; want paused (forwarded)", st, err)
	}
	if ids, _ := l.List(ctx); !slices.Equal(ids, []string{"old", "new"}) {
		t.Errorf("List after set-up = %v, want the driver's", ids)
	}
	if err := l.Checkpoint(ctx, "new", t.TempDir(), false); !errors.Is(err, runtime.ErrUnsupported) {
		t.Errorf("Checkpoint on a driver without Snapshotter = %v, want ErrUnsupported", err)
	}

	failed := runtime.NewLazy(ctx, runtime.LazyConfig{
		Info:   info,
		Traces: func() []string { return []string{"old"} },
		Setup:  func(context.Context) (runtime.Driver, error) { return nil, errors.New("no kernel here") },
	})
	<-failed.Ready()
	if err := failed.Unavailable(); !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "vm runtime set-up: no kernel here") {
		t.Errorf("Unavailable after a failed set-up = %v", err)
	}
	if _, err := failed.Start(ctx, runtime.Spec{ID: "x"}); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Start after a failed set-up = %v, want the reason", err)
	}
	if err := failed.Delete(ctx, "other"); err != nil {
		t.Errorf("Delete of another id after a failed set-up = %v", err)
	}
	if err := failed.Delete(ctx, "old"); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Delete of its own sandbox after a failed set-up = %v, want the reason", err)
	}
}
