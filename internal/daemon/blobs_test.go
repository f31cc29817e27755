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

// blobCluster is a server (SQLite) and two fake-runtime workers, w-a and
// w-b, on one blob store.
type blobCluster struct {
	c       *client.Client
	workers map[string]*runningWorker
	open    func() blob.Store
}

type runningWorker struct {
	id     string
	drv    *fake.Driver
	snaps  *snapshot.Store
	cancel context.CancelFunc
	done   chan error
}

func (rw *runningWorker) stop(t *testing.T) {
	rw.cancel()
	if err := <-rw.done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("worker %s: %v", rw.id, err)
	}
	rw.done <- nil // stopped: a second stop returns at once
}

func startBlobCluster(t *testing.T, ctx context.Context, blobURL string) *blobCluster {
	t.Helper()
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
	t.Cleanup(func() { st.Close() })
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
	t.Cleanup(func() { scancel(); <-sdone })
	if err := ensureAdminKey(ctx, srv.svc, dir, io.Discard); err != nil {
		t.Fatal(err)
	}
	c := client.New(url, readTrim(filepath.Join(dir, "admin.key")))

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
	t.Cleanup(func() {
		for _, rw := range workers {
			rw.stop(t)
		}
	})
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

	return &blobCluster{c: c, workers: workers, open: open}
}

func testWakeOnAnotherWorker(t *testing.T, blobURL string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bc := startBlobCluster(t, ctx, blobURL)
	c, workers, open := bc.c, bc.workers, bc.open
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
	workers[other].stop(t)
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

// TestDrainMovesSandboxes: draining a worker moves its running sandboxes
// to the other worker of the blob store, files intact, suspends its paused
// one, and ends with nothing running there; the time each moved sandbox
// was not running is logged.
func TestDrainMovesSandboxes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bc := startBlobCluster(t, ctx, "file://"+t.TempDir())
	c := bc.c
	if _, err := c.CordonWorker(ctx, "w-b", true); err != nil {
		t.Fatal(err)
	}
	run := func(id, script string) string {
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
	waitOp := func(what string, op model.Operation, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if done, err := c.WaitOperation(ctx, op.ID); err != nil || done.State != model.OpSucceeded {
			t.Fatalf("%s: %+v %v", what, done, err)
		}
	}
	var ids []string
	for i := range 3 {
		sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name}, "")
		waitOp("create", op, err)
		run(sb.ID, "echo file-of-"+sb.ID+" > /f")
		if i == 2 {
			op, err := c.PauseSandbox(ctx, sb.ID)
			waitOp("pause", op, err)
		}
		ids = append(ids, sb.ID)
	}
	if _, err := c.CordonWorker(ctx, "w-b", false); err != nil {
		t.Fatal(err)
	}

	// Watch the moving sandboxes: how long each is not running.
	down := map[string]time.Duration{}
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		since := map[string]time.Time{}
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for _, id := range ids[:2] {
				sb, err := c.GetSandbox(ctx, id)
				if err != nil {
					continue
				}
				switch {
				case sb.State != model.StateRunning && since[id].IsZero():
					since[id] = time.Now()
				case sb.State == model.StateRunning && !since[id].IsZero() && sb.WorkerID == "w-b":
					down[id] = time.Since(since[id])
					since[id] = time.Time{}
				}
			}
		}
	}()
	t0 := time.Now()
	w, err := c.DrainWorker(ctx, "w-a")
	if err != nil || w.State != "draining" {
		t.Fatalf("drain: %+v %v", w, err)
	}
	for {
		w, err = c.GetWorker(ctx, "w-a")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for st, k := range w.Sandboxes {
			if st != model.StateSuspended && !st.Terminal() {
				n += k
			}
		}
		if n == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the drain never ended: %v", w.Sandboxes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(t0)
	for _, id := range ids[:2] {
		for ctx.Err() == nil {
			if sb, _ := c.GetSandbox(ctx, id); sb.State == model.StateRunning && sb.WorkerID == "w-b" && sb.MoveFrom == "" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(20 * time.Millisecond)
	close(stopWatch)
	<-watched
	t.Logf("drained 2 running sandboxes and 1 paused in %v; not running per move: %v", took.Round(time.Millisecond), down)
	for _, id := range ids[:2] {
		sb, _ := c.GetSandbox(ctx, id)
		if sb.State != model.StateRunning || sb.WorkerID != "w-b" {
			t.Fatalf("moved sandbox %s: %s on %s, want running on w-b", id, sb.State, sb.WorkerID)
		}
		if out := run(id, "cat /f"); out != "file-of-"+id+"\n" {
			t.Fatalf("file of %s after the move: %q", id, out)
		}
		if _, ok := down[id]; !ok {
			t.Errorf("sandbox %s was never seen down and back: %v", id, down)
		}
	}
	if sb, _ := c.GetSandbox(ctx, ids[2]); sb.State != model.StateSuspended || !sb.SnapshotShared {
		t.Fatalf("the paused sandbox after the drain: %s (shared %v), want suspended in the blob store", sb.State, sb.SnapshotShared)
	}
	// It wakes on the other worker when asked.
	op, err := c.WakeSandbox(ctx, ids[2])
	waitOp("wake the drained paused sandbox", op, err)
	if sb, _ := c.GetSandbox(ctx, ids[2]); sb.WorkerID != "w-b" {
		t.Fatalf("woken on %s, want w-b", sb.WorkerID)
	}
	if out := run(ids[2], "cat /f"); out != "file-of-"+ids[2]+"\n" {
		t.Fatalf("file of the paused sandbox after the move: %q", out)
	}
}
