package controller

import (
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestPlacementOnMeasuredFreeMemory: a worker whose reservations have room
// but whose host reports too little free memory takes no sandbox, with a
// reason that says so; a Sync that reports memory freed places it at once
// (no heartbeat wait), and a worker's report is stored with it.
func TestPlacementOnMeasuredFreeMemory(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	free := 40
	w.free = &free
	w.register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.reconcile()
	e.wantSandbox("sb1", model.StatePending, "", "no worker has the memory free to start a sandbox (64 MiB needed at start; most free: 40 MiB on worker w1")

	free = 1000
	w.sync(-1, 0)
	got, err := e.st.GetWorker(e.ctx, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if got.FreeMiB == nil || *got.FreeMiB != 1000 {
		t.Fatalf("stored free memory %v, want 1000", got.FreeMiB)
	}
	e.reconcile()
	e.wantSandbox("sb1", model.StateStarting, "w1", "")

	// A negative report is refused, not stored.
	bad := -1
	if _, err := w.client().Sync(e.ctx, "w1", workerapi.SyncRequest{Observed: []workerapi.Observed{}, FreeMiB: &bad}, 0, -1); err == nil {
		t.Fatal("a negative free_mib was accepted")
	}
}

func TestFreeChange(t *testing.T) {
	n := func(v int) *int { return &v }
	for _, c := range []struct {
		old, cur *int
		want     int
	}{
		{nil, nil, 0}, {n(100), nil, 0}, {nil, n(0), 1},
		{n(100), n(163), 0}, {n(100), n(164), 1}, {n(100), n(37), 0}, {n(100), n(36), -1},
	} {
		if got := freeChange(c.old, c.cur); got != c.want {
			t.Errorf("freeChange(%v, %v) = %d, want %d", c.old, c.cur, got, c.want)
		}
	}
}

// TestCordonedWorkerGetsNoNewSandbox: placement skips a cordoned worker
// (its syncs keep the cordon) and uses it again once uncordoned.
func TestCordonedWorkerGetsNoNewSandbox(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	if err := e.st.SetWorkerCordoned(e.ctx, "w1", true); err != nil {
		t.Fatal(err)
	}
	w.sync(-1, 0)
	e.createSandbox("sb1", 512)
	e.reconcile()
	e.wantSandbox("sb1", model.StatePending, "", "all 1 are cordoned")
	if err := e.st.SetWorkerCordoned(e.ctx, "w1", false); err != nil {
		t.Fatal(err)
	}
	e.reconcile()
	e.wantSandbox("sb1", model.StateStarting, "w1", "")
}
