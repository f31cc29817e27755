package runtime_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/airlock/airlock/internal/runtime"
)

// fakeDriver is an in-memory driver that counts List calls.
type fakeDriver struct {
	name   string
	mu     sync.Mutex
	ids    []string
	lists  int
	paused map[string]bool
}

type fakeSandbox struct{ id string }

func (s fakeSandbox) ID() string                                      { return s.id }
func (s fakeSandbox) AgentConn(ctx context.Context) (net.Conn, error) { return nil, ctx.Err() }
func (s fakeSandbox) Close() error                                    { return nil }

func (d *fakeDriver) Name() string { return d.name }
func (d *fakeDriver) Start(_ context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ids = append(d.ids, spec.ID)
	return fakeSandbox{spec.ID}, nil
}
func (d *fakeDriver) Adopt(_ context.Context, id string) (runtime.Sandbox, error) {
	return fakeSandbox{id}, nil
}
func (d *fakeDriver) Delete(_ context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ids = slices.DeleteFunc(d.ids, func(x string) bool { return x == id })
	return nil
}
func (d *fakeDriver) List(context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lists++
	return slices.Clone(d.ids), nil
}
func (d *fakeDriver) Status(_ context.Context, id string) (runtime.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.Contains(d.ids, id) {
		return runtime.StatusGone, nil
	}
	if d.paused[id] {
		return runtime.StatusPaused, nil
	}
	return runtime.StatusRunning, nil
}
func (d *fakeDriver) Pause(_ context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.Contains(d.ids, id) {
		return runtime.ErrNotFound
	}
	d.paused[id] = true
	return nil
}
func (d *fakeDriver) Resume(_ context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.paused, id)
	return nil
}

// TestMultiRemembersOwners: calls by id go to the driver that started the
// sandbox without listing every driver each time; a sandbox found by
// listing (adopted after a restart) is remembered too; Delete forgets.
func TestMultiRemembersOwners(t *testing.T) {
	ctx := context.Background()
	a := &fakeDriver{name: "a", paused: map[string]bool{}}
	b := &fakeDriver{name: "b", paused: map[string]bool{}, ids: []string{"old"}}
	m := &runtime.Multi{Drivers: map[string]runtime.Driver{"a": a, "b": b}, Default: "a"}
	if _, err := m.Start(ctx, runtime.Spec{ID: "x", Runtime: "b"}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := m.Pause(ctx, "x"); err != nil {
			t.Fatal(err)
		}
		if err := m.Resume(ctx, "x"); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := m.Status(ctx, "x"); st != runtime.StatusRunning {
		t.Fatalf("status %s", st)
	}
	if a.lists+b.lists != 0 {
		t.Fatalf("calls on a started sandbox listed drivers %d times", a.lists+b.lists)
	}
	// Not started through m: found by listing once, then remembered.
	if err := m.Pause(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	n := a.lists + b.lists
	if n == 0 {
		t.Fatal("an unknown id was not looked up")
	}
	if err := m.Resume(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	if a.lists+b.lists != n {
		t.Fatalf("a looked-up id was listed again")
	}
	if err := m.Delete(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if st, _ := m.Status(ctx, "x"); st != runtime.StatusGone {
		t.Fatalf("status after delete: %s", st)
	}
	if err := m.Pause(ctx, "x"); err == nil {
		t.Fatal("pause of a deleted sandbox succeeded")
	}
}

// brokenDriver fails every call the way a runtime whose set-up failed does
// (the lazy qemu runtime when the agent is not static), and has no sandbox.
type brokenDriver struct{ err error }

func (d brokenDriver) Name() string       { return "qemu" }
func (d brokenDriver) Unavailable() error { return d.err }
func (d brokenDriver) Start(context.Context, runtime.Spec) (runtime.Sandbox, error) {
	return nil, d.err
}
func (d brokenDriver) Adopt(context.Context, string) (runtime.Sandbox, error) { return nil, d.err }
func (d brokenDriver) Delete(context.Context, string) error                   { return d.err }
func (d brokenDriver) List(context.Context) ([]string, error)                 { return nil, d.err }
func (d brokenDriver) Status(context.Context, string) (runtime.Status, error) { return "", d.err }

// TestMultiIsolatesUnavailableDriver: an unavailable runtime does not make
// List, Status or Delete of another runtime's sandbox fail, is not offered,
// and a Start on it fails at once with its reason.
func TestMultiIsolatesUnavailableDriver(t *testing.T) {
	ctx := context.Background()
	reason := &runtime.UnavailableError{Runtime: "qemu", Err: errors.New("qemu runtime set-up: the agent is the guest's /init and must be static")}
	g := &fakeDriver{name: "gvisor", paused: map[string]bool{}}
	m := &runtime.Multi{Drivers: map[string]runtime.Driver{"gvisor": g, "qemu": brokenDriver{reason}}, Default: "gvisor"}
	if got := m.Offered(); !slices.Equal(got, []string{"gvisor"}) {
		t.Errorf("Offered = %v, want [gvisor]", got)
	}
	if _, err := m.Start(ctx, runtime.Spec{ID: "a", Runtime: "gvisor"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(ctx, runtime.Spec{ID: "q", Runtime: "qemu"}); !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "must be static") {
		t.Errorf("Start(qemu) = %v, want the qemu runtime's reason", err)
	}
	// A fresh Multi over the same drivers is a restarted worker: nothing
	// remembered, so every call must get past the broken driver.
	for _, mm := range []*runtime.Multi{m, {Drivers: m.Drivers, Default: "gvisor"}} {
		ids, err := mm.List(ctx)
		if err != nil || !slices.Equal(ids, []string{"a"}) {
			t.Errorf("List = %v, %v; want [a]", ids, err)
		}
		if st, err := mm.Status(ctx, "a"); err != nil || st != runtime.StatusRunning {
			t.Errorf("Status = %q, %v", st, err)
		}
	}
	if err := m.Delete(ctx, "a"); err != nil {
		t.Errorf("Delete of a gvisor sandbox = %v; it must not consult the qemu runtime", err)
	}
	if ids, _ := m.List(ctx); len(ids) != 0 {
		t.Errorf("after Delete, List = %v", ids)
	}
}
