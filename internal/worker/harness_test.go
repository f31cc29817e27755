package worker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// ---- a fake server side of the worker API ----

// fakeServer implements register and sync just enough: the test sets the
// assignments and watches what the worker observes.
type fakeServer struct {
	t   testing.TB
	key []byte
	srv *httptest.Server

	mu          sync.Mutex
	changed     chan struct{} // closed and replaced on any change
	version     int64
	assignments map[string]workerapi.Assignment
	observed    map[string]workerapi.Observed
	registered  int
	syncedSince bool // a sync arrived since the last registration
	dataPlane   string
	// history lists every state observed per sandbox, in order.
	history map[string][]model.SandboxState
	// noAutoWake marks sandboxes whose wake requests get a 409.
	noAutoWake map[string]bool
	wakes      int // wake requests accepted
}

func newFakeServer(t testing.TB) *fakeServer {
	f := &fakeServer{
		t: t, key: token.NewKey(), changed: make(chan struct{}),
		assignments: map[string]workerapi.Assignment{}, observed: map[string]workerapi.Observed{},
		history: map[string][]model.SandboxState{}, noAutoWake: map[string]bool{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /internal/v1/workers/register", f.handleRegister)
	mux.HandleFunc("POST /internal/v1/workers/{id}/sync", f.handleSync)
	mux.HandleFunc("POST /internal/v1/workers/{id}/wake", f.handleWake)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

const testWorkerToken = "worker-secret"

func (f *fakeServer) authorized(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("Authorization") != "Bearer "+testWorkerToken {
		http.Error(w, `{"error":{"code":"unauthorized","message":"bad worker token"}}`, http.StatusUnauthorized)
		return false
	}
	return true
}

func (f *fakeServer) bump() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeServer) handleRegister(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(w, r) {
		return
	}
	var req workerapi.RegisterRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.registered++
	f.syncedSince = false
	f.dataPlane = req.DataPlaneURL
	f.bump()
	f.mu.Unlock()
	_ = json.NewEncoder(w).Encode(workerapi.RegisterResponse{WorkerID: req.ID, SigningKey: base64.StdEncoding.EncodeToString(f.key)})
}

func (f *fakeServer) handleSync(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(w, r) {
		return
	}
	var req workerapi.SyncRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	version, _ := strconv.ParseInt(r.URL.Query().Get("version"), 10, 64)
	wait, _ := time.ParseDuration(r.URL.Query().Get("wait"))
	f.mu.Lock()
	changed := !f.syncedSince
	f.syncedSince = true
	for _, o := range req.Observed {
		if prev, ok := f.observed[o.SandboxID]; !ok || prev != o {
			if !ok || prev.State != o.State {
				f.history[o.SandboxID] = append(f.history[o.SandboxID], o.State)
			}
			f.observed[o.SandboxID] = o
			changed = true
		}
		if a, ok := f.assignments[o.SandboxID]; ok && o.State != model.StateDeleted {
			a.Sandbox.State = o.State
			if o.SnapshotID != "" {
				a.Sandbox.SnapshotID = o.SnapshotID
			}
			f.assignments[o.SandboxID] = a
		}
		if o.State == model.StateDeleted {
			// Like the real controller: a deleted sandbox is no longer assigned.
			if a, ok := f.assignments[o.SandboxID]; ok && a.Desired == model.StateDeleted {
				delete(f.assignments, o.SandboxID)
				f.version++
			}
		}
	}
	if changed {
		f.bump()
	}
	ch := f.changed
	cur := f.version
	f.mu.Unlock()
	if !changed && cur == version && wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ch:
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	f.mu.Lock()
	resp := workerapi.SyncResponse{Version: f.version, Assignments: []workerapi.Assignment{}}
	for _, a := range f.assignments {
		resp.Assignments = append(resp.Assignments, a)
	}
	f.mu.Unlock()
	_ = json.NewEncoder(w).Encode(resp)
}

// assign sets the desired state of one sandbox.
func (f *fakeServer) assign(id, digest string, desired model.SandboxState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	state := model.StateStarting // like the controller: placed, not yet seen running
	var snap string
	if a, ok := f.assignments[id]; ok {
		state, snap = a.Sandbox.State, a.Sandbox.SnapshotID
	}
	f.assignments[id] = workerapi.Assignment{
		Sandbox: model.Sandbox{ID: id, Template: "base", TemplateDigest: digest, State: state, SnapshotID: snap,
			Resources: model.Resources{VCPUs: 1, MemoryMiB: 512}, NoAutoWake: f.noAutoWake[id]},
		Desired: desired,
	}
	f.version++
	f.bump()
}

// handleWake is the server side of an auto-wake: like the controller, it
// sets the desired state to running, or refuses when the sandbox opted out.
func (f *fakeServer) handleWake(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(w, r) {
		return
	}
	var req workerapi.WakeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.assignments[req.SandboxID]
	switch {
	case !ok:
		http.Error(w, `{"error":{"code":"not_found","message":"no such sandbox"}}`, http.StatusNotFound)
		return
	case f.noAutoWake[req.SandboxID]:
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, `{"error":{"code":"conflict","message":"sandbox %s opted out of auto-wake; wake it explicitly"}}`, req.SandboxID)
		return
	}
	f.wakes++
	a.Desired = model.StateRunning
	f.assignments[req.SandboxID] = a
	f.version++
	f.bump()
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(map[string]any{"operation": model.Operation{ID: "op-wake-" + req.SandboxID, SandboxID: req.SandboxID}})
}

// wakeCount returns how many wake requests were accepted.
func (f *fakeServer) wakeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wakes
}

// waitFor waits until cond holds for what the worker reported of id (its
// last observation and the history of its states).
func (f *fakeServer) waitFor(ctx context.Context, id string, cond func(workerapi.Observed, []model.SandboxState) bool) workerapi.Observed {
	f.t.Helper()
	for {
		f.mu.Lock()
		o := f.observed[id]
		h := append([]model.SandboxState(nil), f.history[id]...)
		ch := f.changed
		f.mu.Unlock()
		if cond(o, h) {
			return o
		}
		select {
		case <-ch:
		case <-ctx.Done():
			f.t.Fatalf("sandbox %s: condition never held (last: %+v, history %v)", id, o, h)
		}
	}
}

// setNoAutoWake opts sandbox id out of auto-wake (or back in).
func (f *fakeServer) setNoAutoWake(id string, v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noAutoWake[id] = v
	if a, ok := f.assignments[id]; ok {
		a.Sandbox.NoAutoWake = v
		f.assignments[id] = a
	}
}

// waitObserved waits until the worker reported sandbox id in state st.
func (f *fakeServer) waitObserved(ctx context.Context, id string, st model.SandboxState) workerapi.Observed {
	f.t.Helper()
	for {
		f.mu.Lock()
		o, ok := f.observed[id]
		ch := f.changed
		f.mu.Unlock()
		if ok && o.State == st {
			return o
		}
		select {
		case <-ch:
		case <-ctx.Done():
			f.t.Fatalf("sandbox %s: never observed %s (last: %+v)", id, st, o)
		}
	}
}

// waitRegistered waits until the worker registered n times and synced
// after that (so it holds the signing key and has adopted its sandboxes).
func (f *fakeServer) waitRegistered(ctx context.Context, n int) {
	f.t.Helper()
	for {
		f.mu.Lock()
		got, synced, ch := f.registered, f.syncedSince, f.changed
		f.mu.Unlock()
		if got >= n && synced {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			f.t.Fatalf("worker registered %d times, want %d", got, n)
		}
	}
}

// sign returns a data-plane token.
func (f *fakeServer) sign(t testing.TB, c token.Claims) string {
	t.Helper()
	if c.Expires == 0 {
		c.Expires = time.Now().Add(time.Hour).Unix()
	}
	tok, err := token.Sign(f.key, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
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
		ServerURL:     srv.srv.URL,
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
