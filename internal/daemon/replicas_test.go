package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/store/pgtest"
	"github.com/airlock/airlock/internal/store/postgres"
	"github.com/airlock/airlock/internal/worker"
)

// TestReplicasOnPostgres: two server replicas on one (real) PostgreSQL
// and a worker that names both. Either replica serves the API; one
// reconciles; when that one stops, the other takes over and the worker
// fails over to it, and sandboxes keep being created and run.
func TestReplicasOnPostgres(t *testing.T) {
	dbURL := pgtest.URL(t)
	log := newLogger("error")
	const workerToken = "replicas-worker-token"
	type replica struct {
		srv    *server
		url    string
		cancel context.CancelFunc
		done   chan struct{} // closed when the replica has stopped
	}
	start := func(name string) *replica {
		ctx, cancel := context.WithCancel(context.Background())
		st, err := postgres.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv, err := newServer(ctx, st, workerToken, 0, log, time.Now, nil, name)
		if err != nil {
			t.Fatal(err)
		}
		r := &replica{srv: srv, url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan struct{})}
		go func() {
			if err := srv.serve(ctx, ln); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("replica %s: %v", name, err)
			}
			st.Close()
			close(r.done)
		}()
		t.Cleanup(func() { cancel(); <-r.done })
		return r
	}
	a, b := start("replica-a"), start("replica-b")
	dir := t.TempDir()
	if err := ensureAdminKey(context.Background(), a.srv.svc, dir, io.Discard); err != nil {
		t.Fatal(err)
	}
	key := readTrim(filepath.Join(dir, "admin.key"))

	drv := fake.New(log)
	wcfg := fakeWorkerConfig(t, filepath.Join(dir, "worker"), "w-replicas", a.url+","+b.url, workerToken, drv, log)
	w, err := worker.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan error, 1)
	go func() { wdone <- w.Run(wctx) }()
	t.Cleanup(func() { wcancel(); <-wdone })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	create := func(c *client.Client, what string) model.Sandbox {
		t.Helper()
		for {
			sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name}, "")
			if err != nil {
				t.Fatalf("%s: create: %v", what, err)
			}
			done, err := c.WaitOperation(ctx, op.ID)
			if err != nil || done.State != model.OpSucceeded {
				t.Fatalf("%s: create operation %+v %v", what, done, err)
			}
			return sb
		}
	}
	ca, cb := client.New(a.url, key), client.New(b.url, key)
	for { // the worker registers (with its template) through one of them
		ws, err := cb.ListWorkers(ctx)
		if err == nil && len(ws) == 1 && ws[0].State == "ready" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the worker never registered: %+v %v", ws, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	sa := create(ca, "through replica a")
	sb := create(cb, "through replica b")
	// Each replica sees what the other created.
	if got, err := cb.GetSandbox(ctx, sa.ID); err != nil || got.State != model.StateRunning {
		t.Fatalf("replica b reads %s: %+v %v", sa.ID, got, err)
	}
	leaderA, _ := a.srv.ctrl.Leading()
	leaderB, _ := b.srv.ctrl.Leading()
	if leaderA == leaderB {
		t.Fatalf("leading: a=%v b=%v; want exactly one", leaderA, leaderB)
	}
	// Stop the leader; the other must reconcile, and the worker reach it.
	leader, follower, fc := a, b, cb
	if leaderB {
		leader, follower, fc = b, a, ca
	}
	leader.cancel()
	<-leader.done
	t0 := time.Now()
	sc := create(fc, "after the leader stopped")
	t.Logf("a create after the leader stopped took %v", time.Since(t0))
	if l, _ := follower.srv.ctrl.Leading(); !l {
		t.Fatal("the remaining replica does not lead")
	}
	op, err := fc.DeleteSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done, err := fc.WaitOperation(ctx, op.ID); err != nil || done.State != model.OpSucceeded {
		t.Fatalf("delete through the remaining replica: %+v %v", done, err)
	}
	for _, id := range []string{sa.ID, sc.ID} {
		if got, err := fc.GetSandbox(ctx, id); err != nil || got.State != model.StateRunning {
			t.Fatalf("%s after the takeover: %+v %v", id, got, err)
		}
	}
}
