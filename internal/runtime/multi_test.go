package runtime_test

import (
	"context"
	"net"
	"slices"
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
