package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/testenv"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
	"github.com/airlock/airlock/internal/workerapi/workerapitest"
)

// ---- the server side of the worker API ----

// fakeServer is workerapitest's in-memory server (the real protocol
// through workerapi's handler) under the names these tests use: the test
// sets the assignments and watches what the worker observes.
type fakeServer struct {
	*workerapitest.Server
	t testing.TB
}

func newFakeServer(t testing.TB) *fakeServer {
	return &fakeServer{Server: workerapitest.New(t), t: t}
}

const testWorkerToken = workerapitest.JoinToken

// assign sets the desired state of one sandbox.
func (f *fakeServer) assign(id, digest string, desired model.SandboxState) {
	f.Assign(id, digest, desired)
}

// wakeCount returns how many wake requests were accepted.
func (f *fakeServer) wakeCount() int { return f.Wakes() }

// waitFor waits until cond holds for what the worker reported of id (its
// last observation and the history of its states).
func (f *fakeServer) waitFor(ctx context.Context, id string, cond func(workerapi.Observed, []model.SandboxState) bool) workerapi.Observed {
	f.t.Helper()
	return f.WaitFor(ctx, id, cond)
}

// setNoAutoWake opts sandbox id out of auto-wake (or back in).
func (f *fakeServer) setNoAutoWake(id string, v bool) { f.SetNoAutoWake(id, v) }

// waitObserved waits until the worker reported sandbox id in state st.
func (f *fakeServer) waitObserved(ctx context.Context, id string, st model.SandboxState) workerapi.Observed {
	f.t.Helper()
	return f.WaitObserved(ctx, id, st)
}

// waitRegistered waits until the worker registered n times and synced
// after that (so it holds the signing key and has adopted its sandboxes).
func (f *fakeServer) waitRegistered(ctx context.Context, n int) {
	f.t.Helper()
	f.WaitRegistered(ctx, n)
}

// sign returns a data-plane token.
func (f *fakeServer) sign(t testing.TB, c token.Claims) string {
	t.Helper()
	return f.Sign(c)
}

// ---- a host driver around the real airlock-agent ----

// hostDriver runs the real airlock-agent as a host subprocess per sandbox;
// the agent dials a unix socket the driver listens on. It is a test harness
// for the data plane, not an isolation backend.
type hostDriver struct {
	agentBin string
	dir      string

	mu    sync.Mutex
	boxes map[string]*hostBox
}

type hostBox struct {
	id    string
	ln    net.Listener
	cmd   *exec.Cmd
	conns chan net.Conn
	done  chan struct{} // closed when the agent process exited
}

var _ runtime.Driver = (*hostDriver)(nil)

func (d *hostDriver) Name() string { return "host-test" }

func (d *hostDriver) Start(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	dir := filepath.Join(d.dir, spec.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	cmd := exec.Command(d.agentBin, "-channel", sock)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		ln.Close()
		return nil, fmt.Errorf("start agent: %w", err)
	}
	b := &hostBox{id: spec.ID, ln: ln, cmd: cmd, conns: make(chan net.Conn), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(b.done) }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case b.conns <- c:
			case <-b.done:
				c.Close()
				return
			}
		}
	}()
	d.mu.Lock()
	d.boxes[spec.ID] = b
	d.mu.Unlock()
	return &hostHandle{b: b}, nil
}

func (d *hostDriver) Adopt(ctx context.Context, id string) (runtime.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.boxes[id]
	if b == nil {
		return nil, runtime.ErrNotFound
	}
	return &hostHandle{b: b}, nil
}

func (d *hostDriver) Delete(ctx context.Context, id string) error {
	d.mu.Lock()
	b := d.boxes[id]
	delete(d.boxes, id)
	d.mu.Unlock()
	if b == nil {
		return nil
	}
	// Kill the agent and everything it started (same process group).
	_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	<-b.done
	b.ln.Close()
	return os.RemoveAll(filepath.Join(d.dir, id))
}

func (d *hostDriver) List(ctx context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []string
	for id := range d.boxes {
		ids = append(ids, id)
	}
	return ids, nil
}

func (d *hostDriver) Status(ctx context.Context, id string) (runtime.Status, error) {
	d.mu.Lock()
	b := d.boxes[id]
	d.mu.Unlock()
	if b == nil {
		return runtime.StatusGone, nil
	}
	select {
	case <-b.done:
		return runtime.StatusStopped, nil
	default:
		return runtime.StatusRunning, nil
	}
}

// killAll stops every agent (test cleanup).
func (d *hostDriver) killAll() {
	ids, _ := d.List(context.Background())
	for _, id := range ids {
		_ = d.Delete(context.Background(), id)
	}
}

type hostHandle struct{ b *hostBox }

func (h *hostHandle) ID() string { return h.b.id }

func (h *hostHandle) AgentConn(ctx context.Context) (net.Conn, error) {
	select {
	case c := <-h.b.conns:
		return c, nil
	case <-h.b.done:
		return nil, errors.New("agent exited")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (h *hostHandle) Close() error { return nil }

// ---- shared set-up ----

// testLogger logs warnings and errors (everything with -v).
func testLogger() *slog.Logger {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func TestMain(m *testing.M) {
	code := m.Run()
	if agentBin != "" {
		os.RemoveAll(filepath.Dir(agentBin))
	}
	os.Exit(code)
}

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// buildAgent builds cmd/airlock-agent once per test binary.
func buildAgent(t testing.TB) string {
	t.Helper()
	testenv.RequireGoBuild(t, "airlock-agent")
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "airlock-agent-bin")
		if err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(dir, "airlock-agent")
		cmd := exec.Command("go", "build", "-o", agentBin, "github.com/airlock/airlock/cmd/airlock-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("build airlock-agent: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentBin
}

// testWorker runs a Worker against a fake server until the test ends.
type testWorker struct {
	w      *Worker
	srv    *fakeServer
	cancel context.CancelFunc
	done   chan error
}

func startWorker(t testing.TB, srv *fakeServer, drv runtime.Driver, rootfs func(string) string) *testWorker {
	t.Helper()
	return startWorkerWith(t, srv, drv, rootfs, nil)
}

// startWorkerWith is startWorker with a snapshot store.
func startWorkerWith(t testing.TB, srv *fakeServer, drv runtime.Driver, rootfs func(string) string, snaps *snapshot.Store, opts ...func(*Config)) *testWorker {
	t.Helper()
	cfg := Config{
		Snapshots:     snaps,
		ID:            "w-test",
		ServerURL:     srv.URL,
		WorkerToken:   testWorkerToken,
		DataPlaneAddr: "127.0.0.1:0",
		Driver:        drv,
		RootFS:        rootfs,
		CapacityMiB:   4096,
		CapacityVCPUs: 2,
		Templates: func() ([]model.Template, error) {
			return []model.Template{{Name: "base", Tag: "latest", Digest: "sha256:test"}}, nil
		},
		Logger: testLogger(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tw := &testWorker{w: w, srv: srv, cancel: cancel, done: make(chan error, 1)}
	go func() { tw.done <- w.Run(ctx) }()
	t.Cleanup(func() { tw.stop(t) })
	return tw
}

// stop ends Run (sandboxes keep running); idempotent.
func (tw *testWorker) stop(t testing.TB) {
	if tw.cancel == nil {
		return
	}
	tw.cancel()
	tw.cancel = nil
	if err := <-tw.done; err != nil {
		t.Errorf("worker Run: %v", err)
	}
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func sandboxURL(w *Worker, sid string) string {
	return strings.TrimRight(w.DataPlaneURL(), "/") + "/v1/sandboxes/" + sid
}
