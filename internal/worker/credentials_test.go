package worker

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/controller"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// credsEnv is the real controller (worker API over HTTP, real SQLite) and
// real workers registering with it by join token.
type credsEnv struct {
	ctrl *controller.Controller
	st   *sqlite.Store
	srv  *httptest.Server
}

const testJoinToken = "join-token-for-tests"

func newCredsEnv(t *testing.T) *credsEnv {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctrl := controller.New(controller.Config{Store: st, Events: events.New(st), WorkerToken: testJoinToken, Logger: testLogger()})
	srv := httptest.NewServer(ctrl.Handler())
	t.Cleanup(srv.Close)
	return &credsEnv{ctrl: ctrl, st: st, srv: srv}
}

// start runs a real worker id whose data dir is dir until the test ends and
// returns it once it has registered.
func (e *credsEnv) start(t *testing.T, id, dir string) *Worker {
	t.Helper()
	w, err := New(Config{
		ID: id, ServerURL: e.srv.URL, WorkerToken: testJoinToken, SecretFile: filepath.Join(dir, "worker.secret"),
		DataPlaneAddr: "127.0.0.1:0", Driver: &hostDriver{dir: t.TempDir(), boxes: map[string]*hostBox{}},
		RootFS:    func(string) string { return "/" },
		Templates: func() ([]model.Template, error) { return nil, nil },
		Logger:    testLogger(), CapacityMiB: 1024, CapacityVCPUs: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	ctx2 := testContext(t)
	for w.key.Load() == nil { // Run registers first
		select {
		case err := <-done:
			t.Fatalf("worker %s stopped before registering: %v", id, err)
		case <-ctx2.Done():
			t.Fatalf("worker %s did not register", id)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return w
}

// get calls path on w's data plane with tok and returns the status.
func dataPlaneStatus(t *testing.T, w *Worker, sid, tok string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, sandboxURL(w, sid)+"/commands", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestWorkerCannotMintTokensForAnotherWorker is the attack of defect 7:
// every worker received the master data-plane key and could forge a token
// for any sandbox on any worker. Now each worker holds only its own derived
// key: a token worker A mints (with its key, naming A or B) is refused by
// worker B, while the server's token for B's sandbox is accepted by B and
// refused by A.
func TestWorkerCannotMintTokensForAnotherWorker(t *testing.T) {
	e := newCredsEnv(t)
	a := e.start(t, "w-a", t.TempDir())
	b := e.start(t, "w-b", t.TempDir())
	master, err := e.ctrl.SigningKey(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ka, kb := (*a.key.Load())[0].Key, (*b.key.Load())[0].Key
	if string(ka) == string(master) || string(kb) == string(master) || string(ka) == string(kb) {
		t.Fatal("a worker holds the master key, or both hold the same key")
	}
	const sid = "sb-on-worker-b"
	claims := token.Claims{SandboxID: sid, OrgID: "org-x", Scope: token.ScopeFiles, Expires: 1 << 40}
	// A's forgeries: signed with A's own key, as is and naming B.
	forged, err := token.Sign(ka, claims)
	if err != nil {
		t.Fatal(err)
	}
	forgedB := claims
	forgedB.Worker = "w-b"
	forged2, err := token.Sign(ka, forgedB)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"A's key": forged, "A's key naming B": forged2} {
		if st := dataPlaneStatus(t, b, sid, tok); st != http.StatusUnauthorized {
			t.Errorf("worker B answered %d to a token minted with %s, want 401", st, name)
		}
	}
	// The server's token for B (as service.workerRequest signs it).
	good, err := token.Sign(master, forgedB)
	if err != nil {
		t.Fatal(err)
	}
	if st := dataPlaneStatus(t, b, sid, good); st == http.StatusUnauthorized || st == http.StatusForbidden {
		t.Errorf("worker B refused the server's token for its sandbox: %d", st)
	}
	if st := dataPlaneStatus(t, a, sid, good); st != http.StatusUnauthorized {
		t.Errorf("worker A answered %d to a token for worker B, want 401", st)
	}
}

// TestJoinTokenCannotTakeOverAWorker is the attack of defect 7: anyone with
// the shared worker token could register as an existing worker id and
// redirect its data-plane URL (and so clients' tokens), or sync as it. Now
// the first registration binds the id to a per-worker secret (kept 0600 in
// the worker's data dir); the join token alone cannot re-register the id,
// change its URL, or call its sync or wake.
func TestJoinTokenCannotTakeOverAWorker(t *testing.T) {
	e := newCredsEnv(t)
	dir := t.TempDir()
	victim := e.start(t, "w-victim", dir)
	fi, err := os.Stat(filepath.Join(dir, "worker.secret"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("worker.secret: %v, mode %v; want a 0600 file", err, fi.Mode())
	}
	secret := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(dir, "worker.secret")))))
	before, err := e.st.GetWorker(t.Context(), "w-victim")
	if err != nil {
		t.Fatal(err)
	}
	hijack := workerapi.RegisterRequest{ID: "w-victim", DataPlaneURL: "http://attacker.example:7071", Runtimes: []string{"gvisor"}}
	for name, s := range map[string]string{"no secret": "", "a wrong secret": "alw_00"} {
		hijack.Secret = s
		_, err := e.ctrl.Register(t.Context(), hijack)
		if !errors.Is(err, model.ErrForbidden) || !strings.Contains(err.Error(), "w-victim") {
			t.Errorf("register as w-victim with the join token and %s: %v, want forbidden naming the id", name, err)
		}
	}
	// Over HTTP too, and the sync and wake routes refuse the join token and
	// another worker's secret.
	_ = e.start(t, "w-attacker", t.TempDir())
	attackerSecret := ""
	if err := func() error {
		resp, err := e.ctrl.Register(t.Context(), workerapi.RegisterRequest{ID: "w-attacker2", DataPlaneURL: "http://127.0.0.1:1"})
		attackerSecret = resp.WorkerSecret
		return err
	}(); err != nil || attackerSecret == "" {
		t.Fatalf("a fresh id registers with the join token: %v %q", err, attackerSecret)
	}
	for _, tc := range []struct{ name, path, bearer string }{
		{"register without the secret", "/internal/v1/workers/register", testJoinToken},
		{"sync with the join token", "/internal/v1/workers/w-victim/sync", testJoinToken},
		{"wake with the join token", "/internal/v1/workers/w-victim/wake", testJoinToken},
		{"sync with another worker's secret", "/internal/v1/workers/w-victim/sync", attackerSecret},
		{"wake with another worker's secret", "/internal/v1/workers/w-victim/wake", attackerSecret},
	} {
		body := `{"id":"w-victim","data_plane_url":"http://attacker.example:7071"}`
		if !strings.HasSuffix(tc.path, "/register") {
			body = `{"sandbox_id":"sb-x"}`
		}
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+tc.path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tc.bearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 401 or 403", tc.name, resp.StatusCode)
		}
	}
	after, err := e.st.GetWorker(t.Context(), "w-victim")
	if err != nil || after.DataPlaneURL != before.DataPlaneURL {
		t.Fatalf("w-victim's data-plane URL is %q after the attacks, want %q (%v)", after.DataPlaneURL, before.DataPlaneURL, err)
	}
	// The real worker re-registers with its secret, and may move.
	moved := hijack
	moved.DataPlaneURL, moved.Secret = "http://127.0.0.1:9/", secret
	resp, err := e.ctrl.Register(t.Context(), moved)
	if err != nil || resp.WorkerSecret != "" {
		t.Fatalf("re-register with the secret: %+v %v; want success and no new secret", resp, err)
	}
	if k, _ := base64.StdEncoding.DecodeString(resp.SigningKey); string(k) != string((*victim.key.Load())[0].Key) {
		t.Errorf("re-registration changed the worker's key")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
