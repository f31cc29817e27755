package qemu_test

import (
	"context"
	"errors"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/qemu"
)

// netDriver is the qemu driver as the worker runs it: internal/network
// makes each sandbox's network before Start and Restore and releases it
// after Delete (and after a failed Start or Restore). Every other method is
// the driver's own.
type netDriver struct {
	*qemu.Driver
	cfg network.Config // the worker's network.Config (zero: isolated taps)
}

func (d *netDriver) Start(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	n, err := network.Setup(ctx, spec.ID, qemu.Info.Caps, d.cfg)
	if err != nil {
		return nil, err
	}
	spec.Network = n
	sb, err := d.Driver.Start(ctx, spec)
	if err != nil && !errors.Is(err, model.ErrConflict) {
		err = errors.Join(err, network.Release(context.WithoutCancel(ctx), spec.ID))
	}
	return sb, err
}

func (d *netDriver) Restore(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	n, err := network.Setup(ctx, spec.ID, qemu.Info.Caps, d.cfg)
	if err != nil {
		return nil, err
	}
	spec.Network = n
	sb, err := d.Driver.Restore(ctx, spec, dir)
	if err != nil && !errors.Is(err, model.ErrConflict) {
		err = errors.Join(err, network.Release(context.WithoutCancel(ctx), spec.ID))
	}
	return sb, err
}

func (d *netDriver) Delete(ctx context.Context, id string) error {
	return errors.Join(d.Driver.Delete(ctx, id), network.Release(ctx, id))
}

// TestNoNetworkRefused: the driver makes no network of its own; a spec
// without one is refused before anything is created.
func TestNoNetworkRefused(t *testing.T) {
	f := fixture(t, qemu.AccelTCG)
	id := "sb-nonetwork"
	for name, n := range map[string]runtime.Network{
		"none":        {},
		"no tap":      {Namespace: network.Path(id)},
		"relative ns": {Namespace: "netns/x", Interfaces: []runtime.Interface{{Name: "tap0"}}},
	} {
		_, err := f.d.Driver.Start(context.Background(), runtime.Spec{ID: id, RootFS: f.rootfs, Network: n})
		if !errors.Is(err, model.ErrInvalid) {
			t.Errorf("%s: Start = %v; want ErrInvalid", name, err)
		}
		if ids, _ := f.d.List(context.Background()); len(ids) != 0 {
			t.Errorf("%s: a refused Start left %v", name, ids)
		}
	}
}
