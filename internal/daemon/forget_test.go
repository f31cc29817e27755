package daemon

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock/airlock/internal/controller"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/workerapi"
)

// TestForgetWorker: a worker that lost its worker.secret cannot register
// its id again with the join token alone; after the operator's
// --forget-worker it can, and gets a new secret.
func TestForgetWorker(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c := controller.New(controller.Config{Store: st, Events: events.New(st), WorkerToken: "join"})
	req := workerapi.RegisterRequest{ID: "w-lost", DataPlaneURL: "http://127.0.0.1:7071"}
	first, err := c.Register(ctx, req)
	if err != nil || first.WorkerSecret == "" {
		t.Fatalf("first registration: %+v %v", first, err)
	}
	if _, err := c.Register(ctx, req); !errors.Is(err, model.ErrForbidden) {
		t.Fatalf("registration without the lost secret: %v, want forbidden", err)
	}
	var out bytes.Buffer
	if err := forgetWorkers(ctx, st, "w-lost, w-unknown", &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "dropped the credential of worker w-lost") || !strings.Contains(out.String(), "w-unknown: that worker has no credential") {
		t.Errorf("forgetWorkers said %q", out.String())
	}
	again, err := c.Register(ctx, req)
	if err != nil || again.WorkerSecret == "" || again.WorkerSecret == first.WorkerSecret {
		t.Fatalf("registration after --forget-worker: %+v %v; want a new secret", again, err)
	}
}
