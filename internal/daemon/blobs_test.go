package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/blob"
	"github.com/airlock/airlock/internal/blob/blobtest"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/store/sqlstore"
	"github.com/airlock/airlock/internal/worker"
)

// TestWakeOnAnotherWorker: two workers on one blob store (a directory, and
// the real S3-compatible server). A sandbox suspended on one wakes on the
// other when its own is cordoned, and again when its own has stopped
// (worker loss), with its files; each worker pulls the snapshot from the
// store, none is reported running twice.
func TestWakeOnAnotherWorker(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"dir": func(t *testing.T) string { return "file://" + t.TempDir() },
		"s3":  func(t *testing.T) string { return blobtest.S3URL(t) },
	} {
		t.Run(name, func(t *testing.T) { testWakeOnAnotherWorker(t, url(t)) })
	}
}

func testWakeOnAnotherWorker(t *testing.T, blobURL string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	open := func() blob.Store {
		b, err := blob.Open(ctx, blobURL)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dir := t.TempDir()
	log := newLogger("error")
	st, err := sqlite.Open(ctx, filepath.Join(dir, "airlock.db"), sqlstore.WithClock(time.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const workerToken = "blob-worker-token"
	sctx, scancel := context.WithCancel(ctx)
	srv, err := newServer(sctx, st, workerToken, 0, log, time.Now, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	srv.ctrl.SetBlobStore(open())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	sdone := make(chan struct{})
	go func() { srv.serve(sctx, ln); close(sdone) }()
	defer func() { scancel(); <-sdone }()
	if err := ensureAdminKey(ctx, srv.svc, dir, io.Discard); err != nil {
		t.Fatal(err)
	}
	c := client.New(url, readTrim(filepath.Join(dir, "admin.key")))

	type runningWorker struct {
		id     string
		drv    *fake.Driver
		snaps  *snapshot.Store
		cancel context.CancelFunc
		done   chan error
	}
	workers := map[string]*runningWorker{}
	for _, id := range []string{"w-a", "w-b"} {
		drv := fake.New(log)
		cfg := fakeWorkerConfig(t, filepath.Join(dir, id), id, url, workerToken, drv, log)
		cfg.Blobs = open()
		w, err := worker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		rw := &runningWorker{id: id, drv: drv, snaps: cfg.Snapshots, cancel: wcancel, done: make(chan error, 1)}
		go func() { rw.done <- w.Run(wctx) }()
		workers[id] = rw
	}
	stop := func(rw *runningWorker) {
		rw.cancel()
		if err := <-rw.done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("worker %s: %v", rw.id, err)
		}
		rw.done <- nil // stopped: a second stop returns at once
	}
	defer func() {
		for _, rw := range workers {
			stop(rw)
		}
	}()
	for {
		ws, err := c.ListWorkers(ctx)
		ready := 0
		for _, w := range ws {
			if w.State == "ready" {
				ready++
			}
		}
		if err == nil && ready == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the workers never registered: %+v %v", ws, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	t0 := time.Now()
	wait := func(what string, op model.Operation, err error) {
		t.Helper()
		defer func() { t.Logf("%v: %s done", time.Since(t0).Round(time.Millisecond), what) }()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if done, err := c.WaitOperation(ctx, op.ID); err != nil || done.State != model.OpSucceeded {
			t.Fatalf("%s: %+v %v", what, done, err)
		}
	}
	sh := func(id, script string) string {
		t.Helper()
		cmd, err := c.CreateCommand(ctx, id, client.CreateCommandRequest{Argv: []string{"/bin/sh", "-c", script}})
		if err != nil {
			t.Fatalf("command %q: %v", script, err)
		}
		var out strings.Builder
		if _, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, &out, io.Discard); err != nil {
			t.Fatalf("run %q: %v", script, err)
		}
		return out.String()
	}
	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name}, "")
	wait("create", op, err)
	sh(sb.ID, "echo before-the-move > /note")
	got, _ := c.GetSandbox(ctx, sb.ID)
	home := got.WorkerID

	// Suspend: the snapshot goes to the blob store before the suspend is
	// acknowledged.
	op, err = c.SuspendSandbox(ctx, sb.ID)
	wait("suspend", op, err)
	got, _ = c.GetSandbox(ctx, sb.ID)
	if !got.SnapshotShared {
		t.Fatalf("suspended sandbox %+v: snapshot not shared", got)
	}
	if ok, err := snapshot.InBlobStore(ctx, open(), sb.ID, got.SnapshotID); !ok || err != nil {
		t.Fatalf("snapshot %s not in the blob store: %v", got.SnapshotID, err)
	}

	// Its worker cordoned: it wakes on the other, from the blob store.
	if _, err := c.CordonWorker(ctx, home, true); err != nil {
		t.Fatal(err)
	}
	op, err = c.WakeSandbox(ctx, sb.ID)
	wait("wake with its worker cordoned", op, err)
	got, _ = c.GetSandbox(ctx, sb.ID)
	other := "w-a"
	if home == "w-a" {
		other = "w-b"
	}
	if got.WorkerID != other || got.State != model.StateRunning {
		t.Fatalf("after the wake: on %s, %s; want running on %s", got.WorkerID, got.State, other)
	}
	if out := sh(sb.ID, "cat /note"); out != "before-the-move\n" {
		t.Fatalf("file after the move: %q", out)
	}
	// Running on one worker only: the old one let go of it.
	deadline := time.Now().Add(30 * time.Second)
	for slices.Contains(must(workers[home].drv.List(ctx)), sb.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still exists on its old worker %s", sb.ID, home)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if testing.Short() {
		t.Log("-short: not waiting out a heartbeat for the worker-loss half")
		return
	}
	// Suspend again on the new worker, then lose that worker: the wake
	// goes back to the first (uncordoned) worker.
	sh(sb.ID, "echo after-the-move >> /note")
	op, err = c.SuspendSandbox(ctx, sb.ID)
	wait("suspend on the new worker", op, err)
	if _, err := c.CordonWorker(ctx, home, false); err != nil {
		t.Fatal(err)
	}
	stop(workers[other])
	op, err = c.WakeSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Its worker's heartbeat has to go stale first (15 s).
	if done, err := c.WaitOperation(ctx, op.ID); err != nil || done.State != model.OpSucceeded {
		t.Fatalf("wake after its worker stopped: %+v %v", done, err)
	}
	got, _ = c.GetSandbox(ctx, sb.ID)
	if got.WorkerID != home || got.State != model.StateRunning {
		t.Fatalf("after the wake: on %s, %s; want running on %s", got.WorkerID, got.State, home)
	}
	if out := sh(sb.ID, "cat /note"); out != "before-the-move\nafter-the-move\n" {
		t.Fatalf("file after the second move: %q", out)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
