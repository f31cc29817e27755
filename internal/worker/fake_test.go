package worker

// The worker over the fake runtime (internal/runtime/fake): the reconcile
// loop, the data plane, pause, suspend and wake through the snapshot store,
// a restart that adopts, failures and delete. No root, runsc or agent
// build, so these run in the fast tier (go test -short); the same paths
// over real runsc are the *GVisor tests of the full suite.

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/fake"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// fakeDigest is the one template digest the fake worker has.
const fakeDigest = "sha256:test"

// fakeEnv is a worker over one fake driver (kept across worker restarts,
// as a real runtime's sandboxes outlive the worker process).
type fakeEnv struct {
	t       *testing.T
	srv     *fakeServer
	drv     *fake.Driver
	snaps   *snapshot.Store
	snapDir string
	rootfs  func(string) string
	tw      *testWorker
}

// fakeTemplateRoot is a template root the fake runtime starts: its only
// requirement is an executable agent at the usual place.
func fakeTemplateRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	bin := filepath.Join(root, "usr", "local", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "airlock-agent"), []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func newFakeEnv(t *testing.T) *fakeEnv {
	t.Helper()
	root := fakeTemplateRoot(t)
	snapDir := filepath.Join(t.TempDir(), "snapshots")
	snaps, err := snapshot.Open(snapDir)
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEnv{t: t, srv: newFakeServer(t), drv: fake.New(testLogger()), snaps: snaps, snapDir: snapDir}
	e.rootfs = func(d string) string {
		if d == fakeDigest {
			return root
		}
		return ""
	}
	e.start()
	return e
}

// start runs a new worker over the driver, wrapped as the daemon wraps it.
func (e *fakeEnv) start() {
	e.t.Helper()
	m := &runtime.Multi{Drivers: map[string]runtime.Driver{fake.Name: e.drv}, Default: fake.Name}
	e.tw = startWorkerWith(e.t, e.srv, m, e.rootfs, e.snaps)
}

func (e *fakeEnv) files(id string) *client.FilesClient {
	return &client.FilesClient{URL: e.tw.w.DataPlaneURL(), Token: e.srv.sign(e.t, token.Claims{SandboxID: id, Scope: token.ScopeFiles})}
}

// run runs argv in sandbox id through the data plane.
func (e *fakeEnv) run(id, cid string, argv ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	tok := e.srv.sign(e.t, token.Claims{SandboxID: id, Scope: token.ScopeCommand,
		Command: &model.CommandSpec{ID: cid, SandboxID: id, Argv: argv}})
	var out, errb bytes.Buffer
	exit, err := client.RunCommand(testContext(e.t), sandboxURL(e.tw.w, id)+"/commands/"+cid+"/attach", tok, nil, &out, &errb)
	if err != nil {
		e.t.Fatalf("run %v: %v (stderr %q)", argv, err, errb.String())
	}
	return out.String(), errb.String(), exit.ExitCode
}

func (e *fakeEnv) write(id, path, content string) {
	e.t.Helper()
	if _, err := e.files(id).Write(testContext(e.t), path, strings.NewReader(content), "", ""); err != nil {
		e.t.Fatalf("write %s: %v", path, err)
	}
}

func (e *fakeEnv) read(id, path string) string {
	e.t.Helper()
	rc, err := e.files(id).Read(testContext(e.t), path)
	if err != nil {
		e.t.Fatalf("read %s: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		e.t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

// waitFor polls what the worker last reported of id until cond holds. It
// polls rather than waiting on the server's change signal because the
// worker may report the same observation twice (a long poll it cancelled
// can reach the server after its successor, with an older observation):
// a condition that also reads the runtime or the snapshot store must be
// re-checked even when the server saw nothing new.
func (e *fakeEnv) waitFor(id, what string, cond func(workerapi.Observed) bool) workerapi.Observed {
	e.t.Helper()
	ctx := testContext(e.t)
	for {
		o, _ := e.srv.Observed(id)
		if cond(o) {
			return o
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("sandbox %s never %s (last observed %+v)", id, what, o)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// settled waits until the worker removed the files of the suspend
// snapshots a wake retired (it does so after reporting the sandbox
// running; with no snapshot left, the sandbox's snapshot dir goes too).
// A suspend begun before that can lose its pending dir to the removal
// (snapshot.Begin racing Retire's remove: "begin snapshot: … no such file
// or directory", retried 30 s later), which these tests do not exercise.
func (e *fakeEnv) settled(id string) {
	e.t.Helper()
	e.waitFor(id, "had its retired snapshots removed", func(workerapi.Observed) bool {
		_, err := os.Stat(filepath.Join(e.snapDir, id))
		return errors.Is(err, fs.ErrNotExist)
	})
}

// waitState waits until the worker last reported id in state st.
func (e *fakeEnv) waitState(id string, st model.SandboxState) workerapi.Observed {
	e.t.Helper()
	return e.waitFor(id, "reported "+string(st), func(o workerapi.Observed) bool { return o.State == st })
}

// gone waits until sandbox id is in neither the runtime nor the snapshot
// store. It does not wait for the worker's "deleted" report: the worker
// reports a deletion until a sync succeeds, but a sync it cut short (a
// change arriving during the long poll) may still reach the server after
// that one, so the server's last word on id can be the older "running"
// (seen here about once in 30 runs).
func (e *fakeEnv) gone(id string) {
	e.t.Helper()
	e.waitFor(id, "removed from the runtime and the snapshot store", func(workerapi.Observed) bool {
		ms, err := e.snaps.List(id)
		return !e.inRuntime(id) && err == nil && len(ms) == 0
	})
}

func (e *fakeEnv) inRuntime(id string) bool {
	e.t.Helper()
	ids, err := e.drv.List(testContext(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.Contains(ids, id)
}

// TestWorkerFake: a sandbox starts on assignment, runs commands and keeps
// files through the data plane, pauses, suspends to one verified snapshot
// and wakes from it with its files, survives a worker restart while
// suspended, auto-wakes on a file request, and is deleted with nothing
// left in the runtime or the snapshot store.
func TestWorkerFake(t *testing.T) {
	e := newFakeEnv(t)
	ctx := testContext(t)
	const id = "sbx-fake-0001"

	e.srv.assign(id, fakeDigest, model.StateRunning)
	e.waitState(id, model.StateRunning)
	if !e.inRuntime(id) {
		t.Fatal("running sandbox not in the runtime")
	}
	out, errOut, code := e.run(id, "c-1", "sh", "-c", "echo out; echo err >&2; exit 3")
	if out != "out\n" || errOut != "err\n" || code != 3 {
		t.Fatalf("command: stdout %q stderr %q exit %d; want out, err, 3", out, errOut, code)
	}
	e.write(id, "notes.txt", "kept across suspends\n")
	if got := e.read(id, "notes.txt"); got != "kept across suspends\n" {
		t.Fatalf("read back %q", got)
	}

	// Pause: a sandbox that opted out of auto-wake refuses data-plane use
	// while paused, and resumes with its files.
	e.srv.setNoAutoWake(id, true)
	e.srv.assign(id, fakeDigest, model.StatePaused)
	e.waitState(id, model.StatePaused)
	if st, err := e.drv.Status(ctx, id); err != nil || st != runtime.StatusPaused {
		t.Fatalf("runtime status while paused: %v, %v", st, err)
	}
	if _, err := e.files(id).Stat(ctx, "notes.txt"); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("stat while paused without auto-wake: %v, want conflict", err)
	}
	e.srv.assign(id, fakeDigest, model.StateRunning)
	e.waitFor(id, "resumed", func(o workerapi.Observed) bool {
		st, err := e.drv.Status(ctx, id)
		return o.State == model.StateRunning && err == nil && st == runtime.StatusRunning
	})

	// Suspend: the runtime sandbox goes, one suspend snapshot stays.
	lastSnap := ""
	suspend := func() {
		t.Helper()
		e.srv.assign(id, fakeDigest, model.StateSuspended)
		o := e.waitFor(id, "suspended to a new snapshot", func(o workerapi.Observed) bool {
			return o.State == model.StateSuspended && o.SnapshotID != lastSnap
		})
		lastSnap = o.SnapshotID
		if o.SnapshotID == "" || o.SnapshotBytes <= 0 {
			t.Fatalf("suspended without a snapshot: %+v", o)
		}
		if e.inRuntime(id) {
			t.Fatal("suspended sandbox still in the runtime")
		}
		ms, err := e.snaps.List(id)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 1 || ms[0].ID != o.SnapshotID || ms[0].Kind != snapshot.KindSuspend {
			t.Fatalf("snapshots while suspended: %+v, want exactly %s", ms, o.SnapshotID)
		}
		if err := e.snaps.Verify(id, o.SnapshotID); err != nil {
			t.Fatalf("verify snapshot: %v", err)
		}
	}
	wake := func() {
		t.Helper()
		e.srv.assign(id, fakeDigest, model.StateRunning)
		e.waitFor(id, "woken", func(o workerapi.Observed) bool {
			return o.State == model.StateRunning && e.inRuntime(id)
		})
		if ms, _ := e.snaps.List(id); len(ms) != 0 {
			t.Fatalf("suspend snapshots left after wake: %+v", ms)
		}
		e.settled(id)
	}
	suspend()
	if _, err := e.files(id).Stat(ctx, "notes.txt"); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("stat while suspended without auto-wake: %v, want conflict", err)
	}
	wake()
	if got := e.read(id, "notes.txt"); got != "kept across suspends\n" {
		t.Fatalf("after wake: %q", got)
	}

	// A worker restart while suspended: the new worker finds the committed
	// snapshot and wakes from it.
	e.write(id, "second.txt", "2\n")
	suspend()
	e.tw.stop(t)
	e.start()
	e.srv.waitRegistered(ctx, 2)
	e.waitFor(id, "suspended after the restart", func(o workerapi.Observed) bool {
		return o.State == model.StateSuspended && o.SnapshotID == lastSnap
	})
	wake()
	if got := e.read(id, "second.txt"); got != "2\n" {
		t.Fatalf("after a restart and wake: %q", got)
	}

	// Auto-wake: a file request to a suspended sandbox wakes it once.
	e.srv.setNoAutoWake(id, false)
	suspend()
	wakes := e.srv.wakeCount()
	if got := e.read(id, "notes.txt"); got != "kept across suspends\n" {
		t.Fatalf("auto-woken read: %q", got)
	}
	if got := e.srv.wakeCount(); got != wakes+1 {
		t.Fatalf("wake requests: %d, want %d", got, wakes+1)
	}
	e.waitFor(id, "running after the auto-wake", func(o workerapi.Observed) bool {
		return o.State == model.StateRunning && e.inRuntime(id)
	})
	e.settled(id)

	// Delete: gone from the runtime and the snapshot store. (What is
	// waited for is the effect, not the "deleted" report: see gone.)
	e.srv.assign(id, fakeDigest, model.StateDeleted)
	e.gone(id)
}

// TestWorkerLifecycleFake: a missing template fails the sandbox with the
// reason and leaves nothing in the runtime; a sandbox the runtime lost
// while the worker ran is failed; after a restart, a running sandbox is
// adopted and one the server no longer assigns is deleted.
func TestWorkerLifecycleFake(t *testing.T) {
	e := newFakeEnv(t)
	ctx := testContext(t)

	e.srv.assign("sbx-fake-0002", "sha256:missing", model.StateRunning)
	o := e.waitState("sbx-fake-0002", model.StateFailed)
	if !strings.Contains(o.Reason, "not present") {
		t.Errorf("failure reason %q, want the template named not present", o.Reason)
	}
	if e.inRuntime("sbx-fake-0002") {
		t.Error("failed sandbox left in the runtime")
	}

	// The runtime loses a sandbox behind the worker's back.
	e.srv.assign("sbx-fake-0003", fakeDigest, model.StateRunning)
	e.waitState("sbx-fake-0003", model.StateRunning)
	if err := e.drv.Delete(ctx, "sbx-fake-0003"); err != nil {
		t.Fatal(err)
	}
	o = e.waitState("sbx-fake-0003", model.StateFailed)
	if o.Reason == "" {
		t.Error("a sandbox lost by the runtime is failed without a reason")
	}

	// Restart: the running one is adopted (same sandbox: its file is
	// there), the unassigned one deleted.
	e.srv.assign("sbx-fake-0004", fakeDigest, model.StateRunning)
	e.srv.assign("sbx-fake-0005", fakeDigest, model.StateRunning)
	e.waitState("sbx-fake-0004", model.StateRunning)
	e.waitState("sbx-fake-0005", model.StateRunning)
	e.write("sbx-fake-0004", "mark", "adopted\n")
	e.tw.stop(t)
	if !e.inRuntime("sbx-fake-0004") || !e.inRuntime("sbx-fake-0005") {
		t.Fatal("stopping the worker deleted a running sandbox")
	}
	e.srv.Unassign("sbx-fake-0005")
	e.start()
	e.srv.waitRegistered(ctx, 2)
	e.gone("sbx-fake-0005")
	e.waitState("sbx-fake-0004", model.StateRunning)
	if got := e.read("sbx-fake-0004", "mark"); got != "adopted\n" {
		t.Errorf("adopted sandbox's file: %q, want it kept (a new sandbox would not have it)", got)
	}
}
