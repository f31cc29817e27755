package worker

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/testenv"
)

// netDriver declares caps and records the network each Start and Restore
// is handed, and whether its namespace existed then; failStart makes Start
// fail after that.
type netDriver struct {
	caps      runtime.Caps
	failStart error
	got       runtime.Network
	existed   bool
	deleted   []string
	preferred bool // for "auto"
}

func (d *netDriver) PreferredForAuto(context.Context) bool { return d.preferred }

func (d *netDriver) Name() string { return "net-test" }
func (d *netDriver) Describe(context.Context) runtime.Info {
	return runtime.Info{Name: d.Name(), Caps: d.caps}
}
func (d *netDriver) Start(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	d.got, d.existed = spec.Network, spec.Network.Namespace != "" && network.Exists(spec.ID)
	if d.failStart != nil {
		return nil, d.failStart
	}
	return nopSandbox(spec.ID), nil
}
func (d *netDriver) Restore(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	return d.Start(ctx, spec)
}
func (d *netDriver) Checkpoint(context.Context, string, string, bool) error { return nil }
func (d *netDriver) Adopt(context.Context, string) (runtime.Sandbox, error) {
	return nil, runtime.ErrNotFound
}
func (d *netDriver) Delete(_ context.Context, id string) error {
	d.deleted = append(d.deleted, id)
	return nil
}
func (d *netDriver) List(context.Context) ([]string, error) { return nil, nil }
func (d *netDriver) Status(context.Context, string) (runtime.Status, error) {
	return runtime.StatusGone, nil
}

type nopSandbox string

func (s nopSandbox) ID() string                                  { return string(s) }
func (s nopSandbox) AgentConn(context.Context) (net.Conn, error) { return nil, errors.New("none") }
func (s nopSandbox) Close() error                                { return nil }

// TestNetworkAroundRuntime: the worker makes a sandbox's network before the
// driver starts or restores it, hands it over in Spec.Network, and
// releases it after Delete and after a failed start; a runtime without a
// network device gets the zero Network.
func TestNetworkAroundRuntime(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces")
	ctx := context.Background()
	d := &netDriver{caps: runtime.Caps{Network: true, Snapshot: true}}
	w := &Worker{cfg: Config{Driver: d}, log: slog.New(slog.DiscardHandler)}

	id := model.NewID("sb")
	t.Cleanup(func() { network.Release(ctx, id) })
	if _, err := w.startRuntime(ctx, runtime.Spec{ID: id, Runtime: d.Name()}, nil); err != nil {
		t.Fatal(err)
	}
	if d.got.Namespace != network.Path(id) || len(d.got.Interfaces) != 1 || d.got.Interfaces[0].Name != network.TapName || !d.existed {
		t.Fatalf("Start was handed %+v (namespace there: %v); want %s with %s", d.got, d.existed, network.Path(id), network.TapName)
	}
	if err := w.deleteRuntime(ctx, id); err != nil {
		t.Fatal(err)
	}
	if len(d.deleted) != 1 || d.deleted[0] != id || network.Exists(id) {
		t.Errorf("after deleteRuntime: driver deletes %v, namespace there: %v", d.deleted, network.Exists(id))
	}

	// Restore, the same.
	if _, err := w.restoreRuntime(ctx, d, runtime.Spec{ID: id, Runtime: d.Name()}, t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	if !d.existed {
		t.Errorf("Restore was handed %+v without its namespace", d.got)
	}
	if err := w.deleteRuntime(ctx, id); err != nil || network.Exists(id) {
		t.Errorf("deleteRuntime after restore: %v; namespace there: %v", err, network.Exists(id))
	}

	// A failed start leaves no network; one refused for an existing id
	// (ErrConflict) leaves the network in place (it is that sandbox's).
	d.failStart = errors.New("boom")
	if _, err := w.startRuntime(ctx, runtime.Spec{ID: id, Runtime: d.Name()}, nil); err == nil {
		t.Fatal("start did not fail")
	}
	if network.Exists(id) {
		t.Errorf("a failed start left its namespace")
	}
	d.failStart = model.ErrConflict
	w.startRuntime(ctx, runtime.Spec{ID: id, Runtime: d.Name()}, nil)
	if !network.Exists(id) {
		t.Errorf("a start refused for an existing id released the namespace")
	}
	if err := w.deleteRuntime(ctx, id); err != nil || network.Exists(id) {
		t.Errorf("deleteRuntime: %v; namespace there: %v", err, network.Exists(id))
	}

	// No network device: nothing made, the zero Network handed over.
	d.caps, d.failStart = runtime.Caps{Snapshot: true}, nil
	if _, err := w.startRuntime(ctx, runtime.Spec{ID: id, Runtime: d.Name()}, nil); err != nil {
		t.Fatal(err)
	}
	if d.got.Namespace != "" || len(d.got.Interfaces) != 0 || network.Exists(id) {
		t.Errorf("a runtime without a network device was handed %+v (namespace there: %v)", d.got, network.Exists(id))
	}
	w.deleteRuntime(ctx, id)
}

// TestNetworkForAuto: an "auto" sandbox gets the network of the runtime it
// lands on (qemu where KVM works), not of "auto"'s common powers.
func TestNetworkForAuto(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces")
	ctx := context.Background()
	vm := &netDriver{caps: runtime.Caps{Network: true}}
	plain := &netDriver{caps: runtime.Caps{Pause: true}}
	w := &Worker{cfg: Config{Driver: &runtime.Multi{Drivers: map[string]runtime.Driver{"plain": plain, "vm": vm}, Default: "plain"}}, log: slog.New(slog.DiscardHandler)}
	id := model.NewID("sb")
	t.Cleanup(func() { network.Release(ctx, id) })
	for _, prefer := range []bool{true, false} {
		vm.preferred, vm.got, plain.got = prefer, runtime.Network{}, runtime.Network{}
		if _, err := w.startRuntime(ctx, runtime.Spec{ID: id, Runtime: runtime.Auto}, nil); err != nil {
			t.Fatal(err)
		}
		if prefer && (vm.got.Namespace != network.Path(id) || !vm.existed) {
			t.Errorf("auto on the VM runtime was handed %+v (namespace there: %v)", vm.got, vm.existed)
		}
		if !prefer && (plain.got.Namespace != "" || network.Exists(id)) {
			t.Errorf("auto on the plain runtime was handed %+v (namespace there: %v)", plain.got, network.Exists(id))
		}
		if err := w.deleteRuntime(ctx, id); err != nil || network.Exists(id) {
			t.Errorf("deleteRuntime: %v; namespace there: %v", err, network.Exists(id))
		}
	}
}
