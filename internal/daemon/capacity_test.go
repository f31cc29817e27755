package daemon

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/worker"
)

// TestMeasuredMemoryOnFakeStack runs the capacity model through the whole
// stack: a worker whose host reports 10 MiB free leaves a create pending
// with the reason, and placing it needs nothing but the worker's next
// report of memory free (the create then succeeds). The controller's
// reconcile rounds are on /metrics.
func TestMeasuredMemoryOnFakeStack(t *testing.T) {
	var free atomic.Int64
	free.Store(10)
	s := startFakeStack(t, func(c *worker.Config) {
		c.FreeMiB = func() (int, bool) { return int(free.Load()), true }
	})
	m := newMetrics()
	m.watchServer(s.srv)
	addr, err := serveMetrics(t.Context(), "127.0.0.1:0", m, newLogger("error"))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, op, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name, Resources: model.Resources{VCPUs: 1, MemoryMiB: 256}}, "")
	if err != nil {
		t.Fatal(err)
	}
	const reason = "no worker has the memory free to start a sandbox (64 MiB needed at start; most free: 10 MiB on worker w-fake"
	for {
		got, err := s.c.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == model.StatePending && strings.Contains(got.Reason, reason) {
			break
		}
		if got.State != model.StatePending || ctx.Err() != nil {
			t.Fatalf("sandbox %s (%s), want pending with %q", got.State, got.Reason, reason)
		}
		time.Sleep(20 * time.Millisecond)
	}

	free.Store(4096) // the worker syncs at once (its status round sees the change)
	if op, err = s.c.WaitOperation(ctx, op.ID); err != nil || op.State != model.OpSucceeded {
		t.Fatalf("create after memory came free: %+v %v", op, err)
	}

	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{"airlock_controller_reconcile_seconds_count ", "airlock_controller_reconcile_last_seconds ", "airlock_controller_reconcile_sandboxes 1"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
