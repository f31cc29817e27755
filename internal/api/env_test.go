package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/token"
)

const baseDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

// env is a real server (real SQLite store, real handler) on a loopback
// httptest server, driven through the real client.
type env struct {
	t        *testing.T
	ctx      context.Context
	st       *sqlite.Store
	ev       *events.Log
	svc      *service.Service
	srv      *httptest.Server
	adminKey string
	admin    *client.Client
	kicks    atomic.Int64
	// handler wraps the API handler; tests may set hook to observe requests.
	hook atomic.Pointer[func(*http.Request)]
}

func newEnv(t *testing.T, configure ...func(*service.Config)) *env {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, ctx: ctx, st: st, ev: events.New(st)}
	if err := st.PutTemplate(ctx, model.Template{Name: "base", Tag: "latest", Digest: baseDigest, SizeBytes: 1, CreatedAt: time.Now()}); err != nil {
		t.Fatalf("put template: %v", err)
	}
	cfg := service.Config{Store: st, Events: e.ev, Kick: func() { e.kicks.Add(1) }}
	for _, c := range configure {
		c(&cfg)
	}
	e.svc = service.New(cfg)
	secret, created, err := e.svc.Bootstrap(ctx)
	if err != nil || !created {
		t.Fatalf("bootstrap: created=%v err=%v", created, err)
	}
	e.adminKey = secret
	h := api.New(e.svc, api.Options{KeepAlive: 50 * time.Millisecond})
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f := e.hook.Load(); f != nil {
			(*f)(r)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(e.srv.Close)
	e.admin = client.New(e.srv.URL, secret)
	return e
}

// client returns a client with key.
func (e *env) client(key string) *client.Client { return client.New(e.srv.URL, key) }

// orgClient creates an org with a non-admin key and returns its client.
func (e *env) orgClient(name string, admin bool) (*client.Client, model.Org) {
	e.t.Helper()
	org, err := e.admin.CreateOrg(e.ctx, name)
	if err != nil {
		e.t.Fatalf("create org: %v", err)
	}
	k, err := e.admin.CreateKey(e.ctx, org.ID, client.CreateKeyRequest{Name: "k", Admin: admin})
	if err != nil {
		e.t.Fatalf("create key: %v", err)
	}
	return e.client(k.Secret), org
}

// dataPlane is a stand-in for a worker's data plane: it checks the
// server-signed files token and lists one fixed command.
func (e *env) dataPlane() *httptest.Server {
	e.t.Helper()
	key, err := service.StoreSigningKey(e.st)(e.ctx)
	if err != nil {
		e.t.Fatalf("signing key: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{sid}/commands", func(w http.ResponseWriter, r *http.Request) {
		tok := r.Header.Get("Authorization")
		if len(tok) < 7 {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		c, err := token.Verify(token.WorkerKey(key, "w1"), tok[7:], time.Now()) // w1's own key
		if err != nil || c.Scope != token.ScopeFiles || c.SandboxID != r.PathValue("sid") {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		// Three commands in pages of ?limit= (default 2), the cursor
		// being the index of the next one, as a worker pages them.
		all := []agentapi.ProcessInfo{{ID: "cmd-fixed", PID: 42, Argv: []string{"sleep", "1"}, Running: true},
			{ID: "cmd-2", PID: 43, Argv: []string{"true"}}, {ID: "cmd-3", PID: 44, Argv: []string{"true"}}}
		from, size := 0, 2
		if c := r.URL.Query().Get("cursor"); c != "" {
			if from, err = strconv.Atoi(c); err != nil || from < 0 || from > len(all) {
				http.Error(w, "bad cursor", http.StatusBadRequest)
				return
			}
		}
		if l := r.URL.Query().Get("limit"); l != "" {
			size, _ = strconv.Atoi(l)
		}
		page := map[string]any{"commands": all[from:min(from+size, len(all))]}
		if from+size < len(all) {
			page["next_cursor"] = strconv.Itoa(from + size)
		}
		json.NewEncoder(w).Encode(page)
	})
	srv := httptest.NewServer(mux)
	e.t.Cleanup(srv.Close)
	return srv
}

// markRunning simulates a worker's sync: the sandbox is running on worker
// w1, whose data plane is dataPlaneURL, and its create operation succeeded.
func (e *env) markRunning(sandboxID, dataPlaneURL string) model.Sandbox {
	e.t.Helper()
	now := time.Now().UTC()
	if err := e.st.UpsertWorker(e.ctx, model.Worker{ID: "w1", DataPlaneURL: dataPlaneURL, InternalURL: dataPlaneURL, Runtimes: model.NamedRuntimes("gvisor"),
		Templates: []string{baseDigest}, CapacityMiB: 8192, CapacityVCPUs: 8, LastHeartbeat: now, CreatedAt: now}); err != nil {
		e.t.Fatalf("upsert worker: %v", err)
	}
	sb, err := e.st.GetSandbox(e.ctx, sandboxID)
	if err != nil {
		e.t.Fatalf("get sandbox: %v", err)
	}
	sb.State, sb.WorkerID = model.StateRunning, "w1"
	sb, err = e.st.UpdateSandbox(e.ctx, sb)
	if err != nil {
		e.t.Fatalf("update sandbox: %v", err)
	}
	if err := e.ev.Sandbox(e.ctx, sb); err != nil {
		e.t.Fatalf("event: %v", err)
	}
	return sb
}

// completeOp marks an operation done as the controller would.
func (e *env) completeOp(id string, state model.OperationState, reason string) {
	e.t.Helper()
	op, err := e.st.GetOperation(e.ctx, id)
	if err != nil {
		e.t.Fatalf("get op: %v", err)
	}
	op.State, op.Reason, op.UpdatedAt = state, reason, time.Now().UTC()
	if op, err = e.st.UpdateOperation(e.ctx, op); err != nil {
		e.t.Fatalf("update op: %v", err)
	}
	if err := e.ev.Operation(e.ctx, op); err != nil {
		e.t.Fatalf("event: %v", err)
	}
}

func (e *env) create(c *client.Client) (model.Sandbox, model.Operation) {
	e.t.Helper()
	sb, op, err := c.CreateSandbox(e.ctx, client.CreateSandboxRequest{}, "")
	if err != nil {
		e.t.Fatalf("create sandbox: %v", err)
	}
	return sb, op
}
