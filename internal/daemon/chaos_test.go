package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/blob"
	"github.com/airlock/airlock/internal/model"
	airruntime "github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/store/pgtest"
	"github.com/airlock/airlock/internal/store/postgres"
	"github.com/airlock/airlock/internal/worker"
)

// TestChaosReplicasAndWorkers: 3 server replicas on one real PostgreSQL
// and 3 workers (the fake runtime, whose sandboxes outlive their worker
// process as runsc's do) on one blob store. Four clients run lifecycle
// operations and commands (create, exec, suspend, wake, delete) through
// random live replicas while a chaos loop crashes a random replica (its
// store connection cut before it stops, so it never releases its lease)
// or stops a random worker, and brings it back. At the end every operation
// is done (a failed one with its reason), no sandbox is running on two
// workers (the runtimes' own lists), and every sandbox still there holds
// every line a command wrote into it and reported.
func TestChaosReplicasAndWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP (-short): chaos over PostgreSQL takes about a minute (lease takeovers of 15 s)")
	}
	dbURL := pgtest.URL(t)
	log := newLogger("error")
	const workerToken = "chaos-worker-token"
	dir := t.TempDir()
	blobURL := "file://" + filepath.Join(dir, "blobs")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	type replica struct {
		name   string
		addr   string
		mu     sync.Mutex
		up     bool
		cancel context.CancelFunc
		done   chan struct{}
	}
	replicas := make([]*replica, 3)
	var key string
	startReplica := func(r *replica) {
		rctx, rcancel := context.WithCancel(context.Background())
		st, err := postgres.Open(rctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", r.addr)
		for i := 0; err != nil && i < 50; i++ { // the port of a crashed replica may linger
			time.Sleep(100 * time.Millisecond)
			ln, err = net.Listen("tcp", r.addr)
		}
		if err != nil {
			t.Fatal(err)
		}
		r.addr = ln.Addr().String()
		srv, err := newServer(rctx, st, workerToken, 0, log, time.Now, nil, r.name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := blob.Open(rctx, blobURL)
		if err != nil {
			t.Fatal(err)
		}
		srv.ctrl.SetBlobStore(b)
		if key == "" {
			if err := ensureAdminKey(rctx, srv.svc, dir, io.Discard); err != nil {
				t.Fatal(err)
			}
			key = readTrim(filepath.Join(dir, "admin.key"))
		}
		done := make(chan struct{})
		go func() { srv.serve(rctx, ln); st.Close(); close(done) }()
		r.mu.Lock()
		r.up, r.cancel, r.done = true, func() { st.Close(); rcancel() }, done
		r.mu.Unlock()
	}
	crashReplica := func(r *replica) {
		r.mu.Lock()
		stop, done := r.cancel, r.done
		r.up = false
		r.mu.Unlock()
		stop() // the store first: the lease is not released, as in a crash
		<-done
	}
	for i := range replicas {
		replicas[i] = &replica{name: fmt.Sprintf("replica-%d", i), addr: "127.0.0.1:0"}
		startReplica(replicas[i])
	}
	var urls []string
	for _, r := range replicas {
		urls = append(urls, "http://"+r.addr)
	}

	type wrk struct {
		id     string
		drv    *fake.Driver
		mu     sync.Mutex
		up     bool
		cancel context.CancelFunc
		done   chan error
	}
	workers := make([]*wrk, 3)
	startWorker := func(w *wrk) {
		cfg := fakeWorkerConfig(t, filepath.Join(dir, w.id), w.id, strings.Join(urls, ","), workerToken, w.drv, log)
		b, err := blob.Open(ctx, blobURL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Blobs = b
		wk, err := worker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- wk.Run(wctx) }()
		w.mu.Lock()
		w.up, w.cancel, w.done = true, wcancel, done
		w.mu.Unlock()
	}
	stopWorker := func(w *wrk) {
		w.mu.Lock()
		stop, done := w.cancel, w.done
		w.up = false
		w.mu.Unlock()
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("worker %s: %v", w.id, err)
		}
	}
	for i := range workers {
		workers[i] = &wrk{id: fmt.Sprintf("w-chaos-%d", i), drv: fake.New(log)}
		startWorker(workers[i])
	}
	defer func() {
		for _, w := range workers {
			if w.up {
				stopWorker(w)
			}
		}
		for _, r := range replicas {
			if r.up {
				crashReplica(r)
			}
		}
	}()

	// api calls f with a client of a random live replica, trying the others
	// when one cannot be reached.
	api := func(f func(c *client.Client) error) error {
		var err error
		for range 20 {
			r := replicas[rand.IntN(len(replicas))]
			r.mu.Lock()
			up, addr := r.up, r.addr
			r.mu.Unlock()
			if !up {
				continue
			}
			err = f(client.New("http://"+addr, key))
			var ne net.Error
			if err == nil || !(errors.As(err, &ne) || strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "EOF")) {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
		return err
	}
	for { // every worker registered
		var n int
		api(func(c *client.Client) error {
			ws, err := c.ListWorkers(ctx)
			n = 0
			for _, w := range ws {
				if w.State == "ready" {
					n++
				}
			}
			return err
		})
		if n == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the workers never registered")
		}
		time.Sleep(100 * time.Millisecond)
	}

	var (
		mu      sync.Mutex
		ops     []string                // every operation id a request returned
		lines   = map[string][]string{} // sandbox → lines a command wrote and reported
		deleted = map[string]bool{}
		nOps    int
	)
	record := func(op model.Operation, err error) {
		if err == nil && op.ID != "" {
			mu.Lock()
			ops = append(ops, op.ID)
			nOps++
			mu.Unlock()
		}
	}
	exec := func(c *client.Client, id, script string) (string, error) {
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		cmd, err := c.CreateCommand(cctx, id, client.CreateCommandRequest{Argv: []string{"/bin/sh", "-c", script}})
		if err != nil {
			return "", err
		}
		var out strings.Builder
		exit, err := client.RunCommand(cctx, cmd.AttachURL, cmd.Token, nil, &out, io.Discard)
		if err == nil && exit.ExitCode != 0 {
			err = fmt.Errorf("exit %d", exit.ExitCode)
		}
		return out.String(), err
	}

	chaosDone := make(chan struct{})
	var kills []string
	go func() { // chaos
		defer close(chaosDone)
		for i := 0; ctx.Err() == nil; i++ {
			mu.Lock()
			n := nOps
			mu.Unlock()
			if n >= 100 {
				return
			}
			time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Millisecond)
			if rand.IntN(2) == 0 {
				r := replicas[rand.IntN(3)]
				kills = append(kills, r.name)
				crashReplica(r)
				time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
				startReplica(r)
			} else {
				w := workers[rand.IntN(3)]
				kills = append(kills, w.id)
				stopWorker(w)
				time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
				startWorker(w)
			}
		}
	}()

	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []string
			for step := 0; ; step++ {
				time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond) // the chaos keeps up
				mu.Lock()
				n := nOps
				mu.Unlock()
				if n >= 100 || ctx.Err() != nil {
					return
				}
				switch k := rand.IntN(10); {
				case len(mine) < 2 || k == 0 && len(mine) < 3: // create (at most 3 each: 12 fit the workers' 12 vCPUs)
					var sb model.Sandbox
					var op model.Operation
					err := api(func(c *client.Client) (err error) {
						sb, op, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name}, "")
						return err
					})
					record(op, err)
					if err == nil {
						mine = append(mine, sb.ID)
					}
				case k <= 4: // exec: append a line, and remember it once reported
					id := mine[rand.IntN(len(mine))]
					line := fmt.Sprintf("g%d-s%d", g, step)
					err := api(func(c *client.Client) error {
						_, err := exec(c, id, "echo "+line+" >> /log")
						return err
					})
					if err == nil {
						mu.Lock()
						lines[id] = append(lines[id], line)
						mu.Unlock()
					}
				case k <= 6: // suspend
					id := mine[rand.IntN(len(mine))]
					var op model.Operation
					err := api(func(c *client.Client) (err error) { op, err = c.SuspendSandbox(ctx, id); return err })
					record(op, err)
				case k <= 8: // wake
					id := mine[rand.IntN(len(mine))]
					var op model.Operation
					err := api(func(c *client.Client) (err error) { op, err = c.WakeSandbox(ctx, id); return err })
					record(op, err)
				default: // delete
					i := rand.IntN(len(mine))
					id := mine[i]
					var op model.Operation
					err := api(func(c *client.Client) (err error) { op, err = c.DeleteSandbox(ctx, id); return err })
					record(op, err)
					if err == nil {
						mine = append(mine[:i], mine[i+1:]...)
						mu.Lock()
						deleted[id] = true
						mu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	<-chaosDone
	t.Logf("%d operations requested; crashed or stopped: %v", len(ops), kills)

	// Every operation ends, a failed one with its reason.
	states := map[model.OperationState]int{}
	endBy := time.Now().Add(2 * time.Minute) // deadlines are 30 min: this is the reconcilers' work
	for _, id := range ops {
		var op model.Operation
		for {
			err := api(func(c *client.Client) (err error) {
				wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
				defer wcancel()
				op, err = c.WaitOperation(wctx, id)
				var oe *client.OperationError
				if errors.As(err, &oe) {
					return nil // done, not succeeded
				}
				return err
			})
			if err == nil && op.State.Done() {
				break
			}
			if time.Now().After(endBy) {
				var sb model.Sandbox
				api(func(c *client.Client) (err error) {
					op, _ = c.GetOperation(ctx, id)
					sb, err = c.GetSandbox(ctx, op.SandboxID)
					return err
				})
				t.Fatalf("operation %s never ended: %+v; its sandbox: state %s desired %s worker %s reason %q shared %v move %q", id, op, sb.State, sb.DesiredState, sb.WorkerID, sb.Reason, sb.SnapshotShared, sb.MoveFrom)
			}
		}
		states[op.State]++
		if op.State != model.OpSucceeded && op.Reason == "" {
			t.Errorf("operation %s (%s) ended %s without a reason", id, op.Kind, op.State)
		}
	}
	t.Logf("operations by outcome: %v", states)

	// No sandbox runs on two workers; each live one holds what was written.
	var page client.SandboxPage
	if err := api(func(c *client.Client) (err error) {
		page, err = c.ListSandboxes(ctx, client.SandboxFilter{Limit: 1000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, sb := range page.Sandboxes {
		if sb.State.Terminal() || sb.DesiredState == model.StateDeleted {
			continue
		}
		var on []string
		for _, w := range workers {
			if s, _ := w.drv.Status(ctx, sb.ID); s == airruntime.StatusRunning {
				on = append(on, w.id)
			}
		}
		if len(on) > 1 {
			t.Errorf("sandbox %s runs on %v at once", sb.ID, on)
		}
		if want := lines[sb.ID]; len(want) > 0 {
			var out string
			var err error
			for range 50 {
				if err = api(func(c *client.Client) (e error) { out, e = exec(c, sb.ID, "cat /log"); return e }); err == nil {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if err != nil {
				t.Errorf("sandbox %s (%s): read /log: %v", sb.ID, sb.State, err)
				continue
			}
			got := strings.Fields(out)
			for _, l := range want {
				if !containsLine(got, l) {
					t.Errorf("sandbox %s: line %s, reported written, is missing from /log (%d lines there)", sb.ID, l, len(got))
				}
			}
		}
	}
}

func containsLine(lines []string, l string) bool {
	for _, x := range lines {
		if x == l {
			return true
		}
	}
	return false
}
