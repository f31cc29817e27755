package controller

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

const (
	testToken  = "worker-secret"
	testOrg    = "org1"
	baseDigest = "sha256:base"
)

var baseTemplate = model.Template{Name: "base", Tag: "latest", Digest: baseDigest, SizeBytes: 1}

// clock is a settable clock for deadlines and heartbeats.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type env struct {
	t     *testing.T
	ctx   context.Context
	st    store.Store
	ev    *events.Log
	c     *Controller
	clock *clock
	srv   *httptest.Server
	// secrets are the workers' own credentials, issued at registration.
	secretsMu sync.Mutex
	secrets   map[string]string
}

func newEnv(t *testing.T, opts ...func(*Config)) *env {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.CreateOrg(ctx, model.Org{ID: testOrg, Name: "test", CreatedAt: time.Now()}); err != nil {
		t.Fatalf("create org: %v", err)
	}
	ev := events.New(st)
	clk := &clock{t: time.Now().UTC()}
	// Tests move the clock past deadlines without every worker syncing:
	// a worker is lost only where a test says so (TestWorkerLoss).
	cfg := Config{Store: st, Events: ev, WorkerToken: testToken, Now: clk.Now, WorkerLossGrace: 1000 * time.Hour}
	for _, o := range opts {
		o(&cfg)
	}
	c := New(cfg)
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return &env{t: t, ctx: ctx, st: st, ev: ev, c: c, clock: clk, srv: srv}
}

// createSandbox writes a pending sandbox and its create operation, as the
// service layer does.
func (e *env) createSandbox(id string, mem int) (model.Sandbox, model.Operation) {
	e.t.Helper()
	now := e.clock.Now()
	sb := model.Sandbox{
		ID: id, OrgID: testOrg, Template: "base", TemplateDigest: baseDigest, Runtime: "gvisor",
		State: model.StatePending, DesiredState: model.StateRunning,
		Resources: model.Resources{VCPUs: 1, MemoryMiB: mem},
		CreatedAt: now, UpdatedAt: now, LastActivityAt: now,
	}
	op := model.Operation{
		ID: "op-create-" + id, OrgID: testOrg, SandboxID: id, Kind: model.OpCreate, State: model.OpPending,
		Target: model.StateRunning, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(e.c.OperationDeadline()),
	}
	sb, op, _, err := e.st.CreateSandbox(e.ctx, sb, op, "")
	if err != nil {
		e.t.Fatalf("create sandbox: %v", err)
	}
	return sb, op
}

// requestDelete sets desired deleted and records a delete operation, as the
// service layer does.
func (e *env) requestDelete(id string) model.Operation {
	e.t.Helper()
	sb := e.sandbox(id)
	sb.DesiredState = model.StateDeleted
	if _, err := e.st.UpdateSandbox(e.ctx, sb); err != nil {
		e.t.Fatalf("set desired deleted: %v", err)
	}
	now := e.clock.Now()
	op := model.Operation{
		ID: "op-delete-" + id, OrgID: testOrg, SandboxID: id, Kind: model.OpDelete, State: model.OpPending,
		Target: model.StateDeleted, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(time.Hour),
	}
	if err := e.st.CreateOperation(e.ctx, op); err != nil {
		e.t.Fatalf("create delete operation: %v", err)
	}
	return op
}

func (e *env) reconcile() {
	e.t.Helper()
	if err := e.c.ReconcileAll(e.ctx); err != nil {
		e.t.Fatalf("reconcile: %v", err)
	}
}

func (e *env) sandbox(id string) model.Sandbox {
	e.t.Helper()
	sb, err := e.st.GetSandbox(e.ctx, id)
	if err != nil {
		e.t.Fatalf("get sandbox %s: %v", id, err)
	}
	return sb
}

func (e *env) op(id string) model.Operation {
	e.t.Helper()
	op, err := e.st.GetOperation(e.ctx, id)
	if err != nil {
		e.t.Fatalf("get operation %s: %v", id, err)
	}
	return op
}

func (e *env) wantSandbox(id string, state model.SandboxState, worker, reasonPart string) model.Sandbox {
	e.t.Helper()
	sb := e.sandbox(id)
	if sb.State != state || sb.WorkerID != worker || !strings.Contains(sb.Reason, reasonPart) {
		e.t.Fatalf("sandbox %s: state %s worker %q reason %q; want state %s worker %q reason containing %q",
			id, sb.State, sb.WorkerID, sb.Reason, state, worker, reasonPart)
	}
	return sb
}

func (e *env) wantOp(id string, state model.OperationState, reasonPart string) {
	e.t.Helper()
	op := e.op(id)
	if op.State != state || !strings.Contains(op.Reason, reasonPart) {
		e.t.Fatalf("operation %s: state %s reason %q; want state %s reason containing %q", id, op.State, op.Reason, state, reasonPart)
	}
}

// history returns the sandbox's events as "sandbox:<state>" and
// "operation:<kind>:<state>".
func (e *env) history(id string) []string {
	e.t.Helper()
	evs, err := e.st.ListEvents(e.ctx, "", id, 0, 1000)
	if err != nil {
		e.t.Fatalf("list events: %v", err)
	}
	var out []string
	for _, ev := range evs {
		switch ev.Type {
		case events.TypeSandbox:
			var sb model.Sandbox
			if err := json.Unmarshal(ev.Data, &sb); err != nil {
				e.t.Fatalf("decode sandbox event: %v", err)
			}
			out = append(out, "sandbox:"+string(sb.State))
		case events.TypeOperation:
			var op model.Operation
			if err := json.Unmarshal(ev.Data, &op); err != nil {
				e.t.Fatalf("decode operation event: %v", err)
			}
			out = append(out, "operation:"+string(op.Kind)+":"+string(op.State))
		default:
			out = append(out, ev.Type)
		}
	}
	return out
}

func (e *env) wantHistory(id string, want ...string) {
	e.t.Helper()
	if got := e.history(id); !slices.Equal(got, want) {
		e.t.Fatalf("events of %s:\n got %q\nwant %q", id, got, want)
	}
}

// fakeWorker is a worker in these tests: it speaks the worker API through
// workerapi's real Client (post sends raw requests, for the tests of the
// protocol's edges).
type fakeWorker struct {
	e     *env
	id    string
	token string
	free  *int   // reported free memory (nil: none)
	blob  string // the blob store it registers ("": none)
}

func (e *env) worker(id string) *fakeWorker { return &fakeWorker{e: e, id: id, token: testToken} }

func (w *fakeWorker) post(path string, body any) (*http.Response, []byte) {
	w.e.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		w.e.t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(w.e.ctx, http.MethodPost, w.e.srv.URL+path, bytes.NewReader(b))
	if err != nil {
		w.e.t.Fatal(err)
	}
	tok := w.token
	if tok == testToken && !strings.HasSuffix(path, "/register") {
		w.e.secretsMu.Lock()
		if s := w.e.secrets[w.id]; s != "" {
			tok = s // past registration a worker sends its own credential
		}
		w.e.secretsMu.Unlock()
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.e.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp, buf.Bytes()
}

// client is the worker's real client of the worker API, as this worker.
func (w *fakeWorker) client() *workerapi.Client {
	return &workerapi.Client{URL: w.e.srv.URL, JoinToken: w.token, Secret: func() string {
		if w.token != testToken {
			return "" // a test of a wrong token sends it everywhere
		}
		w.e.secretsMu.Lock()
		defer w.e.secretsMu.Unlock()
		return w.e.secrets[w.id] // past registration a worker sends its own credential
	}}
}

func (w *fakeWorker) register(templates ...model.Template) workerapi.RegisterResponse {
	w.e.t.Helper()
	w.e.secretsMu.Lock()
	secret := w.e.secrets[w.id]
	w.e.secretsMu.Unlock()
	out, err := w.client().Register(w.e.ctx, workerapi.RegisterRequest{
		ID: w.id, DataPlaneURL: "http://127.0.0.1:1/" + w.id, Runtimes: []string{"gvisor"},
		CapacityMiB: 4096, CapacityVCPUs: 4, Templates: templates, Secret: secret, FreeMiB: w.free,
		BlobStore: w.blob,
	})
	if err != nil {
		w.e.t.Fatalf("register: %v", err)
	}
	if out.WorkerSecret != "" {
		w.e.secretsMu.Lock()
		if w.e.secrets == nil {
			w.e.secrets = map[string]string{}
		}
		w.e.secrets[w.id] = out.WorkerSecret
		w.e.secretsMu.Unlock()
	}
	return out
}

// sync calls Sync; version < 0 asks for the assignments at once (no
// assignment version is negative).
func (w *fakeWorker) sync(version int64, wait time.Duration, observed ...workerapi.Observed) workerapi.SyncResponse {
	w.e.t.Helper()
	out, err := w.client().Sync(w.e.ctx, w.id, workerapi.SyncRequest{Observed: observed, FreeMiB: w.free}, wait, version)
	if err != nil {
		w.e.t.Fatalf("sync: %v", err)
	}
	return out
}

func desiredOf(resp workerapi.SyncResponse) map[string]model.SandboxState {
	m := map[string]model.SandboxState{}
	for _, a := range resp.Assignments {
		m[a.Sandbox.ID] = a.Desired
	}
	return m
}

func wantAssignments(t *testing.T, resp workerapi.SyncResponse, want map[string]model.SandboxState) {
	t.Helper()
	got := desiredOf(resp)
	if len(got) != len(want) {
		t.Fatalf("assignments %v, want %v", got, want)
	}
	for id, d := range want {
		if got[id] != d {
			t.Fatalf("assignments %v, want %v", got, want)
		}
	}
}

func TestCreateRunDelete(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	_, create := e.createSandbox("sb1", 512)

	e.reconcile()
	e.wantSandbox("sb1", model.StateStarting, "w1", "")
	e.wantOp(create.ID, model.OpRunning, "")

	resp := w.sync(-1, 0)
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateRunning})

	resp = w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	e.wantOp(create.ID, model.OpSucceeded, "")
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateRunning})

	del := e.requestDelete("sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateDeleting, "w1", "")
	e.wantOp(del.ID, model.OpPending, "")
	resp = w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateDeleted})

	resp = w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateDeleted})
	e.wantSandbox("sb1", model.StateDeleted, "w1", "") // WorkerID kept for history
	e.wantOp(del.ID, model.OpSucceeded, "")
	wantAssignments(t, resp, nil)

	e.reconcile() // nothing left to do: no new events
	e.wantHistory("sb1",
		"sandbox:starting", "operation:create:running",
		"sandbox:running", "operation:create:succeeded",
		"sandbox:deleting",
		"sandbox:deleted", "operation:delete:succeeded",
	)
}

func TestWorkerReportsFailed(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	_, create := e.createSandbox("sb1", 512)
	e.reconcile()

	resp := w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateFailed, Reason: "agent did not answer /health"})
	e.wantSandbox("sb1", model.StateFailed, "w1", "agent did not answer /health")
	e.wantOp(create.ID, model.OpFailed, "agent did not answer /health")
	// The worker is told to free the failed sandbox.
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateDeleted})

	e.reconcile()
	e.wantHistory("sb1", "sandbox:starting", "operation:create:running", "sandbox:failed", "operation:create:failed")

	// Deleting a failed sandbox that is still on its worker goes through the worker.
	del := e.requestDelete("sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateDeleting, "w1", "")
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateDeleted})
	e.wantSandbox("sb1", model.StateDeleted, "w1", "")
	e.wantOp(del.ID, model.OpSucceeded, "")
}

func TestSandboxDisappears(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateRunning, "w1", "")

	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateDeleted})
	e.wantSandbox("sb1", model.StateFailed, "w1", "sandbox disappeared from worker w1")
}

func TestObservationsFromOtherWorkerIgnored(t *testing.T) {
	e := newEnv(t)
	w1, w2 := e.worker("w1"), e.worker("w2")
	w1.register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.reconcile()
	w2.register()
	resp := w2.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateStarting, "w1", "")
	wantAssignments(t, resp, nil)
}

func TestOperationDeadline(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	sb, _ := e.createSandbox("sb1", 512)
	now := e.clock.Now()
	op := model.Operation{
		ID: "op-short", OrgID: testOrg, SandboxID: sb.ID, Kind: model.OpCreate, State: model.OpPending,
		Target: model.StateRunning, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(time.Minute),
	}
	if err := e.st.CreateOperation(e.ctx, op); err != nil {
		t.Fatal(err)
	}
	e.reconcile()
	e.wantSandbox("sb1", model.StateStarting, "w1", "")
	e.wantOp(op.ID, model.OpPending, "") // the older create op was the one started

	e.clock.Advance(2 * time.Minute) // past op-short's deadline, not the default one
	e.reconcile()
	const reason = "deadline of 1m0s passed while create was starting"
	e.wantOp(op.ID, model.OpFailed, reason)
	e.wantSandbox("sb1", model.StateFailed, "w1", reason)
	e.wantOp("op-create-sb1", model.OpFailed, reason) // the sandbox failing fails its other ops

	// The worker is told to free it.
	resp := w.sync(-1, 0)
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateDeleted})
}

func TestDeadlineWhileDeletingKeepsDeleting(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	del := e.requestDelete("sb1")
	e.reconcile()
	e.clock.Advance(2 * time.Hour)
	e.reconcile()
	e.wantOp(del.ID, model.OpFailed, "deadline of 1h0m0s passed while delete was deleting")
	e.wantSandbox("sb1", model.StateDeleting, "w1", "")
}

func TestNoWorkerStaysPending(t *testing.T) {
	e := newEnv(t)
	_, create := e.createSandbox("sb1", 512)
	e.reconcile()
	e.wantSandbox("sb1", model.StatePending, "", "no live worker")
	e.wantOp(create.ID, model.OpPending, "")
	before := len(e.history("sb1"))
	e.reconcile() // same reason: no new write, no new event
	if after := len(e.history("sb1")); after != before {
		t.Fatalf("reconcile without change wrote %d events", after-before)
	}

	w := e.worker("w1")
	w.register() // no template yet
	e.reconcile()
	e.wantSandbox("sb1", model.StatePending, "", "has template "+baseDigest)

	e.createSandbox("big", 1<<20)
	w.register(baseTemplate)
	e.reconcile()
	e.wantSandbox("sb1", model.StateStarting, "w1", "")
	e.wantSandbox("big", model.StatePending, "", "no worker has capacity for 1048576 MiB")
}

func TestPlacementAccountsForLoad(t *testing.T) {
	e := newEnv(t)
	e.worker("w1").register(baseTemplate) // 4096 MiB each
	e.worker("w2").register(baseTemplate)
	for i := range 4 {
		e.createSandbox(fmt.Sprintf("sb%d", i), 2048)
	}
	e.createSandbox("sb4", 2048)
	e.reconcile()
	count := map[string]int{}
	for i := range 4 {
		sb := e.sandbox(fmt.Sprintf("sb%d", i))
		if sb.State != model.StateStarting {
			t.Fatalf("sandbox %s: %s (%s), want starting", sb.ID, sb.State, sb.Reason)
		}
		count[sb.WorkerID]++
	}
	if count["w1"] != 2 || count["w2"] != 2 {
		t.Fatalf("placement %v, want two on each worker", count)
	}
	e.wantSandbox("sb4", model.StatePending, "", "no worker has capacity")
}

func TestDeletePending(t *testing.T) {
	e := newEnv(t)
	_, create := e.createSandbox("sb1", 512)
	del := e.requestDelete("sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateDeleted, "", "")
	e.wantOp(del.ID, model.OpSucceeded, "")
	e.wantOp(create.ID, model.OpCancelled, "deleted")
	e.wantHistory("sb1", "sandbox:deleted", "operation:delete:succeeded", "operation:create:cancelled")
}

func TestSilentWorkerNote(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})

	e.clock.Advance(5 * e.c.HeartbeatTTL())
	e.reconcile()
	e.wantSandbox("sb1", model.StateRunning, "w1", "worker w1 is unreachable")

	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning}) // it comes back
	e.reconcile()
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	if sb := e.sandbox("sb1"); sb.Reason != "" {
		t.Fatalf("reason %q not cleared after the worker came back", sb.Reason)
	}
}

func TestLongPollWakesOnNewAssignment(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	first := w.sync(-1, 0)
	wantAssignments(t, first, nil)

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- e.c.Run(ctx) }()

	got := make(chan workerapi.SyncResponse, 1)
	go func() { got <- w.sync(first.Version, MaxSyncWait) }()
	// Wait until the long poll is parked on the unchanged version, so the
	// new sandbox is what wakes it.
	for e.c.waiting.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	e.createSandbox("sb1", 512)
	e.c.Kick()
	resp := <-got
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateRunning})
	if resp.Version == first.Version {
		t.Fatalf("version did not change: %d", resp.Version)
	}
	if resp.Assignments[0].Sandbox.State != model.StateStarting {
		t.Fatalf("assigned sandbox state %s, want starting", resp.Assignments[0].Sandbox.State)
	}
	cancel()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v, want context.Canceled", err)
	}
}

func TestLongPollReturnsWhenObservationChangesState(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.reconcile()
	resp := w.sync(-1, 0)
	// Same version, but the observation changes the sandbox: no waiting.
	resp = w.sync(resp.Version, MaxSyncWait, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	if s := resp.Assignments[0].Sandbox.State; s != model.StateRunning {
		t.Fatalf("assignment carries state %s, want running", s)
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t)
	e.worker("w1").register(baseTemplate)
	for _, tc := range []struct {
		name, token, path string
		status            int
		code              string
	}{
		{"sync wrong token", "nope", "/internal/v1/workers/w1/sync", 401, "unauthorized"},
		{"sync no token", "", "/internal/v1/workers/w1/sync", 401, "unauthorized"},
		{"register wrong token", "worker-secre", "/internal/v1/workers/register", 401, "unauthorized"},
		{"sync unknown worker", testToken, "/internal/v1/workers/nobody/sync", 401, "unauthorized"},
		{"sync bad version", testToken, "/internal/v1/workers/w1/sync?version=x", 400, "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := e.worker("w1")
			w.token = tc.token
			resp, body := w.post(tc.path, workerapi.SyncRequest{})
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			var er struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			if err := json.Unmarshal(body, &er); err != nil {
				t.Fatalf("decode error body %q: %v", body, err)
			}
			if er.Error.Code != tc.code || er.Error.Message == "" {
				t.Fatalf("error %+v, want code %s with a message", er.Error, tc.code)
			}
		})
	}
}

func TestNoTokenRefusesAll(t *testing.T) {
	e := newEnv(t)
	c := New(Config{Store: e.st, Events: e.ev})
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/internal/v1/workers/register", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer ")
	c.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", rec.Code)
	}
}

func TestRegisterSigningKeyAndTemplates(t *testing.T) {
	e := newEnv(t)
	r1 := e.worker("w1").register(baseTemplate)
	r2 := e.worker("w2").register()
	// Each worker gets its own key, derived from the master, never the
	// master itself.
	if r1.WorkerID != "w1" || r1.SigningKey == "" || r1.SigningKey == r2.SigningKey {
		t.Fatalf("register responses %+v %+v: want two different non-empty keys", r1, r2)
	}
	key, err := token.SigningKey(e.ctx, e.st)
	if err != nil {
		t.Fatal(err)
	}
	if base64.StdEncoding.EncodeToString(token.WorkerKey(key, "w1")) != r1.SigningKey || len(key) != 32 ||
		base64.StdEncoding.EncodeToString(key) == r1.SigningKey {
		t.Fatalf("SigningKey %x: the registered key %s is not w1's derived key", key, r1.SigningKey)
	}
	tpl, err := e.st.GetTemplate(e.ctx, "base", "latest")
	if err != nil || tpl.Digest != baseDigest {
		t.Fatalf("template base:latest = %+v, %v; want digest %s", tpl, err, baseDigest)
	}
	wk, err := e.st.GetWorker(e.ctx, "w1")
	if err != nil || !slices.Equal(wk.Templates, []string{baseDigest}) || wk.CapacityMiB != 4096 {
		t.Fatalf("worker w1 = %+v, %v", wk, err)
	}
}

func TestRegisterInvalid(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	for _, req := range []workerapi.RegisterRequest{
		{ID: "bad/id", DataPlaneURL: "http://127.0.0.1:1"},
		{ID: "w1", DataPlaneURL: "not a url"},
		{ID: "w1", DataPlaneURL: "http://127.0.0.1:1", CapacityMiB: -1},
		{ID: "w1", DataPlaneURL: "http://127.0.0.1:1", Templates: []model.Template{{Name: "base"}}},
	} {
		resp, body := w.post("/internal/v1/workers/register", req)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("register %+v: status %d, want 400: %s", req, resp.StatusCode, body)
		}
	}
}

func TestReady(t *testing.T) {
	e := newEnv(t)
	if err := e.c.Ready(e.ctx); !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "no worker has registered") {
		t.Fatalf("Ready with no worker = %v", err)
	}
	w := e.worker("w1")
	w.register()
	if err := e.c.Ready(e.ctx); !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "template") {
		t.Fatalf("Ready without template = %v", err)
	}
	w.register(baseTemplate)
	if err := e.c.Ready(e.ctx); err != nil {
		t.Fatalf("Ready = %v, want nil", err)
	}
	e.clock.Advance(time.Minute)
	if err := e.c.Ready(e.ctx); !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "heartbeat") {
		t.Fatalf("Ready with a silent worker = %v", err)
	}
	w.sync(-1, 0)
	if err := e.c.Ready(e.ctx); err != nil {
		t.Fatalf("Ready after a sync = %v, want nil", err)
	}
}

func TestLongPollKeepsHeartbeatFresh(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.HeartbeatTTL = 30 * time.Millisecond })
	w := e.worker("w1")
	w.register(baseTemplate)
	first := w.sync(-1, 0)

	got := make(chan workerapi.SyncResponse, 1)
	go func() { got <- w.sync(first.Version, MaxSyncWait) }()
	for e.c.waiting.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	// While the poll is parked, time moves past the TTL; the parked poll
	// must keep the worker's heartbeat (and readiness) fresh.
	e.clock.Advance(time.Hour)
	for {
		wk, err := e.st.GetWorker(e.ctx, "w1")
		if err != nil {
			t.Fatal(err)
		}
		if wk.LastHeartbeat.Equal(e.clock.Now()) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := e.c.Ready(e.ctx); err != nil {
		t.Fatalf("Ready during a parked long poll = %v", err)
	}
	e.createSandbox("sb1", 512)
	e.reconcile()
	wantAssignments(t, <-got, map[string]model.SandboxState{"sb1": model.StateRunning})
}

func TestLongPollAnswersWhenControllerStops(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.createSandbox("sb1", 512)
	e.reconcile()
	first := w.sync(-1, 0)

	ctx, cancel := context.WithCancel(e.ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- e.c.Run(ctx) }()
	got := make(chan workerapi.SyncResponse, 1)
	go func() { got <- w.sync(first.Version, MaxSyncWait) }()
	for e.c.waiting.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-runErr
	// Unchanged assignments, answered because the controller stopped.
	resp := <-got
	if resp.Version != first.Version {
		t.Fatalf("version %d, want unchanged %d", resp.Version, first.Version)
	}
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateRunning})
}
