package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/sqlite"
)

const testDigest = "sha256:2222222222222222222222222222222222222222222222222222222222222222"

// apiEnv is a real API server (real handler, service and SQLite store) on
// loopback. No worker runs: tests play the controller by finishing
// operations in the store (settle), as the real controller would.
type apiEnv struct {
	t   *testing.T
	ctx context.Context
	st  *sqlite.Store
	ev  *events.Log
	svc *service.Service
	url string
	key string // the bootstrap admin key
}

func newAPIEnv(t *testing.T) *apiEnv {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.PutTemplate(ctx, model.Template{Name: "base", Tag: "latest", Digest: testDigest, SizeBytes: 3 << 20, CreatedAt: time.Now()}); err != nil {
		t.Fatalf("put template: %v", err)
	}
	ev := events.New(st)
	svc := service.New(service.Config{Store: st, Events: ev})
	secret, _, err := svc.Bootstrap(ctx)
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	srv := httptest.NewServer(api.New(svc, api.Options{}))
	t.Cleanup(srv.Close)
	return &apiEnv{t: t, ctx: ctx, st: st, ev: ev, svc: svc, url: srv.URL, key: secret}
}

// run runs the CLI against the server with the admin key from the environment.
func (e *apiEnv) run(args ...string) (code int, stdout, stderr string) {
	return e.runKey(e.key, args...)
}

func (e *apiEnv) runKey(key string, args ...string) (code int, stdout, stderr string) {
	e.t.Helper()
	var out, errb bytes.Buffer
	env := map[string]string{"AIRLOCK_URL": e.url, "AIRLOCK_API_KEY": key, "HOME": e.t.TempDir()}
	code = Main(e.ctx, args, Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }})
	return code, out.String(), errb.String()
}

// mustRun runs args and fails the test unless the exit code is 0.
func (e *apiEnv) mustRun(args ...string) string {
	e.t.Helper()
	code, out, errOut := e.run(args...)
	if code != 0 {
		e.t.Fatalf("airlock %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

// settle finishes every open operation of sandbox id the way the controller
// would on success (state = target), or fails it with reason.
func (e *apiEnv) settle(id string, fail string) {
	e.t.Helper()
	ops, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: id, Open: true})
	if err != nil {
		e.t.Fatalf("list operations: %v", err)
	}
	for _, op := range ops {
		sb, err := e.st.GetSandbox(e.ctx, id)
		if err != nil {
			e.t.Fatalf("get sandbox: %v", err)
		}
		op.State, op.UpdatedAt = model.OpSucceeded, time.Now().UTC()
		sb.State = op.Target
		if fail != "" {
			op.State, op.Reason = model.OpFailed, fail
			sb.State, sb.Reason = model.StateFailed, fail
		}
		err = e.st.InTx(e.ctx, func(tx store.Tx) error {
			var err error
			if sb, err = tx.UpdateSandbox(e.ctx, sb); err != nil {
				return err
			}
			op, err = tx.UpdateOperation(e.ctx, op)
			return err
		})
		if err != nil {
			e.t.Fatalf("finish operation: %v", err)
		}
		e.ev.Sandbox(e.ctx, sb)
		e.ev.Operation(e.ctx, op)
	}
}

// settleSoon settles the next sandbox that appears with an open operation,
// from another goroutine, while the CLI waits.
func (e *apiEnv) settleSoon(fail string) chan string {
	done := make(chan string, 1)
	go func() {
		defer close(done)
		for range 500 {
			sbs, _, err := e.st.ListSandboxes(e.ctx, store.SandboxFilter{})
			if err == nil {
				for _, sb := range sbs {
					ops, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: sb.ID, Open: true})
					if err == nil && len(ops) > 0 {
						e.settle(sb.ID, fail)
						done <- sb.ID
						return
					}
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return done
}

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return v
}

func TestSandboxCreateWaitsAndPrintsJSON(t *testing.T) {
	e := newAPIEnv(t)
	settled := e.settleSoon("")
	out := e.mustRun("sandbox", "create", "--json", "--env", "A=1", "--metadata", "team=red", "--vcpus", "2", "--memory", "1024", "--timeout", "600")
	<-settled
	res := decodeJSON[createResult](t, out)
	sb, op := res.Sandbox, res.Operation
	if sb.State != model.StateRunning || op.State != model.OpSucceeded || op.Kind != model.OpCreate {
		t.Errorf("after waiting: sandbox %s, operation %s %s; want running, create succeeded", sb.State, op.Kind, op.State)
	}
	if sb.Env["A"] != "1" || sb.Metadata["team"] != "red" || sb.Resources != (model.Resources{VCPUs: 2, MemoryMiB: 1024, DiskMiB: 4096}) || sb.TimeoutS != 600 {
		t.Errorf("request not carried: env %v metadata %v resources %+v timeout %d", sb.Env, sb.Metadata, sb.Resources, sb.TimeoutS)
	}
	if sb.TemplateDigest != testDigest {
		t.Errorf("template digest %q", sb.TemplateDigest)
	}
}

func TestSandboxCreatePlainPrintsID(t *testing.T) {
	e := newAPIEnv(t)
	settled := e.settleSoon("")
	out := e.mustRun("sandbox", "create")
	id := <-settled
	if strings.TrimSpace(out) != id {
		t.Errorf("stdout %q, want the id %q", out, id)
	}
}

func TestSandboxCreateFailedOperation(t *testing.T) {
	e := newAPIEnv(t)
	settled := e.settleSoon("no worker has the template")
	code, _, errOut := e.run("sandbox", "create")
	<-settled
	if code != ExitError || !strings.Contains(errOut, "no worker has the template") {
		t.Errorf("exit %d, stderr %q; want 1 and the reason", code, errOut)
	}
}

func TestSandboxCreateNoWaitAndIdempotency(t *testing.T) {
	e := newAPIEnv(t)
	a := decodeJSON[createResult](t, e.mustRun("sandbox", "create", "--no-wait", "--json", "--idempotency-key", "k1"))
	b := decodeJSON[createResult](t, e.mustRun("sandbox", "create", "--no-wait", "--json", "--idempotency-key", "k1"))
	if a.Sandbox.ID == "" || a.Sandbox.ID != b.Sandbox.ID || a.Operation.ID != b.Operation.ID {
		t.Errorf("same idempotency key gave %s/%s and %s/%s", a.Sandbox.ID, a.Operation.ID, b.Sandbox.ID, b.Operation.ID)
	}
	if a.Operation.State != model.OpPending {
		t.Errorf("--no-wait returned operation %s, want pending", a.Operation.State)
	}
	code, _, errOut := e.run("sandbox", "create", "--template", "nosuch")
	if code != ExitError || !strings.Contains(errOut, "nosuch") {
		t.Errorf("unknown template: exit %d, stderr %q", code, errOut)
	}
	if strings.Contains(errOut, "airlock: airlock:") || strings.Count(errOut, "airlock: ") != 1 {
		t.Errorf("stderr repeats the prefix: %q", errOut)
	}
}

func TestSandboxListFollowsPages(t *testing.T) {
	e := newAPIEnv(t)
	const n = 103 // more than one default page of 100
	for i := range n {
		md := "odd"
		if i%2 == 0 {
			md = "even"
		}
		e.mustRun("sandbox", "create", "--no-wait", "--metadata", "parity="+md)
	}
	all := decodeJSON[[]model.Sandbox](t, e.mustRun("sandbox", "ls", "--json"))
	if len(all) != n {
		t.Fatalf("ls --json listed %d sandboxes, want %d", len(all), n)
	}
	seen := map[string]bool{}
	for _, sb := range all {
		if seen[sb.ID] {
			t.Fatalf("sandbox %s listed twice", sb.ID)
		}
		seen[sb.ID] = true
	}
	even := decodeJSON[[]model.Sandbox](t, e.mustRun("sandbox", "ls", "--metadata", "parity=even", "--json"))
	if len(even) != (n+1)/2 {
		t.Errorf("--metadata parity=even listed %d, want %d", len(even), (n+1)/2)
	}
	e.settle(all[0].ID, "")
	running := decodeJSON[[]model.Sandbox](t, e.mustRun("sandbox", "ls", "--state", "running", "--json"))
	if len(running) != 1 || running[0].ID != all[0].ID {
		t.Errorf("--state running listed %d sandboxes", len(running))
	}
	table := e.mustRun("sandbox", "ls", "--state", "running")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "STATE") ||
		!strings.HasPrefix(lines[1], all[0].ID) || !strings.Contains(lines[1], "running") {
		t.Errorf("table:\n%s", table)
	}
	if empty := e.mustRun("sandbox", "ls", "--json", "--state", "paused"); strings.TrimSpace(empty) != "[]" {
		t.Errorf("empty list printed %q, want []", empty)
	}
}

func TestSandboxGet(t *testing.T) {
	e := newAPIEnv(t)
	id := strings.TrimSpace(e.mustRun("sandbox", "create", "--no-wait"))
	e.settle(id, "")
	text := e.mustRun("sandbox", "get", id)
	for _, want := range []string{id, "running", "base", testDigest, "1 vCPU, 512 MiB", "Last activity"} {
		if !strings.Contains(text, want) {
			t.Errorf("sandbox get output lacks %q:\n%s", want, text)
		}
	}
	// --json after the id works too.
	sb := decodeJSON[model.Sandbox](t, e.mustRun("sandbox", "get", id, "--json"))
	if sb.ID != id || sb.State != model.StateRunning {
		t.Errorf("get --json: %+v", sb)
	}
	code, _, errOut := e.run("sandbox", "get", "sb-doesnotexist")
	if code != ExitError || !strings.Contains(errOut, "not found") {
		t.Errorf("missing sandbox: exit %d, stderr %q", code, errOut)
	}
}

// TestSandboxToken: `sandbox token` prints the traffic token the router
// accepts for the sandbox's ports; a sandbox created with
// --public-traffic has none, and the command says so.
func TestSandboxToken(t *testing.T) {
	e := newAPIEnv(t)
	id := strings.TrimSpace(e.mustRun("sandbox", "create", "--no-wait"))
	e.settle(id, "")
	tok := strings.TrimSpace(e.mustRun("sandbox", "token", id))
	sb, err := e.st.GetSandbox(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.svc.CheckTraffic(e.ctx, sb, tok); err != nil {
		t.Fatalf("the printed token %q is not accepted for the sandbox's ports: %v", tok, err)
	}
	if err := e.svc.CheckTraffic(e.ctx, sb, tok+"x"); err == nil {
		t.Fatal("CheckTraffic accepts any token: the check above proves nothing")
	}
	pub := strings.TrimSpace(e.mustRun("sandbox", "create", "--no-wait", "--public-traffic"))
	e.settle(pub, "")
	if sb, _ := e.st.GetSandbox(e.ctx, pub); !sb.PublicTraffic {
		t.Fatalf("--public-traffic not carried: %+v", sb)
	}
	code, _, errOut := e.run("sandbox", "token", pub)
	if code != ExitError || !strings.Contains(errOut, "public traffic") {
		t.Errorf("token of a public sandbox: exit %d, stderr %q", code, errOut)
	}
}

func TestSandboxRemove(t *testing.T) {
	e := newAPIEnv(t)
	id := strings.TrimSpace(e.mustRun("sandbox", "create", "--no-wait"))
	e.settle(id, "")
	settled := e.settleSoon("") // plays the controller once rm has asked
	out := e.mustRun("sandbox", "rm", id)
	if got := <-settled; got != id {
		t.Fatalf("settled %q, want %q", got, id)
	}
	if strings.TrimSpace(out) != id {
		t.Errorf("rm printed %q", out)
	}
	if got, _ := e.st.GetSandbox(e.ctx, id); got.State != model.StateDeleted {
		t.Errorf("state after rm: %s", got.State)
	}
	if code, _, errOut := e.run("sandbox", "rm", id); code != ExitError || !strings.Contains(errOut, "not found") {
		t.Errorf("second rm: exit %d, %q", code, errOut)
	}

	id2 := strings.TrimSpace(e.mustRun("sandbox", "create", "--no-wait"))
	e.settle(id2, "")
	op := decodeJSON[model.Operation](t, e.mustRun("sandbox", "rm", "--no-wait", "--json", id2))
	if op.Kind != model.OpDelete || op.State.Done() || op.SandboxID != id2 {
		t.Errorf("rm --no-wait: %+v", op)
	}
}

func TestOpCommands(t *testing.T) {
	e := newAPIEnv(t)
	res := decodeJSON[createResult](t, e.mustRun("sandbox", "create", "--no-wait", "--json"))
	id, opID := res.Sandbox.ID, res.Operation.ID

	text := e.mustRun("op", "get", opID)
	if !strings.Contains(text, "pending") || !strings.Contains(text, id) {
		t.Errorf("op get:\n%s", text)
	}
	settled := e.settleSoon("")
	op := decodeJSON[model.Operation](t, e.mustRun("op", "wait", opID, "--json"))
	<-settled
	if op.State != model.OpSucceeded {
		t.Errorf("op wait: %+v", op)
	}
	// A sandbox id: running with nothing in flight succeeds at once.
	if out := e.mustRun("op", "wait", id); !strings.Contains(out, "running") {
		t.Errorf("op wait <sandbox-id>: %q", out)
	}

	// A failed operation: exit 1 with the reason, for both forms.
	res2 := decodeJSON[createResult](t, e.mustRun("sandbox", "create", "--no-wait", "--json"))
	e.settle(res2.Sandbox.ID, "image pull exploded")
	for _, arg := range []string{res2.Operation.ID, res2.Sandbox.ID} {
		code, _, errOut := e.run("op", "wait", arg)
		if code != ExitError || !strings.Contains(errOut, "image pull exploded") {
			t.Errorf("op wait %s on failure: exit %d, stderr %q", arg, code, errOut)
		}
	}
	code, _, errOut := e.run("op", "get", "op-nope")
	if code != ExitError || !strings.Contains(errOut, "not found") {
		t.Errorf("op get missing: exit %d, %q", code, errOut)
	}
}

func TestOpWaitSandboxInFlight(t *testing.T) {
	e := newAPIEnv(t)
	id := strings.TrimSpace(e.mustRun("sandbox", "create", "--no-wait"))
	settled := e.settleSoon("")
	sb := decodeJSON[model.Sandbox](t, e.mustRun("op", "wait", "--json", id))
	<-settled
	if sb.State != model.StateRunning {
		t.Errorf("op wait <pending sandbox> returned state %s", sb.State)
	}
}

func TestTemplateList(t *testing.T) {
	e := newAPIEnv(t)
	ts := decodeJSON[[]model.Template](t, e.mustRun("template", "ls", "--json"))
	if len(ts) != 1 || ts[0].Name != "base" || ts[0].Digest != testDigest {
		t.Errorf("template ls --json: %+v", ts)
	}
	table := e.mustRun("template", "ls")
	if !strings.Contains(table, "NAME") || !strings.Contains(table, testDigest) || !strings.Contains(table, "3.0 MiB") {
		t.Errorf("template ls:\n%s", table)
	}
}

func TestOrgAndKeyCreate(t *testing.T) {
	e := newAPIEnv(t)
	org := decodeJSON[model.Org](t, e.mustRun("org", "create", "acme", "--json"))
	if org.Name != "acme" || org.ID == "" {
		t.Fatalf("org create: %+v", org)
	}
	secret := strings.TrimSpace(e.mustRun("key", "create", "--org", org.ID))
	if secret == "" {
		t.Fatal("key create printed no secret")
	}
	// The new key works, sees only its org, and may not create orgs.
	id := strings.TrimSpace(func() string {
		code, out, errOut := e.runKey(secret, "sandbox", "create", "--no-wait")
		if code != 0 {
			t.Fatalf("create with the new key: %d %q", code, errOut)
		}
		return out
	}())
	_, out, _ := e.runKey(secret, "sandbox", "ls", "--json")
	if l := decodeJSON[[]model.Sandbox](t, out); len(l) != 1 || l[0].ID != id || l[0].OrgID != org.ID {
		t.Errorf("org key lists %+v", l)
	}
	if code, _, errOut := e.runKey(secret, "org", "create", "evil"); code != ExitError || !strings.Contains(errOut, "admin") {
		t.Errorf("non-admin org create: exit %d, %q", code, errOut)
	}
	res := decodeJSON[apitypes.CreateKeyResponse](t, e.mustRun("key", "create", "--org", org.ID, "--admin", "--name", "ops", "--json"))
	if !res.Key.Admin || res.Key.Name != "ops" || res.Secret == "" {
		t.Errorf("key create --admin --json: %+v", res)
	}
	// --e2b issues an E2B-shaped key (for E2B_API_KEY) that works here too.
	e2bKey := strings.TrimSpace(e.mustRun("key", "create", "--org", org.ID, "--e2b"))
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(e2bKey) {
		t.Errorf("key create --e2b printed %q; want e2b_ and 40 hex characters", e2bKey)
	}
	if code, _, errOut := e.runKey(e2bKey, "sandbox", "ls"); code != 0 {
		t.Errorf("the e2b key on the native API: exit %d, %q", code, errOut)
	}
	if code, _, errOut := e.runKey("al_0000000000000000000000000000000000000000", "sandbox", "ls"); code != ExitError || errOut == "" {
		t.Errorf("bad key: exit %d, %q", code, errOut)
	}
}

func TestGlobalFlagsOverrideEnv(t *testing.T) {
	e := newAPIEnv(t)
	var out, errb bytes.Buffer
	// The environment points nowhere; the flags point at the server.
	env := map[string]string{"AIRLOCK_URL": "http://127.0.0.1:1", "AIRLOCK_API_KEY": "wrong", "HOME": t.TempDir()}
	for _, args := range [][]string{
		{"--url", e.url, "--api-key", e.key, "template", "ls"},
		{"template", "ls", "--url", e.url, "--api-key", e.key},
	} {
		out.Reset()
		errb.Reset()
		code := Main(e.ctx, args, Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }})
		if code != 0 || !strings.Contains(out.String(), "base") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out.String(), errb.String())
		}
	}
}
