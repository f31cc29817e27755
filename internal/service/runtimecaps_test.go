package service_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/snapshot"
)

// TestImportFollowsRuntimeInfo: which archives import is decided by what
// the registered workers declare their runtimes can do, not by a list of
// names: qemu (pause, suspend, no leave-running checkpoints) is refused as
// before, a runtime a worker declares able to checkpoint running sandboxes
// and fork is accepted, and the same name is refused once its worker
// declares less. Placement then needs a worker whose runtime can fork.
func TestImportFollowsRuntimeInfo(t *testing.T) {
	s := signedService(t, model.FeatureSnapshots)
	ctx := t.Context()
	archive := func(rt string) []byte {
		return checkpointArchive(t, goodMeta, func(m *snapshot.Manifest) { m.Runtime = rt }, exportKey)
	}
	imp := func(rt string) error {
		_, _, err := s.ImportSandbox(ctx, operator, service.CreateParams{}, bytes.NewReader(archive(rt)), "")
		return err
	}
	refused := func(err error) bool {
		return errors.Is(err, model.ErrUnprocessable) && strings.Contains(err.Error(), "imports work for the")
	}
	// No worker: the runtimes of old keep what they could do.
	if err := imp("gvisor"); !accepted(err) {
		t.Fatalf("gvisor archive with no worker = %v, want accepted", err)
	}
	if err := imp("qemu"); !refused(err) || !strings.Contains(err.Error(), "for the gvisor runtime only for now") {
		t.Fatalf("qemu archive = %v, want the 422 naming gvisor", err)
	}
	if err := imp("fake"); !refused(err) {
		t.Fatalf("archive of a runtime nobody offers = %v, want 422", err)
	}

	all := model.RuntimeCaps{Pause: true, Snapshot: true, LeaveRunning: true, Fork: true}
	w := model.Worker{ID: "w-fake", DataPlaneURL: "http://127.0.0.1:1", InternalURL: "http://127.0.0.1:1",
		Runtimes: []model.RuntimeInfo{{Name: "gvisor", Caps: all}, {Name: "fake", Caps: all}}, Templates: []string{tplDigest},
		CapacityMiB: 1 << 20, CapacityVCPUs: 1 << 10, LastHeartbeat: time.Now(), CreatedAt: time.Now()}
	if err := s.TestStore().UpsertWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	err := imp("fake")
	if refused(err) {
		t.Fatalf("archive of a runtime a worker declares able = %v, want it past the runtime check", err)
	}
	t.Logf("fake archive with a capable worker: %v", err)
	if err := imp("qemu"); !refused(err) || !strings.Contains(err.Error(), "for the fake, gvisor runtime only for now") {
		t.Fatalf("qemu archive with a fake worker = %v, want the 422 naming fake, gvisor", err)
	}

	w.Runtimes = []model.RuntimeInfo{{Name: "gvisor", Caps: all}, {Name: "fake", Caps: model.RuntimeCaps{Pause: true, Snapshot: true}}}
	if err := s.TestStore().UpsertWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := imp("fake"); !refused(err) {
		t.Fatalf("archive of a runtime whose worker declares no checkpoints = %v, want 422", err)
	}
}
