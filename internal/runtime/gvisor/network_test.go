package gvisor_test

import (
	"context"
	"errors"
	"testing"

	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/runtime/runtimetest"
)

// TestNetworkFromSpec: gvisor takes its network from the spec. The one
// internal/network hands it (the runtime declares no network device) is
// the zero Network, and it runs loopback only (the conformance suite's
// NetworkLoopbackOnly); a namespace to join is refused, naming the power,
// and leaves nothing.
func TestNetworkFromSpec(t *testing.T) {
	d, rootfs, _ := fixture(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	n, err := network.Setup(ctx, id, gvisor.Info.Caps)
	if err != nil || n.Namespace != "" || len(n.Interfaces) != 0 {
		t.Fatalf("network for gvisor = %+v, %v; want the zero Network", n, err)
	}
	_, err = d.Start(ctx, runtime.Spec{ID: id, RootFS: rootfs, VCPUs: 1, MemoryMiB: 128,
		Network: runtime.Network{Namespace: network.Path(id), Interfaces: []runtime.Interface{{Name: network.TapName}}}})
	if !errors.Is(err, runtime.ErrUnsupported) {
		t.Fatalf("Start with a namespace to join = %v; want ErrUnsupported", err)
	}
	if st, err := d.Status(ctx, id); err != nil || st != runtime.StatusGone {
		t.Errorf("Status after the refused Start = %q, %v; want gone", st, err)
	}
}
