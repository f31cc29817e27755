package daemon

// The whole stack of `airlock up` in one test process, with the worker's
// runtime the fake one (internal/runtime/fake): the REST API, the service,
// the controller and the worker API on SQLite, a real worker with its data
// plane and snapshot store. No root, runsc or agent build, so it runs in
// the fast tier (go test -short); internal/e2e runs the same flows as
// separate processes over real runsc in the full suite.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
	airruntime "github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/store/sqlstore"
	"github.com/airlock/airlock/internal/worker"

	"go.opentelemetry.io/otel/trace"
)

// fakeStack is a server and one in-process worker over the fake runtime.
type fakeStack struct {
	c   *client.Client
	url string // the server's
	drv *fake.Driver
	srv *server
}

// startFakeStack wires what `airlock up` wires (newServer, the admin key,
// a registered worker) with the fake runtime in place of gVisor; opts
// adjust the worker's config.
func startFakeStack(t *testing.T, opts ...func(*worker.Config)) *fakeStack {
	t.Helper()
	return startFakeStackTraced(t, nil, opts...)
}

// startFakeStackTraced is startFakeStack with the server's tracer provider
// tp (the worker's is opts' business: worker.Config.Tracer).
func startFakeStackTraced(t *testing.T, tp trace.TracerProvider, opts ...func(*worker.Config)) *fakeStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	log := newLogger("error")
	now := time.Now
	st, err := sqlite.Open(ctx, filepath.Join(dir, "airlock.db"), sqlstore.WithClock(now))
	if err != nil {
		t.Fatal(err)
	}
	const workerToken = "fake-stack-worker-token"
	srv, err := newServer(ctx, st, workerToken, 0, log, now, tp, "")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	errc := make(chan error, 2)
	go func() { errc <- srv.serve(ctx, ln) }()
	if err := ensureAdminKey(ctx, srv.svc, dir, io.Discard); err != nil {
		t.Fatal(err)
	}

	drv := fake.New(log)
	const workerID = "w-fake"
	started := time.Now()
	wcfg := fakeWorkerConfig(t, dir, workerID, url, workerToken, drv, log)
	for _, o := range opts {
		o(&wcfg)
	}
	w, err := worker.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	srv.setLocalWorker(workerID, w.Handler())
	go func() { errc <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		// The server and the worker return once ctx ends.
		for range 2 {
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("stack: %v", err)
			}
		}
		st.Close()
	})
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	if err := waitReady(rctx, srv.ctrl, st, workerID, started, errc); err != nil {
		t.Fatalf("the stack never became ready: %v", err)
	}
	return &fakeStack{c: client.New(url, readTrim(filepath.Join(dir, "admin.key"))), url: url, drv: drv, srv: srv}
}

// sh runs script in sandbox id through the API and the worker's data plane.
func (s *fakeStack) sh(t *testing.T, ctx context.Context, id, script string) (string, int) {
	t.Helper()
	cmd, err := s.c.CreateCommand(ctx, id, client.CreateCommandRequest{Argv: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatalf("create command %q: %v", script, err)
	}
	var out, errb bytes.Buffer
	exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, &out, &errb)
	if err != nil {
		t.Fatalf("run %q: %v (stderr %q)", script, err, errb.String())
	}
	return out.String(), exit.ExitCode
}

// do requests a lifecycle change and waits for its operation to succeed,
// then for the sandbox to be in state want.
func (s *fakeStack) do(t *testing.T, ctx context.Context, what, id string, req func(context.Context, string) (model.Operation, error), want model.SandboxState) {
	t.Helper()
	op, err := req(ctx, id)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if op, err = s.c.WaitOperation(ctx, op.ID); err != nil || op.State != model.OpSucceeded {
		t.Fatalf("%s: %v %+v", what, err, op)
	}
	if sb, err := s.c.GetSandbox(ctx, id); err != nil || sb.State != want {
		t.Fatalf("after %s: %v, state %s, want %s", what, err, sb.State, want)
	}
}

// TestUpOnFakeRuntime is create, commands, files, pause, suspend and wake
// (files kept), and delete, through the REST client against the stack of
// `airlock up` — service, controller, worker API and worker on SQLite —
// over the fake runtime.
func TestUpOnFakeRuntime(t *testing.T) {
	s := startFakeStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	sb, op, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name, Resources: model.Resources{VCPUs: 1, MemoryMiB: 256}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if op, err = s.c.WaitOperation(ctx, op.ID); err != nil || op.State != model.OpSucceeded {
		t.Fatalf("create: %v %+v", err, op)
	}
	if got, err := s.c.GetSandbox(ctx, sb.ID); err != nil || got.State != model.StateRunning || got.Runtime != fake.Name {
		t.Fatalf("created sandbox: %v %+v, want running on %s", err, got, fake.Name)
	}
	if out, code := s.sh(t, ctx, sb.ID, "echo hello; exit 7"); out != "hello\n" || code != 7 {
		t.Errorf("command: %q exit %d, want hello and 7", out, code)
	}

	f, err := s.c.Files(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(ctx, "notes.txt", strings.NewReader("kept\n"), "", ""); err != nil {
		t.Fatal(err)
	}
	if out, _ := s.sh(t, ctx, sb.ID, "cat notes.txt"); out != "kept\n" {
		t.Errorf("file written through the file API, read by a command: %q", out)
	}

	s.do(t, ctx, "pause", sb.ID, s.c.PauseSandbox, model.StatePaused)
	s.do(t, ctx, "resume", sb.ID, s.c.ResumeSandbox, model.StateRunning)
	s.do(t, ctx, "suspend", sb.ID, s.c.SuspendSandbox, model.StateSuspended)
	if ids, err := s.drv.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("runtime sandboxes while suspended: %v %v, want none", ids, err)
	}
	s.do(t, ctx, "wake", sb.ID, s.c.WakeSandbox, model.StateRunning)
	if out, _ := s.sh(t, ctx, sb.ID, "cat notes.txt"); out != "kept\n" {
		t.Errorf("file after suspend and wake: %q", out)
	}

	s.do(t, ctx, "delete", sb.ID, s.c.DeleteSandbox, model.StateDeleted)
	if ids, err := s.drv.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("runtime sandboxes after delete: %v %v, want none", ids, err)
	}
}

// TestCheckpointsOnFakeRuntime is the "snapshots" feature through the same
// stack: a checkpoint that leaves the sandbox running, a rollback to it,
// forks from it, and an export imported as a new sandbox, each seeing the
// files of the checkpoint.
func TestCheckpointsOnFakeRuntime(t *testing.T) {
	s := startFakeStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	features := []string{model.FeatureSnapshots}
	if _, err := s.c.UpdateOrg(ctx, "org-default", client.UpdateOrgRequest{Features: &features}); err != nil {
		t.Fatal(err)
	}
	wait := func(what string, op model.Operation, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if op, err = s.c.WaitOperation(ctx, op.ID); err != nil || op.State != model.OpSucceeded {
			t.Fatalf("%s: %v %+v", what, err, op)
		}
	}
	put := func(id, content string) {
		t.Helper()
		f, err := s.c.Files(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(ctx, "state.txt", strings.NewReader(content), "", ""); err != nil {
			t.Fatal(err)
		}
	}
	sees := func(what, id, want string) {
		t.Helper()
		if out, _ := s.sh(t, ctx, id, "cat state.txt"); out != want {
			t.Errorf("%s: state.txt is %q, want %q", what, out, want)
		}
	}

	sb, op, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: fake.Name, Resources: model.Resources{VCPUs: 1, MemoryMiB: 256}}, "")
	wait("create", op, err)
	put(sb.ID, "one\n")
	op, err = s.c.CreateCheckpoint(ctx, sb.ID, "c1")
	wait("checkpoint", op, err)
	if got, err := s.c.GetSandbox(ctx, sb.ID); err != nil || got.State != model.StateRunning {
		t.Fatalf("after a checkpoint: %v %s, want still running", err, got.State)
	}
	if cps, err := s.c.ListCheckpoints(ctx, sb.ID); err != nil || len(cps) != 1 || cps[0].Name != "c1" {
		t.Fatalf("checkpoints: %v %+v, want c1", err, cps)
	}
	put(sb.ID, "two\n")
	sees("before the rollback", sb.ID, "two\n")
	op, err = s.c.RollbackSandbox(ctx, sb.ID, "c1")
	wait("rollback", op, err)
	sees("after the rollback", sb.ID, "one\n")

	forks, err := s.c.ForkSandbox(ctx, client.CreateSandboxRequest{FromCheckpoint: &client.CheckpointRef{SandboxID: sb.ID, Checkpoint: "c1"}, Count: 2}, "")
	if err != nil || len(forks) != 2 {
		t.Fatalf("fork: %v, %d forks, want 2", err, len(forks))
	}
	for _, f := range forks {
		wait("fork "+f.Sandbox.ID, f.Operation, nil)
		sees("fork "+f.Sandbox.ID, f.Sandbox.ID, "one\n")
	}

	var archive bytes.Buffer
	if _, err := s.c.ExportCheckpoint(ctx, sb.ID, "c1", &archive); err != nil {
		t.Fatal(err)
	}
	imported, op, err := s.c.ImportSandbox(ctx, client.CreateSandboxRequest{}, &archive)
	wait("import", op, err)
	sees("imported", imported.ID, "one\n")

	for _, id := range []string{sb.ID, forks[0].Sandbox.ID, forks[1].Sandbox.ID, imported.ID} {
		op, err := s.c.DeleteSandbox(ctx, id)
		wait("delete "+id, op, err)
	}
	if ids, err := s.drv.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("runtime sandboxes after the deletes: %v %v, want none", ids, err)
	}
}

// fakeWorkerConfig is the config of a worker with the fake runtime drv,
// one template (a root with an agent where the fake looks for one), its
// state under dir and its data plane on a loopback port, registering with
// the server(s) at serverURL.
func fakeWorkerConfig(t *testing.T, dir, workerID, serverURL, workerToken string, drv *fake.Driver, log *slog.Logger) worker.Config {
	t.Helper()
	root := filepath.Join(dir, "template")
	if err := os.MkdirAll(filepath.Join(root, "usr", "local", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr", "local", "bin", "airlock-agent"), []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("fake base template"))
	tmpl := model.Template{Name: "base", Tag: "latest", Digest: "sha256:" + hex.EncodeToString(sum[:]), SizeBytes: 1 << 20}
	snaps, err := snapshot.Open(filepath.Join(dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	dl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return worker.Config{
		ID: workerID, ServerURL: serverURL, WorkerToken: workerToken, SecretFile: filepath.Join(dir, "worker.secret"),
		DataPlaneListener: dl, DataPlaneURL: "http://" + dl.Addr().String(),
		Driver:    &airruntime.Multi{Drivers: map[string]airruntime.Driver{fake.Name: drv}, Default: fake.Name},
		Snapshots: snaps,
		Templates: func() ([]model.Template, error) { return []model.Template{tmpl}, nil },
		RootFS: func(digest string) string {
			if digest == tmpl.Digest {
				return root
			}
			return ""
		},
		CapacityMiB: 4096, CapacityVCPUs: 4,
		Logger: log.With("component", "worker"),
	}
}
