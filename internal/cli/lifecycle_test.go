package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/controller"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/workerapi"
)

// lifecycleEnv is the real API, service and controller over SQLite, with a
// scripted worker speaking the real worker API: it does what each
// assignment asks at once (a suspend yields a snapshot) and reports it.
type lifecycleEnv struct {
	*apiEnv
	mu sync.Mutex
	// failSuspend makes the worker report the suspend as failed.
	failSuspend string
}

func newLifecycleEnv(t *testing.T) *lifecycleEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	tpl := model.Template{Name: "base", Tag: "latest", Digest: testDigest, SizeBytes: 1, CreatedAt: time.Now()}
	ev := events.New(st)
	ctrl := controller.New(controller.Config{Store: st, Events: ev, WorkerToken: "wt", Resync: 100 * time.Millisecond})
	svc := service.New(service.Config{Store: st, Events: ev, Kick: ctrl.Kick})
	secret, _, err := svc.Bootstrap(ctx)
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/internal/", ctrl.Handler())
	mux.Handle("/", api.New(svc, api.Options{}))
	srv := httptest.NewServer(mux)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); srv.Close(); wg.Wait() })
	e := &lifecycleEnv{apiEnv: &apiEnv{t: t, ctx: ctx, st: st, ev: ev, url: srv.URL, key: secret}}

	bearer := "wt" // the join token; past registration the worker's own secret
	post := func(path string, in, out any) error {
		b, _ := json.Marshal(in)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", path, resp.Status)
		}
		return json.NewDecoder(resp.Body).Decode(out)
	}
	var reg workerapi.RegisterResponse
	if err := post("/internal/v1/workers/register", workerapi.RegisterRequest{ID: "w1", DataPlaneURL: "http://127.0.0.1:1",
		Runtimes: []string{"gvisor"}, CapacityMiB: 1 << 20, CapacityVCPUs: 1024, Templates: []model.Template{tpl}}, &reg); err != nil {
		t.Fatalf("register: %v", err)
	}
	bearer = reg.WorkerSecret
	wg.Add(2)
	go func() { defer wg.Done(); ctrl.Run(ctx) }()
	go func() {
		defer wg.Done()
		version := int64(-1)
		var observed []workerapi.Observed
		for ctx.Err() == nil {
			path := "/internal/v1/workers/w1/sync?wait=5s"
			if version >= 0 {
				path += fmt.Sprintf("&version=%d", version)
			}
			var resp workerapi.SyncResponse
			if err := post(path, workerapi.SyncRequest{Observed: observed}, &resp); err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			version = resp.Version
			observed = observed[:0]
			for _, a := range resp.Assignments {
				o := workerapi.Observed{SandboxID: a.Sandbox.ID, State: a.Desired}
				if a.Desired == model.StateSuspended {
					e.mu.Lock()
					fail := e.failSuspend
					e.mu.Unlock()
					if fail != "" {
						o.State, o.Reason = a.Sandbox.State, fail
						if o.State == model.StateSuspending {
							o.State = model.StateRunning
						}
					} else {
						o.SnapshotID, o.SnapshotBytes = "snap-"+a.Sandbox.ID, 3<<20
					}
				}
				observed = append(observed, o)
			}
		}
	}()
	return e
}

func TestSandboxLifecycleCommands(t *testing.T) {
	e := newLifecycleEnv(t)
	id := strings.TrimSpace(e.mustRun("sandbox", "create", "--idle-suspend-after", "0", "--no-auto-wake"))
	sb := decodeJSON[model.Sandbox](t, e.mustRun("sandbox", "get", id, "--json"))
	if sb.State != model.StateRunning || sb.IdleSuspendS != 0 || !sb.NoAutoWake {
		t.Fatalf("created: state %s idle %d no_auto_wake %v", sb.State, sb.IdleSuspendS, sb.NoAutoWake)
	}

	res := decodeJSON[createResult](t, e.mustRun("sandbox", "pause", id, "--json"))
	if res.Sandbox.State != model.StatePaused || res.Operation.Kind != model.OpPause || res.Operation.State != model.OpSucceeded {
		t.Fatalf("pause --json: sandbox %s, op %s %s", res.Sandbox.State, res.Operation.Kind, res.Operation.State)
	}
	code, _, errOut := e.run("sandbox", "pause", id)
	if code != ExitError || !strings.Contains(errOut, "already paused") {
		t.Fatalf("pause again: exit %d, %q", code, errOut)
	}
	out := e.mustRun("sandbox", "suspend", id)
	for _, want := range []string{id, "suspended", "Snapshot:", "3.0 MiB (snap-" + id + ")", "Idle suspend:", "never", "Auto-wake:", "off", "Last activity:"} {
		if !strings.Contains(out, want) {
			t.Errorf("suspend output lacks %q:\n%s", want, out)
		}
	}
	code, _, errOut = e.run("sandbox", "resume", id)
	if code != ExitError || !strings.Contains(errOut, "wake it instead of resuming") {
		t.Fatalf("resume a suspended sandbox: exit %d, %q", code, errOut)
	}
	if out := e.mustRun("sandbox", "wake", id); !strings.Contains(out, "running") {
		t.Fatalf("wake:\n%s", out)
	}
	e.mustRun("sandbox", "pause", id)
	if out := e.mustRun("sandbox", "resume", id); !strings.Contains(out, "running") {
		t.Fatalf("resume:\n%s", out)
	}

	// --no-wait prints the operation id; op wait <sandbox> waits until it settles.
	opID := strings.TrimSpace(e.mustRun("sandbox", "suspend", id, "--no-wait"))
	if !strings.HasPrefix(opID, "op-") {
		t.Fatalf("suspend --no-wait printed %q", opID)
	}
	if out := e.mustRun("op", "wait", id); strings.TrimSpace(out) != id+" suspended" {
		t.Fatalf("op wait %s: %q", id, out)
	}
	if out := e.mustRun("op", "wait", opID); !strings.Contains(out, "succeeded") {
		t.Fatalf("op wait %s: %q", opID, out)
	}

	// A failed suspend: exit 1 with the reason; the sandbox keeps running.
	e.mustRun("sandbox", "wake", id)
	e.mu.Lock()
	e.failSuspend = "no space left on device"
	e.mu.Unlock()
	code, _, errOut = e.run("sandbox", "suspend", id)
	if code != ExitError || !strings.Contains(errOut, "suspend failed: no space left on device") {
		t.Fatalf("failed suspend: exit %d, %q", code, errOut)
	}
	if sb := decodeJSON[model.Sandbox](t, e.mustRun("sandbox", "get", id, "--json")); sb.State != model.StateRunning || sb.DesiredState != model.StateRunning {
		t.Fatalf("after a failed suspend: state %s desired %s", sb.State, sb.DesiredState)
	}
	if code, _, errOut := e.run("sandbox", "wake"); code != ExitUsage || !strings.Contains(errOut, "sandbox id") {
		t.Fatalf("wake without an id: exit %d, %q", code, errOut)
	}
}

func TestOrgSetAndGet(t *testing.T) {
	e := newAPIEnv(t)
	org := decodeJSON[model.Org](t, e.mustRun("org", "create", "acme", "--json"))
	out := e.mustRun("org", "set", org.ID, "--features", "snapshots", "--idle-suspend-after", "90m")
	for _, want := range []string{org.ID, "acme", "snapshots", "after 1h30m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("org set output lacks %q:\n%s", want, out)
		}
	}
	got := decodeJSON[model.Org](t, e.mustRun("org", "get", org.ID, "--json"))
	if len(got.Features) != 1 || got.Features[0] != "snapshots" || got.IdleSuspendS == nil || *got.IdleSuspendS != 5400 {
		t.Fatalf("org get: %+v", got)
	}
	got = decodeJSON[model.Org](t, e.mustRun("org", "set", org.ID, "--idle-suspend-after", "0", "--json"))
	if got.IdleSuspendS == nil || *got.IdleSuspendS != 0 || len(got.Features) != 1 {
		t.Fatalf("org set idle 0: %+v", got)
	}
	got = decodeJSON[model.Org](t, e.mustRun("org", "set", org.ID, "--features", "", "--idle-suspend-after", "default", "--json"))
	if got.IdleSuspendS != nil || len(got.Features) != 0 {
		t.Fatalf("org set reset: %+v", got)
	}
	if out := e.mustRun("org", "get", org.ID); !strings.Contains(out, "default (after 6h0m0s)") {
		t.Fatalf("org get:\n%s", out)
	}
	if code, _, errOut := e.run("org", "set", org.ID, "--features", "warp"); code != ExitError || !strings.Contains(errOut, "unknown feature \"warp\"") {
		t.Fatalf("unknown feature: exit %d, %q", code, errOut)
	}
	if code, _, errOut := e.run("org", "set", org.ID); code != ExitUsage || !strings.Contains(errOut, "nothing to change") {
		t.Fatalf("nothing to set: exit %d, %q", code, errOut)
	}
	if code, _, _ := e.run("org", "set", org.ID, "--idle-suspend-after", "soon"); code != ExitUsage {
		t.Fatalf("bad duration: exit %d", code)
	}
	// A new sandbox of the default org picks up the org setting.
	e.mustRun("org", "set", "org-default", "--idle-suspend-after", "2h")
	sb := decodeJSON[createResult](t, e.mustRun("sandbox", "create", "--no-wait", "--json")).Sandbox
	if sb.IdleSuspendS != 7200 {
		t.Fatalf("sandbox idle %d, want the org's 7200", sb.IdleSuspendS)
	}
}
