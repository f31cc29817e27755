package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// snapAPI is a fake of the snapshot endpoints (no server packages): it
// answers like the real API and finishes every operation at once, except
// those of sandboxes named in failOps.
type snapAPI struct {
	t   *testing.T
	url string

	mu        sync.Mutex
	sandboxes map[string]*model.Sandbox
	ops       map[string]model.Operation
	failOps   map[string]string // sandbox id → reason its operations fail with
	gateOff   bool
	archive   []byte         // what export serves
	lastReq   map[string]any // the last create request (JSON) by path
	imported  []byte         // the archive the last import sent
	importReq apitypes.CreateSandboxRequest
	n         int
}

func newSnapAPI(t *testing.T) *snapAPI {
	f := &snapAPI{t: t, sandboxes: map[string]*model.Sandbox{}, ops: map[string]model.Operation{},
		failOps: map[string]string{}, lastReq: map[string]any{}, archive: bytes.Repeat([]byte("tar!"), 100<<10)}
	f.sandboxes["sb-src"] = &model.Sandbox{ID: "sb-src", State: model.StateRunning, DesiredState: model.StateRunning, Template: "base"}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *snapAPI) reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (f *snapAPI) fail(w http.ResponseWriter, status int, code, msg string) {
	f.reply(w, status, apitypes.ErrorResponse{Error: apitypes.ErrorBody{Code: code, Message: msg}})
}

// newOp records an operation of sandbox id; locked.
func (f *snapAPI) newOp(id string, kind model.OperationKind) model.Operation {
	f.n++
	op := model.Operation{ID: fmt.Sprintf("op-%03d", f.n), SandboxID: id, Kind: kind, State: model.OpPending, Target: model.StateRunning}
	f.ops[op.ID] = op
	return op
}

// newSandbox records a pending sandbox; locked.
func (f *snapAPI) newSandbox() *model.Sandbox {
	f.n++
	sb := &model.Sandbox{ID: fmt.Sprintf("sb-%03d", f.n), State: model.StatePending, DesiredState: model.StateRunning, Template: "base"}
	f.sandboxes[sb.ID] = sb
	return sb
}

func (f *snapAPI) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer al_k" {
		f.fail(w, 401, apitypes.CodeUnauthorized, "bad key")
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/"), "/")
	if f.gateOff && parts[0] == "sandboxes" && (len(parts) > 2 || r.Method == http.MethodPost) {
		f.fail(w, 403, apitypes.CodeForbidden, `snapshots are off for org org-default: an operator turns them on with PATCH /v1/orgs/org-default {"features":["snapshots"]}`)
		return
	}
	switch {
	case r.Method == "GET" && parts[0] == "operations":
		op, ok := f.ops[parts[1]]
		if !ok {
			f.fail(w, 404, apitypes.CodeNotFound, "no operation")
			return
		}
		if reason, bad := f.failOps[op.SandboxID]; bad {
			op.State, op.Reason = model.OpFailed, reason
		} else {
			op.State = model.OpSucceeded
			if sb := f.sandboxes[op.SandboxID]; sb != nil {
				sb.State = model.StateRunning
			}
		}
		f.ops[op.ID] = op
		f.reply(w, 200, op)
	case r.Method == "GET" && len(parts) == 2:
		sb, ok := f.sandboxes[parts[1]]
		if !ok {
			f.fail(w, 404, apitypes.CodeNotFound, "sandbox "+parts[1]+" not found")
			return
		}
		f.reply(w, 200, sb)
	case r.Method == "POST" && len(parts) == 3 && parts[2] == "checkpoints":
		var req apitypes.CreateCheckpointRequest
		json.NewDecoder(r.Body).Decode(&req)
		sb := f.sandboxes[parts[1]]
		if _, taken := sb.FindCheckpoint(req.Name); taken {
			f.fail(w, 409, apitypes.CodeConflict, "sandbox "+sb.ID+" has a checkpoint named "+req.Name)
			return
		}
		sb.Checkpoints = append(sb.Checkpoints, model.Checkpoint{Name: req.Name, SnapshotID: "snap-" + req.Name, Bytes: 3 << 20, CreatedAt: time.Now().Add(-time.Minute)})
		f.reply(w, 202, apitypes.OperationResponse{Operation: f.newOp(sb.ID, model.OpCheckpoint)})
	case r.Method == "GET" && len(parts) == 3 && parts[2] == "checkpoints":
		f.reply(w, 200, apitypes.ListCheckpointsResponse{Checkpoints: f.sandboxes[parts[1]].Checkpoints})
	case r.Method == "POST" && len(parts) == 3 && parts[2] == "rollback":
		var req apitypes.RollbackRequest
		json.NewDecoder(r.Body).Decode(&req)
		if _, ok := f.sandboxes[parts[1]].FindCheckpoint(req.Checkpoint); !ok {
			f.fail(w, 404, apitypes.CodeNotFound, "sandbox "+parts[1]+" has no checkpoint "+req.Checkpoint)
			return
		}
		f.reply(w, 202, apitypes.OperationResponse{Operation: f.newOp(parts[1], model.OpRollback)})
	case r.Method == "GET" && len(parts) == 5 && parts[4] == "export":
		switch parts[3] {
		case "broken":
			// Headers, some bytes, then the connection drops.
			w.Header().Set("Content-Type", "application/x-tar")
			w.Header().Set("Content-Length", "100000")
			w.Write(f.archive[:100])
			w.(http.Flusher).Flush()
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		case "gone":
			f.fail(w, 404, apitypes.CodeNotFound, "sandbox "+parts[1]+" has no checkpoint gone")
		default:
			w.Header().Set("Content-Type", "application/x-tar")
			w.Header().Set("Content-Disposition", `attachment; filename="`+parts[1]+"-"+parts[3]+`.tar"`)
			w.Write(f.archive)
		}
	case r.Method == "POST" && len(parts) == 1:
		mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if mt == "multipart/form-data" {
			mr := multipart.NewReader(r.Body, params["boundary"])
			p, err := mr.NextPart()
			if err != nil || p.FormName() != "request" {
				f.fail(w, 400, apitypes.CodeBadRequest, "first part must be request")
				return
			}
			f.importReq = apitypes.CreateSandboxRequest{}
			json.NewDecoder(p).Decode(&f.importReq)
			p, err = mr.NextPart()
			if err != nil || p.FormName() != f.importReq.Import {
				f.fail(w, 400, apitypes.CodeBadRequest, "no archive part")
				return
			}
			f.imported, _ = io.ReadAll(p)
			if !bytes.HasPrefix(f.imported, []byte("tar!")) {
				f.fail(w, 422, apitypes.CodeUnprocessable, "archive: not a checkpoint archive (no manifest.json)")
				return
			}
			sb := f.newSandbox()
			f.reply(w, 202, apitypes.CreateSandboxResponse{Sandbox: *sb, Operation: f.newOp(sb.ID, model.OpCreate)})
			return
		}
		var req apitypes.CreateSandboxRequest
		json.NewDecoder(r.Body).Decode(&req)
		var raw map[string]any
		b, _ := json.Marshal(req)
		json.Unmarshal(b, &raw)
		f.lastReq["/v1/sandboxes"] = raw
		if req.FromCheckpoint == nil {
			f.fail(w, 422, apitypes.CodeUnprocessable, "this fake only forks")
			return
		}
		n := max(req.Count, 1)
		var res apitypes.CreateSandboxResponse
		for range n {
			sb := f.newSandbox()
			res.Forks = append(res.Forks, apitypes.CreateSandboxResponse{Sandbox: *sb, Operation: f.newOp(sb.ID, model.OpFork)})
		}
		res.Sandbox, res.Operation = res.Forks[0].Sandbox, res.Forks[0].Operation
		f.reply(w, 202, res)
	default:
		f.fail(w, 404, apitypes.CodeNotFound, "no route "+r.Method+" "+r.URL.Path)
	}
}

// run runs the CLI against the fake.
func (f *snapAPI) run(stdin string, args ...string) (code int, stdout, stderr string) {
	f.t.Helper()
	var out, errb bytes.Buffer
	env := map[string]string{"AIRLOCK_URL": f.url, "AIRLOCK_API_KEY": "al_k", "HOME": f.t.TempDir()}
	code = Main(context.Background(), args, Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }})
	return code, out.String(), errb.String()
}

func (f *snapAPI) must(args ...string) string {
	f.t.Helper()
	code, out, errOut := f.run("", args...)
	if code != 0 {
		f.t.Fatalf("airlock %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

func TestSnapshotCheckpointAndRollbackCommands(t *testing.T) {
	f := newSnapAPI(t)
	out := f.must("sandbox", "checkpoint", "sb-src", "c1")
	if !strings.Contains(out, "NAME") || !strings.Contains(out, "c1") || !strings.Contains(out, "3.0 MiB") {
		t.Errorf("checkpoint output %q", out)
	}
	var res checkpointResult
	if err := json.Unmarshal([]byte(f.must("sandbox", "checkpoint", "sb-src", "c2", "--json")), &res); err != nil ||
		res.Checkpoint == nil || res.Checkpoint.Name != "c2" || res.Operation.Kind != model.OpCheckpoint || res.Operation.State != model.OpSucceeded {
		t.Errorf("checkpoint --json: %+v, %v", res, err)
	}
	if out := f.must("sandbox", "checkpoint", "--no-wait", "sb-src", "c3"); !strings.HasPrefix(out, "op-") {
		t.Errorf("checkpoint --no-wait printed %q, want an operation id", out)
	}
	code, _, errOut := f.run("", "sandbox", "checkpoint", "sb-src", "c1")
	if code != ExitError || !strings.Contains(errOut, "has a checkpoint named c1") || !strings.Contains(errOut, "409") {
		t.Errorf("taken name: exit %d, stderr %q", code, errOut)
	}

	out = f.must("sandbox", "checkpoints", "sb-src")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "NAME") || !strings.Contains(lines[0], "SIZE") || !strings.Contains(lines[0], "CREATED") ||
		!strings.HasPrefix(lines[1], "c1 ") || !strings.HasPrefix(lines[3], "c3 ") || !strings.Contains(lines[1], "1m ago") {
		t.Errorf("checkpoints table:\n%s", out)
	}
	var cps []model.Checkpoint
	if err := json.Unmarshal([]byte(f.must("sandbox", "checkpoints", "sb-src", "--json")), &cps); err != nil || len(cps) != 3 || cps[1].SnapshotID != "snap-c2" {
		t.Errorf("checkpoints --json: %+v, %v", cps, err)
	}
	if out := f.must("sandbox", "get", "sb-src"); !strings.Contains(out, "Checkpoints:") || !strings.Contains(out, "c1, c2, c3") {
		t.Errorf("sandbox get lacks the checkpoints:\n%s", out)
	}

	out = f.must("sandbox", "rollback", "sb-src", "c1")
	if !strings.Contains(out, "ID:") || !strings.Contains(out, "sb-src") || !strings.Contains(out, "running") {
		t.Errorf("rollback output %q", out)
	}
	if out := f.must("sandbox", "rollback", "sb-src", "c2", "--no-wait"); !strings.HasPrefix(out, "op-") {
		t.Errorf("rollback --no-wait printed %q", out)
	}
	code, _, errOut = f.run("", "sandbox", "rollback", "sb-src", "nope")
	if code != ExitError || !strings.Contains(errOut, "no checkpoint nope") {
		t.Errorf("rollback to an unknown checkpoint: exit %d, stderr %q", code, errOut)
	}
	f.mu.Lock()
	f.failOps["sb-src"] = "rollback failed: runsc restore: boom"
	f.mu.Unlock()
	code, _, errOut = f.run("", "sandbox", "rollback", "sb-src", "c1")
	if code != ExitError || !strings.Contains(errOut, "runsc restore: boom") {
		t.Errorf("failed rollback: exit %d, stderr %q", code, errOut)
	}

	f.mu.Lock()
	f.gateOff = true
	f.mu.Unlock()
	for _, args := range [][]string{
		{"sandbox", "checkpoint", "sb-src", "c9"},
		{"sandbox", "checkpoints", "sb-src"},
		{"sandbox", "rollback", "sb-src", "c1"},
		{"sandbox", "fork", "sb-src", "c1"},
		{"sandbox", "export", "sb-src", "c1", "-o", "-"},
	} {
		code, _, errOut := f.run("", args...)
		if code != ExitError || !strings.Contains(errOut, "snapshots") || !strings.Contains(errOut, "403") {
			t.Errorf("%v with the gate off: exit %d, stderr %q", args, code, errOut)
		}
	}
}

func TestSnapshotForkCommand(t *testing.T) {
	f := newSnapAPI(t)
	out := f.must("sandbox", "fork", "sb-src", "c1", "--count", "3", "--env", "A=1", "--metadata", "job=7", "--idle-suspend-after", "0", "--timeout", "60")
	ids := strings.Fields(out)
	if len(ids) != 3 || !slices.IsSorted(ids) || !strings.HasPrefix(ids[0], "sb-") {
		t.Fatalf("fork printed %q, want 3 sandbox ids", out)
	}
	f.mu.Lock()
	req := f.lastReq["/v1/sandboxes"].(map[string]any)
	f.mu.Unlock()
	want := map[string]any{
		"from_checkpoint": map[string]any{"sandbox_id": "sb-src", "checkpoint": "c1"}, "count": 3.0,
		"env": map[string]any{"A": "1"}, "metadata": map[string]any{"job": "7"}, "idle_suspend_after_s": 0.0, "timeout_s": 60.0,
	}
	if b1, b2 := mustJSON(t, req), mustJSON(t, want); b1 != b2 {
		t.Errorf("fork request %s, want %s", b1, b2)
	}
	for _, id := range ids {
		f.mu.Lock()
		st := f.sandboxes[id].State
		f.mu.Unlock()
		if st != model.StateRunning {
			t.Errorf("fork %s printed before its operation finished (state %s)", id, st)
		}
	}

	// One fork: no count in the request; --json lists it.
	var res []createResult
	if err := json.Unmarshal([]byte(f.must("sandbox", "fork", "sb-src", "c1", "--json")), &res); err != nil || len(res) != 1 ||
		res[0].Operation.Kind != model.OpFork || res[0].Operation.State != model.OpSucceeded || res[0].Sandbox.State != model.StateRunning {
		t.Errorf("fork --json: %+v, %v", res, err)
	}
	f.mu.Lock()
	_, hasCount := f.lastReq["/v1/sandboxes"].(map[string]any)["count"]
	f.mu.Unlock()
	if hasCount {
		t.Errorf("fork without --count sent a count")
	}

	// --no-wait: ids at once.
	out = f.must("sandbox", "fork", "sb-src", "c1", "--count", "2", "--no-wait")
	for _, id := range strings.Fields(out) {
		f.mu.Lock()
		st := f.sandboxes[id].State
		f.mu.Unlock()
		if st != model.StatePending {
			t.Errorf("--no-wait waited for %s (state %s)", id, st)
		}
	}

	// A failed fork: the others are printed, the failure explained, exit 1.
	f.mu.Lock()
	next := fmt.Sprintf("sb-%03d", f.n+3) // the second fork of the next request (sandbox, operation, sandbox)
	f.failOps[next] = "restore failed: out of memory"
	f.mu.Unlock()
	code, out, errOut := f.run("", "sandbox", "fork", "sb-src", "c1", "--count", "2")
	if code != ExitError || !strings.Contains(errOut, "out of memory") || !strings.Contains(errOut, next) || len(strings.Fields(out)) != 1 || strings.Contains(out, next) {
		t.Errorf("failed fork: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSnapshotExportImportCommands(t *testing.T) {
	f := newSnapAPI(t)
	dir := t.TempDir()
	t.Chdir(dir)

	// Default name in the working directory; the path is printed.
	out := f.must("sandbox", "export", "sb-src", "c1")
	if strings.TrimSpace(out) != "sb-src-c1.tar" {
		t.Errorf("export printed %q", out)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "sb-src-c1.tar")); err != nil || !bytes.Equal(b, f.archive) {
		t.Fatalf("exported file: %d bytes, %v", len(b), err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "sb-src-c1.tar")); st.Mode().Perm() != 0o600 {
		t.Errorf("exported file mode %v, want 0600", st.Mode().Perm())
	}
	// -o FILE, -o DIR, -o -.
	f.must("sandbox", "export", "sb-src", "c1", "-o", "x.tar")
	if b, _ := os.ReadFile("x.tar"); !bytes.Equal(b, f.archive) {
		t.Errorf("-o x.tar: %d bytes", len(b))
	}
	os.Mkdir("sub", 0o755)
	f.must("sandbox", "export", "-o", "sub", "sb-src", "c2")
	if b, _ := os.ReadFile(filepath.Join("sub", "sb-src-c2.tar")); !bytes.Equal(b, f.archive) {
		t.Errorf("-o sub: %d bytes", len(b))
	}
	if out := f.must("sandbox", "export", "sb-src", "c1", "-o", "-"); out != string(f.archive) {
		t.Errorf("-o -: %d bytes on stdout", len(out))
	}

	// A failed export leaves no file behind, nor a temporary one, and an
	// existing file untouched.
	before := listDir(t, dir)
	code, _, errOut := f.run("", "sandbox", "export", "sb-src", "broken")
	if code != ExitError || !strings.Contains(errOut, "export checkpoint broken of sb-src") {
		t.Errorf("broken export: exit %d, stderr %q", code, errOut)
	}
	os.WriteFile("keep.tar", []byte("old"), 0o644)
	before = append(before, "keep.tar")
	slices.Sort(before)
	if code, _, errOut = f.run("", "sandbox", "export", "sb-src", "gone", "-o", "keep.tar"); code != ExitError || !strings.Contains(errOut, "no checkpoint gone") {
		t.Errorf("export of a missing checkpoint: exit %d, stderr %q", code, errOut)
	}
	if b, _ := os.ReadFile("keep.tar"); string(b) != "old" {
		t.Errorf("a failed export changed the existing file: %q", b)
	}
	if after := listDir(t, dir); !slices.Equal(after, before) {
		t.Errorf("files after failed exports %v, want %v", after, before)
	}

	// Import from a file and from stdin.
	out = f.must("sandbox", "import", "x.tar", "--env", "K=v", "--metadata", "from=x", "--no-auto-wake")
	id := strings.TrimSpace(out)
	f.mu.Lock()
	sb, req, got := f.sandboxes[id], f.importReq, f.imported
	f.mu.Unlock()
	if sb == nil || sb.State != model.StateRunning {
		t.Fatalf("import printed %q; sandbox %+v", out, sb)
	}
	if !bytes.Equal(got, f.archive) || req.Import != "archive" || req.Env["K"] != "v" || req.Metadata["from"] != "x" || req.AutoWake == nil || *req.AutoWake {
		t.Errorf("import sent request %+v and %d archive bytes", req, len(got))
	}
	code, out, errOut = f.run(string(f.archive), "sandbox", "import", "-", "--no-wait")
	if code != 0 || !strings.HasPrefix(out, "sb-") {
		t.Fatalf("import -: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	f.mu.Lock()
	st := f.sandboxes[strings.TrimSpace(out)].State
	f.mu.Unlock()
	if st != model.StatePending {
		t.Errorf("import --no-wait waited (state %s)", st)
	}
	code, _, errOut = f.run("not an archive", "sandbox", "import", "-")
	if code != ExitError || !strings.Contains(errOut, "not a checkpoint archive") || !strings.Contains(errOut, "import stdin") {
		t.Errorf("bad archive: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = f.run("", "sandbox", "import", "missing.tar")
	if code != ExitError || !strings.Contains(errOut, "missing.tar") {
		t.Errorf("missing file: exit %d, stderr %q", code, errOut)
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

func TestSnapshotCommandsUsage(t *testing.T) {
	tests := []struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{args: []string{"help"}, wantStdout: "sandbox checkpoints"},
		{args: []string{"help"}, wantStdout: "sandbox import"},
		{args: []string{"sandbox", "fork", "-h"}, wantStdout: "-count"},
		{args: []string{"sandbox", "export", "-h"}, wantStdout: "Usage: airlock sandbox export <sandbox-id> <checkpoint> [-o FILE|-]"},
		{args: []string{"sandbox", "checkpoint", "sb-1"}, wantCode: ExitUsage, wantStderr: "want <sandbox-id> <name>"},
		{args: []string{"sandbox", "checkpoints"}, wantCode: ExitUsage, wantStderr: "want exactly one sandbox id"},
		{args: []string{"sandbox", "rollback", "sb-1"}, wantCode: ExitUsage, wantStderr: "want <sandbox-id> <checkpoint>"},
		{args: []string{"sandbox", "fork", "sb-1", "c1", "--count", "0"}, wantCode: ExitUsage, wantStderr: "--count must be 1 … 32"},
		{args: []string{"sandbox", "fork", "sb-1", "c1", "--count", "33"}, wantCode: ExitUsage, wantStderr: "--count must be 1 … 32"},
		{args: []string{"sandbox", "fork", "sb-1", "c1", "--env", "X"}, wantCode: ExitUsage, wantStderr: "not KEY=VALUE"},
		{args: []string{"sandbox", "export", "sb-1"}, wantCode: ExitUsage, wantStderr: "want <sandbox-id> <checkpoint>"},
		{args: []string{"sandbox", "import"}, wantCode: ExitUsage, wantStderr: "want exactly one archive file"},
		{args: []string{"sandbox", "import", "a.tar", "b.tar"}, wantCode: ExitUsage, wantStderr: "want exactly one archive file"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			home := t.TempDir()
			code := Main(context.Background(), tt.args, Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
				if k == "HOME" {
					return home
				}
				return ""
			}})
			if code != tt.wantCode || !strings.Contains(out.String(), tt.wantStdout) || !strings.Contains(errb.String(), tt.wantStderr) {
				t.Errorf("exit %d (want %d), stdout %q (want %q), stderr %q (want %q)", code, tt.wantCode, out.String(), tt.wantStdout, errb.String(), tt.wantStderr)
			}
		})
	}
}
