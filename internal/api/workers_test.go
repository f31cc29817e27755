package api_test

import (
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
)

// TestWorkersListAndCordon: operators list workers with their state,
// capacity and sandboxes and cordon them (kept across the worker's own
// upserts); nobody else sees or changes workers. Placement skipping a
// cordoned worker: scheduler and controller tests.
func TestWorkersListAndCordon(t *testing.T) {
	e := newEnv(t)
	sb, _, err := e.admin.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	e.markRunning(sb.ID, "http://127.0.0.1:1")
	stale := time.Now().UTC().Add(-time.Minute) // stale, not yet lost (5 min)
	if err := e.st.UpsertWorker(e.ctx, model.Worker{ID: "w2", Runtimes: model.NamedRuntimes("gvisor"), CapacityMiB: 1024, CapacityVCPUs: 1, LastHeartbeat: stale, CreatedAt: stale}); err != nil {
		t.Fatal(err)
	}
	ws, err := e.admin.ListWorkers(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID != "w1" || ws[0].State != "ready" || ws[0].Sandboxes[model.StateRunning] != 1 ||
		ws[0].UsedMiB != sb.Resources.MemoryMiB || ws[0].CapacityMiB != 8192 || ws[1].State != "stale" || len(ws[1].Sandboxes) != 0 {
		t.Fatalf("workers = %+v", ws)
	}

	tenant, _ := e.orgClient("tenant", true)
	if _, err := tenant.ListWorkers(e.ctx); !isStatus(t, err, 403) {
		t.Fatalf("a tenant admin lists workers: %v; want 403", err)
	}
	if _, err := tenant.CordonWorker(e.ctx, "w1", true); !isStatus(t, err, 403) {
		t.Fatalf("a tenant admin cordons: %v; want 403", err)
	}
	if _, err := e.admin.CordonWorker(e.ctx, "w-nope", true); !isStatus(t, err, 404) {
		t.Fatalf("cordon of an unknown worker: %v; want 404", err)
	}

	w, err := e.admin.CordonWorker(e.ctx, "w1", true)
	if err != nil || w.State != "cordoned" || !w.Cordoned {
		t.Fatalf("cordon: %+v %v", w, err)
	}
	// The worker's own re-registration keeps the cordon.
	e.markRunning(sb.ID, "http://127.0.0.1:1")
	if w, err := e.admin.GetWorker(e.ctx, "w1"); err != nil || w.State != "cordoned" {
		t.Fatalf("after the worker's upsert: %+v %v", w, err)
	}
	w, err = e.admin.CordonWorker(e.ctx, "w1", false)
	if err != nil || w.State != "ready" || w.Cordoned {
		t.Fatalf("uncordon: %+v %v", w, err)
	}
}
