package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
)

// fakeAPI serves one handler and records nothing itself; tests check the
// request inside the handler.
func fakeAPI(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return New(srv.URL, "al_test")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, apitypes.ErrorResponse{Error: apitypes.ErrorBody{Code: code, Message: msg}})
}

// checkCall fails the test unless r is method path with the test key.
func checkCall(t *testing.T, r *http.Request, method, path string) {
	t.Helper()
	if r.Method != method || r.URL.Path != path {
		t.Errorf("request %s %s, want %s %s", r.Method, r.URL.Path, method, path)
	}
	if got := r.Header.Get("Authorization"); got != "Bearer al_test" {
		t.Errorf("Authorization %q", got)
	}
}

func decodeBody[T any](t *testing.T, r *http.Request) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Errorf("decode request body: %v", err)
	}
	return v
}

func TestCreateListRollbackCheckpoints(t *testing.T) {
	ctx := t.Context()
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := fakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/sandboxes/sb-1/checkpoints":
			checkCall(t, r, "POST", "/v1/sandboxes/sb-1/checkpoints")
			if ct := r.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if req := decodeBody[apitypes.CreateCheckpointRequest](t, r); req.Name != "c1" {
				t.Errorf("checkpoint name %q", req.Name)
			}
			writeJSON(w, 202, apitypes.OperationResponse{Operation: model.Operation{ID: "op-1", Kind: model.OpCheckpoint, SandboxID: "sb-1", State: model.OpPending}})
		case "GET /v1/sandboxes/sb-1/checkpoints":
			checkCall(t, r, "GET", "/v1/sandboxes/sb-1/checkpoints")
			writeJSON(w, 200, apitypes.ListCheckpointsResponse{Checkpoints: []model.Checkpoint{
				{Name: "c1", SnapshotID: "snap-1", Bytes: 5 << 20, CreatedAt: created},
				{Name: "c2", SnapshotID: "snap-2", Bytes: 6 << 20, CreatedAt: created.Add(time.Minute)},
			}})
		case "POST /v1/sandboxes/sb-1/rollback":
			checkCall(t, r, "POST", "/v1/sandboxes/sb-1/rollback")
			if req := decodeBody[apitypes.RollbackRequest](t, r); req.Checkpoint != "c1" {
				t.Errorf("rollback checkpoint %q", req.Checkpoint)
			}
			writeJSON(w, 202, apitypes.OperationResponse{Operation: model.Operation{ID: "op-2", Kind: model.OpRollback, SandboxID: "sb-1", State: model.OpPending}})
		case "POST /v1/sandboxes/sb-2/checkpoints":
			writeErr(w, 409, apitypes.CodeConflict, "checkpoint c1 of sandbox sb-2 exists")
		case "GET /v1/sandboxes/sb-3/checkpoints":
			writeErr(w, 403, apitypes.CodeForbidden, `org org-x lacks the feature gate "snapshots"`)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
			writeErr(w, 404, apitypes.CodeNotFound, "no")
		}
	})
	op, err := c.CreateCheckpoint(ctx, "sb-1", "c1")
	if err != nil || op.ID != "op-1" || op.Kind != model.OpCheckpoint {
		t.Fatalf("CreateCheckpoint = %+v, %v", op, err)
	}
	cps, err := c.ListCheckpoints(ctx, "sb-1")
	if err != nil || len(cps) != 2 || cps[0].Name != "c1" || cps[0].Bytes != 5<<20 || !cps[0].CreatedAt.Equal(created) || cps[1].SnapshotID != "snap-2" {
		t.Fatalf("ListCheckpoints = %+v, %v", cps, err)
	}
	op, err = c.RollbackSandbox(ctx, "sb-1", "c1")
	if err != nil || op.ID != "op-2" || op.Kind != model.OpRollback {
		t.Fatalf("RollbackSandbox = %+v, %v", op, err)
	}

	_, err = c.CreateCheckpoint(ctx, "sb-2", "c1")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 409 || ae.Code != apitypes.CodeConflict || !strings.Contains(ae.Message, "exists") || !errors.Is(err, model.ErrConflict) {
		t.Fatalf("taken name: %v", err)
	}
	_, err = c.ListCheckpoints(ctx, "sb-3")
	if !errors.As(err, &ae) || ae.Status != 403 || !strings.Contains(ae.Message, "snapshots") || !errors.Is(err, model.ErrForbidden) {
		t.Fatalf("gate: %v", err)
	}
}

func TestForkSandbox(t *testing.T) {
	ctx := t.Context()
	c := fakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		checkCall(t, r, "POST", "/v1/sandboxes")
		req := decodeBody[apitypes.CreateSandboxRequest](t, r)
		if req.FromCheckpoint == nil || *req.FromCheckpoint != (apitypes.CheckpointRef{SandboxID: "sb-src", Checkpoint: "c1"}) {
			t.Errorf("from_checkpoint %+v", req.FromCheckpoint)
		}
		if req.Template != "" || req.Runtime != "" || req.Resources != (model.Resources{}) {
			t.Errorf("fork sends template/runtime/resources: %+v", req)
		}
		switch req.Count {
		case 3:
			if got := r.Header.Get("Idempotency-Key"); got != "k1" {
				t.Errorf("Idempotency-Key %q", got)
			}
			if req.Env["A"] != "1" || req.Metadata["m"] != "x" {
				t.Errorf("env %v metadata %v", req.Env, req.Metadata)
			}
			var res apitypes.CreateSandboxResponse
			for _, id := range []string{"sb-a", "sb-b", "sb-c"} {
				res.Forks = append(res.Forks, apitypes.CreateSandboxResponse{
					Sandbox:   model.Sandbox{ID: id, State: model.StatePending},
					Operation: model.Operation{ID: "op-" + id, Kind: model.OpFork, SandboxID: id},
				})
			}
			res.Sandbox, res.Operation = res.Forks[0].Sandbox, res.Forks[0].Operation
			writeJSON(w, 202, res)
		case 0:
			// A server that lists no forks for a single one.
			writeJSON(w, 202, apitypes.CreateSandboxResponse{Sandbox: model.Sandbox{ID: "sb-one"}, Operation: model.Operation{ID: "op-one", Kind: model.OpFork}})
		default:
			writeErr(w, 422, apitypes.CodeUnprocessable, "count must be 1 … 32")
		}
	})
	ref := &CheckpointRef{SandboxID: "sb-src", Checkpoint: "c1"}
	forks, err := c.ForkSandbox(ctx, CreateSandboxRequest{FromCheckpoint: ref, Count: 3, Env: map[string]string{"A": "1"}, Metadata: map[string]string{"m": "x"}}, "k1")
	if err != nil || len(forks) != 3 || forks[1].Sandbox.ID != "sb-b" || forks[2].Operation.ID != "op-sb-c" {
		t.Fatalf("ForkSandbox = %+v, %v", forks, err)
	}
	forks, err = c.ForkSandbox(ctx, CreateSandboxRequest{FromCheckpoint: ref}, "")
	if err != nil || len(forks) != 1 || forks[0].Sandbox.ID != "sb-one" || forks[0].Operation.ID != "op-one" {
		t.Fatalf("ForkSandbox without forks = %+v, %v", forks, err)
	}
	_, err = c.ForkSandbox(ctx, CreateSandboxRequest{FromCheckpoint: ref, Count: 99}, "")
	if !errors.Is(err, model.ErrUnprocessable) || !strings.Contains(err.Error(), "count") {
		t.Fatalf("count 99: %v", err)
	}
	if _, err := c.ForkSandbox(ctx, CreateSandboxRequest{}, ""); err == nil {
		t.Fatal("fork without FromCheckpoint: no error")
	}
}

func TestExportCheckpoint(t *testing.T) {
	ctx := t.Context()
	archive := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	c := fakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/sb-1/checkpoints/c1/export":
			checkCall(t, r, "GET", r.URL.Path)
			w.Header().Set("Content-Type", "application/x-tar")
			w.Header().Set("Content-Disposition", `attachment; filename="sb-1-c1.tar"`)
			// Chunked, in pieces, like a stream from the worker.
			for off := 0; off < len(archive); off += 100 << 10 {
				w.Write(archive[off:min(off+100<<10, len(archive))])
				w.(http.Flusher).Flush()
			}
		case "/v1/sandboxes/sb-1/checkpoints/nope/export":
			writeErr(w, 404, apitypes.CodeNotFound, "sandbox sb-1 has no checkpoint nope")
		case "/v1/sandboxes/sb-q/checkpoints/c1/export":
			writeErr(w, 409, apitypes.CodeConflict, "checkpoints are available on the gvisor runtime only for now")
		case "/v1/sandboxes/sb-1/checkpoints/short/export":
			// Promises more than it sends, then drops the connection.
			w.Header().Set("Content-Length", "1000")
			w.Write(archive[:10])
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		default:
			t.Errorf("unexpected %s", r.URL.Path)
		}
	})
	var buf bytes.Buffer
	n, err := c.ExportCheckpoint(ctx, "sb-1", "c1", &buf)
	if err != nil || n != int64(len(archive)) || !bytes.Equal(buf.Bytes(), archive) {
		t.Fatalf("ExportCheckpoint = %d, %v; %d bytes match: %v", n, err, buf.Len(), bytes.Equal(buf.Bytes(), archive))
	}

	buf.Reset()
	_, err = c.ExportCheckpoint(ctx, "sb-1", "nope", &buf)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Code != apitypes.CodeNotFound || !strings.Contains(ae.Message, "no checkpoint nope") || buf.Len() != 0 {
		t.Fatalf("unknown checkpoint: %v (wrote %d bytes)", err, buf.Len())
	}
	_, err = c.ExportCheckpoint(ctx, "sb-q", "c1", &buf)
	if !errors.Is(err, model.ErrConflict) || !strings.Contains(err.Error(), "gvisor") || buf.Len() != 0 {
		t.Fatalf("qemu: %v", err)
	}
	if _, err = c.ExportCheckpoint(ctx, "sb-1", "short", &buf); err == nil {
		t.Fatal("truncated export: no error")
	}
}

// gatedReader yields first, then blocks until release is closed before
// yielding rest: an import that buffered the archive before sending would
// never let the server see first.
type gatedReader struct {
	first, rest []byte
	release     chan struct{}
	stage       int
}

func (g *gatedReader) Read(p []byte) (int, error) {
	switch g.stage {
	case 0:
		g.stage++
		return copy(p, g.first), nil
	case 1:
		select {
		case <-g.release:
		case <-time.After(10 * time.Second):
			return 0, errors.New("the server never saw the first bytes: the archive is not streamed")
		}
		g.stage++
	}
	if len(g.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, g.rest)
	g.rest = g.rest[n:]
	return n, nil
}

func TestImportSandboxStreamsMultipart(t *testing.T) {
	ctx := t.Context()
	first, rest := []byte("manifest.json-header…"), bytes.Repeat([]byte("x"), 300<<10)
	archive := &gatedReader{first: first, rest: bytes.Clone(rest), release: make(chan struct{})}
	c := fakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		checkCall(t, r, "POST", "/v1/sandboxes")
		mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "multipart/form-data" {
			t.Errorf("Content-Type %q", r.Header.Get("Content-Type"))
			return
		}
		if r.ContentLength != -1 {
			t.Errorf("Content-Length %d: the body should stream (chunked)", r.ContentLength)
		}
		mr := multipart.NewReader(r.Body, params["boundary"])
		part, err := mr.NextPart()
		if err != nil || part.FormName() != "request" || part.Header.Get("Content-Type") != "application/json" {
			t.Errorf("first part: %v, %q, %q", err, part.FormName(), part.Header.Get("Content-Type"))
			return
		}
		var req apitypes.CreateSandboxRequest
		dec := json.NewDecoder(part)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			t.Errorf("request part: %v", err)
		}
		if req.Import != "archive" || req.Env["A"] != "1" || req.Metadata["m"] != "x" || req.TimeoutS != 60 || req.FromCheckpoint != nil || req.Template != "" {
			t.Errorf("request part %+v", req)
		}
		part, err = mr.NextPart()
		if err != nil || part.FormName() != req.Import {
			t.Errorf("second part: %v, name %q", err, part.FormName())
			return
		}
		got := make([]byte, len(first))
		if _, err := io.ReadFull(part, got); err != nil || !bytes.Equal(got, first) {
			t.Errorf("archive starts %q, %v", got, err)
		}
		close(archive.release)
		more, err := io.ReadAll(part)
		if err != nil || !bytes.Equal(more, rest) {
			t.Errorf("archive rest: %d bytes, %v", len(more), err)
		}
		if _, err := mr.NextPart(); err != io.EOF {
			t.Errorf("after the archive: %v, want EOF", err)
		}
		writeJSON(w, 202, apitypes.CreateSandboxResponse{
			Sandbox:   model.Sandbox{ID: "sb-new", State: model.StatePending},
			Operation: model.Operation{ID: "op-new", Kind: model.OpCreate, SandboxID: "sb-new"},
		})
	})
	sb, op, err := c.ImportSandbox(ctx, CreateSandboxRequest{Env: map[string]string{"A": "1"}, Metadata: map[string]string{"m": "x"}, TimeoutS: 60}, archive)
	if err != nil || sb.ID != "sb-new" || op.ID != "op-new" || op.Kind != model.OpCreate {
		t.Fatalf("ImportSandbox = %+v, %+v, %v", sb, op, err)
	}
}

// endless is an archive that never ends; it counts what was read.
type endless struct {
	mu sync.Mutex
	n  int
}

func (e *endless) Read(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n += len(p)
	return len(p), nil
}

func TestImportSandboxErrors(t *testing.T) {
	ctx := t.Context()
	c := fakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		// Answers after reading only the request part.
		_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		mr := multipart.NewReader(r.Body, params["boundary"])
		if part, err := mr.NextPart(); err == nil {
			io.Copy(io.Discard, part)
		}
		writeErr(w, 422, apitypes.CodeUnprocessable, "archive: manifest.json is not the first member")
	})
	// An early error answer ends the upload: ImportSandbox returns the
	// APIError and stops reading the archive.
	done := make(chan struct{})
	var err error
	arch := &endless{}
	go func() {
		defer close(done)
		_, _, err = c.ImportSandbox(ctx, CreateSandboxRequest{}, arch)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("ImportSandbox did not return after the server's error answer")
	}
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 422 || !strings.Contains(ae.Message, "manifest.json") || !errors.Is(err, model.ErrUnprocessable) {
		t.Fatalf("archive error: %v", err)
	}
	read := func() int {
		arch.mu.Lock()
		defer arch.mu.Unlock()
		return arch.n
	}
	n1 := read()
	time.Sleep(50 * time.Millisecond)
	if n2 := read(); n1 != n2 {
		t.Fatalf("the archive is still read after ImportSandbox returned (%d then %d bytes)", n1, n2)
	}

	gated := fakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, 403, apitypes.CodeForbidden, `the feature gate "snapshots" is off for org org-x`)
	})
	_, _, err = gated.ImportSandbox(ctx, CreateSandboxRequest{}, strings.NewReader("tar"))
	if !errors.Is(err, model.ErrForbidden) || !strings.Contains(err.Error(), "snapshots") {
		t.Fatalf("gate: %v", err)
	}

	// A failing archive read fails the import with the read error.
	whole := fakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeErr(w, 422, apitypes.CodeUnprocessable, "truncated archive")
	})
	_, _, err = whole.ImportSandbox(ctx, CreateSandboxRequest{}, io.MultiReader(strings.NewReader("some bytes"), errReader{}))
	if err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("archive read error: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }
