package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/controller"
	"github.com/airlock/airlock/internal/model"
	airruntime "github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/store/sqlstore"
	"github.com/airlock/airlock/internal/worker"
)

// cutProxy forwards TCP to a server until cut: then it drops every
// connection and refuses new ones, as a partition would, until healed.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

// TestWorkerFencesItself: a worker cut off from its server pauses its
// running sandboxes before the server's loss grace ends; healed in time,
// it resumes them; cut off for longer, the server counts them lost, and
// the worker, back, deletes them before anything else of them runs.
func TestWorkerFencesItself(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP (-short): waits out a worker-loss grace twice (about 25 s)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	log := newLogger("error")
	st, err := sqlite.Open(ctx, filepath.Join(dir, "airlock.db"), sqlstore.WithClock(time.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const workerToken = "fence-worker-token"
	sctx, scancel := context.WithCancel(ctx)
	srv, err := newServer(sctx, st, workerToken, 0, log, time.Now, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	const grace = 8 * time.Second
	if err := srv.ctrl.SetWorkerLoss(grace, controller.OnLossMark); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sdone := make(chan struct{})
	go func() { srv.serve(sctx, ln); close(sdone) }()
	defer func() { scancel(); <-sdone }()
	if err := ensureAdminKey(ctx, srv.svc, dir, io.Discard); err != nil {
		t.Fatal(err)
	}
	c := client.New("http://"+ln.Addr().String(), readTrim(filepath.Join(dir, "admin.key")))
	proxy := newCutProxy(t, ln.Addr().String())

	drv := fake.New(log)
	w, err := worker.New(fakeWorkerConfig(t, filepath.Join(dir, "w"), "w-fence", proxy.url(), workerToken, drv, log))
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	wdone := make(chan error, 1)
	go func() { wdone <- w.Run(wctx) }()
	defer func() {
		wcancel()
		if err := <-wdone; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("worker: %v", err)
		}
	}()
	create := func() string {
		for {
			sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name}, "")
			if err == nil {
				if done, err := c.WaitOperation(ctx, op.ID); err != nil || done.State != model.OpSucceeded {
					t.Fatalf("create: %+v %v", done, err)
				}
				return sb.ID
			}
			if ctx.Err() != nil {
				t.Fatalf("create: %v", err)
			}
			time.Sleep(100 * time.Millisecond) // the worker registering
		}
	}
	status := func(id string) airruntime.Status {
		s, _ := drv.Status(ctx, id)
		return s
	}
	waitStatus := func(id string, want airruntime.Status, within time.Duration) time.Duration {
		t.Helper()
		t0 := time.Now()
		for status(id) != want {
			if time.Since(t0) > within {
				t.Fatalf("sandbox %s: runtime %s after %v, want %s", id, status(id), within, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return time.Since(t0)
	}
	id := create()

	// Cut off, then healed before the grace ends: paused, then resumed;
	// the server never counted it lost.
	proxy.setCut(true)
	took := waitStatus(id, airruntime.StatusPaused, grace)
	t.Logf("cut off: paused after %v (grace %v)", took.Round(100*time.Millisecond), grace)
	if took > grace {
		t.Fatalf("paused after %v: later than the grace %v", took, grace)
	}
	proxy.setCut(false)
	waitStatus(id, airruntime.StatusRunning, 30*time.Second)
	if sb, _ := c.GetSandbox(ctx, id); sb.State != model.StateRunning {
		t.Fatalf("after healing: %s (%s), want running", sb.State, sb.Reason)
	}

	// Cut off past the grace: lost on the server; back, the worker
	// deletes it and never resumes it.
	proxy.setCut(true)
	waitStatus(id, airruntime.StatusPaused, grace)
	for {
		sb, _ := c.GetSandbox(ctx, id)
		if sb.State == model.StateLost {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("never lost: %s", sb.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status(id) != airruntime.StatusPaused {
		t.Fatalf("while lost the runtime is %s, want paused", status(id))
	}
	proxy.setCut(false)
	waitStatus(id, airruntime.StatusGone, 30*time.Second)
}
