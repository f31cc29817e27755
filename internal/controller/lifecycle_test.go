package controller

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/workerapi"
)

// Lifecycle tests: the service records what the user asks (over the same
// store, events and clock), the controller and the fake worker (real worker
// API over HTTP) carry it out.

var testPrincipal = service.Principal{OrgID: testOrg}

func (e *env) service() *service.Service {
	return service.New(service.Config{Store: e.st, Events: e.ev, Kick: e.c.Kick, Now: e.clock.Now, OperationDeadline: e.c.OperationDeadline()})
}

// runningSandbox creates sandbox id and brings it to running on worker w.
func (e *env) runningSandbox(w *fakeWorker, id string) {
	e.t.Helper()
	e.createSandbox(id, 512)
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: id, State: model.StateRunning})
	e.wantSandbox(id, model.StateRunning, w.id, "")
}

// lifecycleOp calls the service method for kind.
func (e *env) lifecycleOp(kind model.OperationKind, id string) (model.Operation, error) {
	svc := e.service()
	switch kind {
	case model.OpPause:
		return svc.PauseSandbox(e.ctx, testPrincipal, id)
	case model.OpResume:
		return svc.ResumeSandbox(e.ctx, testPrincipal, id)
	case model.OpSuspend:
		return svc.SuspendSandbox(e.ctx, testPrincipal, id)
	case model.OpWake:
		return svc.WakeSandbox(e.ctx, testPrincipal, id)
	}
	e.t.Fatalf("no lifecycle op %s", kind)
	return model.Operation{}, nil
}

func (e *env) mustLifecycle(kind model.OperationKind, id string) model.Operation {
	e.t.Helper()
	e.clock.Advance(time.Millisecond) // operations are ordered by creation time
	op, err := e.lifecycleOp(kind, id)
	if err != nil {
		e.t.Fatalf("%s %s: %v", kind, id, err)
	}
	if op.Kind != kind || op.SandboxID != id || op.Target == "" {
		e.t.Fatalf("%s %s: operation %+v", kind, id, op)
	}
	return op
}

func (e *env) wantConflict(kind model.OperationKind, id, msgPart string) {
	e.t.Helper()
	_, err := e.lifecycleOp(kind, id)
	if !errors.Is(err, model.ErrConflict) || !strings.Contains(err.Error(), msgPart) {
		e.t.Fatalf("%s %s: err %v, want a conflict containing %q", kind, id, err, msgPart)
	}
}

func (e *env) wantDesired(id string, desired model.SandboxState) model.Sandbox {
	e.t.Helper()
	sb := e.sandbox(id)
	if sb.DesiredState != desired {
		e.t.Fatalf("sandbox %s: desired %s, want %s (state %s)", id, sb.DesiredState, desired, sb.State)
	}
	return sb
}

func TestPauseResume(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")

	pause := e.mustLifecycle(model.OpPause, "sb1")
	if pause.State != model.OpPending || pause.Target != model.StatePaused {
		t.Fatalf("pause op %+v", pause)
	}
	if again := e.mustLifecycle(model.OpPause, "sb1"); again.ID != pause.ID {
		t.Fatalf("repeated pause: op %s, want the open %s", again.ID, pause.ID)
	}
	e.wantConflict(model.OpSuspend, "sb1", "has a pause operation "+pause.ID+" in progress")
	e.wantDesired("sb1", model.StatePaused)
	e.reconcile()
	e.wantOp(pause.ID, model.OpRunning, "")
	resp := w.sync(-1, 0)
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StatePaused})
	resp = w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
	e.wantSandbox("sb1", model.StatePaused, "w1", "")
	e.wantOp(pause.ID, model.OpSucceeded, "")
	e.wantConflict(model.OpPause, "sb1", "sandbox sb1 is already paused")

	resume := e.mustLifecycle(model.OpResume, "sb1")
	e.reconcile()
	resp = w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateRunning})
	w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	e.wantOp(resume.ID, model.OpSucceeded, "")
	e.wantConflict(model.OpResume, "sb1", "sandbox sb1 is already running; there is nothing to resume")

	// Wake on a paused sandbox resumes it.
	e.mustLifecycle(model.OpPause, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
	wake := e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StatePaused, "w1", "") // no snapshot to restore: no waking
	wantAssignments(t, w.sync(-1, 0), map[string]model.SandboxState{"sb1": model.StateRunning})
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantOp(wake.ID, model.OpSucceeded, "")

	e.wantHistory("sb1",
		"sandbox:starting", "operation:create:running",
		"sandbox:running", "operation:create:succeeded",
		"sandbox:running", "operation:pause:pending", "operation:pause:running",
		"sandbox:paused", "operation:pause:succeeded",
		"sandbox:paused", "operation:resume:pending", "operation:resume:running",
		"sandbox:running", "operation:resume:succeeded",
		"sandbox:running", "operation:pause:pending", "operation:pause:running",
		"sandbox:paused", "operation:pause:succeeded",
		"sandbox:paused", "operation:wake:pending", "operation:wake:running",
		"sandbox:running", "operation:wake:succeeded",
	)
}

func TestSuspendWake(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")

	suspend := e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateSuspending, "w1", "")
	e.wantOp(suspend.ID, model.OpRunning, "")
	resp := w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning}) // not started yet
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateSuspended})
	e.wantSandbox("sb1", model.StateSuspending, "w1", "")
	e.wantConflict(model.OpPause, "sb1", "has a suspend operation "+suspend.ID+" in progress")
	e.wantConflict(model.OpWake, "sb1", "has a suspend operation "+suspend.ID+" in progress")

	resp = w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-1", SnapshotBytes: 12345})
	sb := e.wantSandbox("sb1", model.StateSuspended, "w1", "")
	if sb.SnapshotID != "snap-1" || sb.SnapshotBytes != 12345 {
		t.Fatalf("snapshot %q %d, want snap-1 12345", sb.SnapshotID, sb.SnapshotBytes)
	}
	e.wantOp(suspend.ID, model.OpSucceeded, "")
	// Still assigned, as suspended: the worker holds the snapshot (and
	// deletes what is not assigned to it).
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateSuspended})
	e.wantConflict(model.OpPause, "sb1", "sandbox sb1 is suspended; pausing needs a running sandbox; wake it instead of pausing")
	e.wantConflict(model.OpResume, "sb1", "wake it instead of resuming")
	e.wantConflict(model.OpSuspend, "sb1", "already suspended")

	wake := e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateWaking, "w1", "")
	resp = w.sync(-1, 0)
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateRunning})
	if got := resp.Assignments[0].Sandbox.SnapshotID; got != "snap-1" {
		t.Fatalf("wake assignment carries snapshot %q, want snap-1", got)
	}
	w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	e.wantOp(wake.ID, model.OpSucceeded, "")

	// Suspend from paused, then wake.
	e.mustLifecycle(model.OpPause, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateSuspending, "w1", "")
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-2", SnapshotBytes: 1})
	e.wantSandbox("sb1", model.StateSuspended, "w1", "")

	// A suspended sandbox being deleted is assigned "deleted" so the worker
	// removes its snapshot.
	if _, err := e.service().DeleteSandbox(e.ctx, testPrincipal, "sb1"); err != nil {
		t.Fatal(err)
	}
	e.reconcile()
	e.wantSandbox("sb1", model.StateDeleting, "w1", "")
	wantAssignments(t, w.sync(-1, 0), map[string]model.SandboxState{"sb1": model.StateDeleted})
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateDeleted})
	e.wantSandbox("sb1", model.StateDeleted, "w1", "")
	if _, err := e.lifecycleOp(model.OpWake, "sb1"); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("wake a deleted sandbox: %v, want not found", err)
	}
}

// TestWorkerWakeWaitsForSuspendToSettle: a worker asks for a wake as soon
// as its own suspend is done, before its sync has told the server; the
// wake waits for the suspend to be recorded instead of being refused.
func TestWorkerWakeWaitsForSuspendToSettle(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	suspend := e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	resp := w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	type result struct {
		op  model.Operation
		err error
	}
	done := make(chan result, 1)
	go func() {
		op, err := e.c.Wake(e.ctx, "w1", workerapi.WakeRequest{SandboxID: "sb1"})
		done <- result{op, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("wake answered before the suspend was recorded: %+v %v", r.op, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-1", SnapshotBytes: 1})
	e.wantOp(suspend.ID, model.OpSucceeded, "")
	r := <-done
	if r.err != nil || r.op.Kind != model.OpWake {
		t.Fatalf("wake after the suspend settled: %+v %v; want a wake operation", r.op, r.err)
	}
}

func TestWakeDeleted(t *testing.T) {
	e := newEnv(t)
	_, err := e.lifecycleOp(model.OpWake, "nope")
	if !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("wake unknown: %v, want not found", err)
	}
}

func TestSuspendFailureKeepsSandbox(t *testing.T) {
	for _, from := range []model.SandboxState{model.StateRunning, model.StatePaused} {
		t.Run(string(from), func(t *testing.T) {
			e := newEnv(t)
			w := e.worker("w1")
			w.register(baseTemplate)
			e.runningSandbox(w, "sb1")
			if from == model.StatePaused {
				e.mustLifecycle(model.OpPause, "sb1")
				e.reconcile()
				w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
			}
			suspend := e.mustLifecycle(model.OpSuspend, "sb1")
			e.reconcile()
			e.wantSandbox("sb1", model.StateSuspending, "w1", "")
			w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: from, Reason: "checkpoint: no space left on device"})
			e.wantSandbox("sb1", from, "w1", "")
			e.wantDesired("sb1", from)
			e.wantOp(suspend.ID, model.OpFailed, "suspend failed: checkpoint: no space left on device")
			e.reconcile()
			e.wantSandbox("sb1", from, "w1", "") // settled: nothing more happens
			wantAssignments(t, w.sync(-1, 0), map[string]model.SandboxState{"sb1": from})
			// It can be suspended again.
			e.mustLifecycle(model.OpSuspend, "sb1")
		})
	}
}

func TestSuspendDeadlineRestoresDesired(t *testing.T) {
	for _, from := range []model.SandboxState{model.StateRunning, model.StatePaused} {
		t.Run(string(from), func(t *testing.T) {
			e := newEnv(t)
			w := e.worker("w1")
			w.register(baseTemplate)
			e.runningSandbox(w, "sb1")
			if from == model.StatePaused {
				e.mustLifecycle(model.OpPause, "sb1")
				e.reconcile()
				w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
			}
			suspend := e.mustLifecycle(model.OpSuspend, "sb1")
			e.reconcile()
			e.wantSandbox("sb1", model.StateSuspending, "w1", "")

			e.clock.Advance(e.c.OperationDeadline() + time.Minute)
			e.reconcile()
			e.wantOp(suspend.ID, model.OpFailed, "deadline of 30m0s passed while suspend was suspending")
			e.wantSandbox("sb1", model.StateSuspending, "w1", "") // until the worker says where it is
			e.wantDesired("sb1", from)
			resp := w.sync(-1, 0)
			wantAssignments(t, resp, map[string]model.SandboxState{"sb1": from})
			e.wantConflict(model.OpWake, "sb1", "is suspending and on its way to "+string(from))

			w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: from})
			e.wantSandbox("sb1", from, "w1", "")
			e.reconcile()
			e.wantSandbox("sb1", from, "w1", "")
		})
	}
}

func TestPauseDeadlineDoesNotFailSandbox(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	pause := e.mustLifecycle(model.OpPause, "sb1")
	e.reconcile()
	e.clock.Advance(e.c.OperationDeadline() + time.Minute)
	e.reconcile()
	e.wantOp(pause.ID, model.OpFailed, "deadline of 30m0s passed while pause was running")
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	e.wantDesired("sb1", model.StateRunning)
}

func TestWakeDeadlineFailsSandbox(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-1"})
	wake := e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateWaking, "w1", "")
	e.clock.Advance(e.c.OperationDeadline() + time.Minute)
	e.reconcile()
	const reason = "deadline of 30m0s passed while wake was waking"
	e.wantOp(wake.ID, model.OpFailed, reason)
	e.wantSandbox("sb1", model.StateFailed, "w1", reason)
	wantAssignments(t, w.sync(-1, 0), map[string]model.SandboxState{"sb1": model.StateDeleted})
	if _, err := e.service().DeleteSandbox(e.ctx, testPrincipal, "sb1"); err != nil {
		t.Fatalf("delete a failed sandbox: %v", err)
	}
}

func TestWakeFailureKeepsSnapshot(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-1"})
	wake := e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-1", Reason: "restore: runsc exited 1"})
	e.wantSandbox("sb1", model.StateSuspended, "w1", "")
	e.wantDesired("sb1", model.StateSuspended)
	e.wantOp(wake.ID, model.OpFailed, "wake failed: restore: runsc exited 1")
	e.mustLifecycle(model.OpWake, "sb1") // still wakeable
}

func TestIllegalTransitions(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.createSandbox("sb-pending", 512)
	for _, tc := range []struct {
		kind model.OperationKind
		msg  string
	}{
		{model.OpPause, "has a create operation op-create-sb-pending in progress"},
		{model.OpSuspend, "has a create operation"},
		{model.OpWake, "has a create operation"},
		{model.OpResume, "has a create operation"},
	} {
		e.wantConflict(tc.kind, "sb-pending", tc.msg)
	}

	// States set directly, without operations, to cover every message.
	set := func(id string, state, desired model.SandboxState, reason string) {
		t.Helper()
		sb := e.sandbox(id)
		sb.State, sb.DesiredState, sb.Reason = state, desired, reason
		if _, err := e.st.UpdateSandbox(e.ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	e.runningSandbox(w, "sb1")
	for _, tc := range []struct {
		state, desired model.SandboxState
		reason         string
		kind           model.OperationKind
		msg            string
	}{
		{model.StateRunning, model.StateRunning, "", model.OpResume, "sandbox sb1 is already running; there is nothing to resume"},
		{model.StateRunning, model.StateRunning, "", model.OpWake, "sandbox sb1 is already running; there is nothing to wake"},
		{model.StatePaused, model.StatePaused, "", model.OpPause, "sandbox sb1 is already paused"},
		{model.StateSuspended, model.StateSuspended, "", model.OpPause, "sandbox sb1 is suspended; pausing needs a running sandbox; wake it instead of pausing"},
		{model.StateSuspended, model.StateSuspended, "", model.OpSuspend, "sandbox sb1 is already suspended"},
		{model.StateStarting, model.StateRunning, "", model.OpPause, "sandbox sb1 is starting and on its way to running"},
		{model.StateWaking, model.StateRunning, "", model.OpSuspend, "sandbox sb1 is waking and on its way to running"},
		{model.StateFailed, model.StateRunning, "boom", model.OpWake, "sandbox sb1 has failed (boom); it can only be deleted"},
		{model.StateDeleting, model.StateDeleted, "", model.OpSuspend, "sandbox sb1 is being deleted"},
	} {
		set("sb1", tc.state, tc.desired, tc.reason)
		e.wantConflict(tc.kind, "sb1", tc.msg)
	}
	if _, err := e.service().PauseSandbox(e.ctx, service.Principal{OrgID: "other"}, "sb1"); !errors.Is(err, model.ErrNotFound) {
		t.Fatalf("pause by another org: %v, want not found", err)
	}
}

// TestConcurrentLifecycleRequests races pause against suspend on one running
// sandbox many times: exactly one wins each time, the other gets a conflict
// naming the winner's operation, and the sandbox never has two open.
func TestConcurrentLifecycleRequests(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	for i := range 10 {
		id := "sb" + string(rune('a'+i))
		e.runningSandbox(w, id)
		kinds := []model.OperationKind{model.OpPause, model.OpSuspend, model.OpPause, model.OpSuspend}
		ops := make([]model.Operation, len(kinds))
		errs := make([]error, len(kinds))
		var wg sync.WaitGroup
		for j, k := range kinds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ops[j], errs[j] = e.lifecycleOp(k, id)
			}()
		}
		wg.Wait()
		opIDs := map[string]model.OperationKind{}
		for j, err := range errs {
			switch {
			case err == nil:
				opIDs[ops[j].ID] = ops[j].Kind
			case errors.Is(err, model.ErrConflict) && strings.Contains(err.Error(), "in progress"):
			default:
				t.Fatalf("%s %s: %v", kinds[j], id, err)
			}
		}
		if len(opIDs) != 1 {
			t.Fatalf("%s: operations %v, want exactly one (the same one for repeats)", id, opIDs)
		}
		open, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: id, Open: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(open) != 1 {
			t.Fatalf("%s: %d open operations, want 1", id, len(open))
		}
		for j, err := range errs {
			if err != nil && !strings.Contains(err.Error(), open[0].ID) {
				t.Fatalf("%s: loser's error %q does not name the winner %s", kinds[j], err, open[0].ID)
			}
		}
		if sb := e.sandbox(id); sb.DesiredState != open[0].Target {
			t.Fatalf("%s: desired %s, want the winner's %s", id, sb.DesiredState, open[0].Target)
		}
		// Free the worker's capacity for the next round.
		if _, err := e.service().DeleteSandbox(e.ctx, testPrincipal, id); err != nil {
			t.Fatal(err)
		}
		e.reconcile()
		w.sync(-1, 0, workerapi.Observed{SandboxID: id, State: model.StateDeleted})
		e.wantSandbox(id, model.StateDeleted, "w1", "")
	}
}

func (e *env) setIdle(id string, secs int64) {
	e.t.Helper()
	sb := e.sandbox(id)
	sb.IdleSuspendS = secs
	if _, err := e.st.UpdateSandbox(e.ctx, sb); err != nil {
		e.t.Fatal(err)
	}
}

func TestIdleAutoSuspend(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "idle")
	e.runningSandbox(w, "never")
	e.runningSandbox(w, "busy")
	e.runningSandbox(w, "paused")
	e.setIdle("idle", 1)
	e.setIdle("never", 0)
	e.setIdle("busy", 1)
	e.setIdle("paused", 1)
	e.mustLifecycle(model.OpPause, "paused")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "paused", State: model.StatePaused})

	e.reconcile()
	e.wantSandbox("idle", model.StateRunning, "w1", "") // not idle long enough yet

	e.clock.Advance(2 * time.Second)
	// The worker saw data-plane activity on "busy" a moment ago.
	w.sync(-1, 0,
		workerapi.Observed{SandboxID: "busy", State: model.StateRunning, LastActivity: e.clock.Now().Add(-100 * time.Millisecond)},
		workerapi.Observed{SandboxID: "idle", State: model.StateRunning},
	)
	e.reconcile()
	e.wantSandbox("idle", model.StateSuspending, "w1", "")
	e.wantSandbox("paused", model.StateSuspending, "w1", "")
	e.wantSandbox("never", model.StateRunning, "w1", "")
	busy := e.wantSandbox("busy", model.StateRunning, "w1", "")
	if !busy.LastActivityAt.After(e.clock.Now().Add(-time.Second)) {
		t.Fatalf("busy: last activity %v not moved forward by the worker's report", busy.LastActivityAt)
	}
	ops, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: "idle", Open: true})
	if err != nil || len(ops) != 1 || ops[0].Kind != model.OpSuspend || ops[0].Reason != "idle for 1s" {
		t.Fatalf("idle: open operations %+v (%v), want one suspend with reason \"idle for 1s\"", ops, err)
	}
	resp := w.sync(-1, 0, workerapi.Observed{SandboxID: "idle", State: model.StateSuspended, SnapshotID: "s1"})
	e.wantSandbox("idle", model.StateSuspended, "w1", "")
	e.wantOp(ops[0].ID, model.OpSucceeded, "idle for 1s")
	if d := desiredOf(resp)["idle"]; d != model.StateSuspended {
		t.Fatalf("suspended sandbox assigned as %q, want suspended", d)
	}

	// Later, "busy" goes idle too; a suspended one is not suspended again.
	e.clock.Advance(2 * time.Second)
	e.reconcile()
	e.wantSandbox("busy", model.StateSuspending, "w1", "")
	e.wantSandbox("idle", model.StateSuspended, "w1", "")
	e.wantSandbox("never", model.StateRunning, "w1", "")
}

// TestIdleAutoSuspendRun runs the controller loop for real with a short
// resync and real time: a 1 s idle sandbox ends up suspending.
func TestIdleAutoSuspendRun(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Now = nil; c.Resync = 50 * time.Millisecond })
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	e.setIdle("sb1", 1)
	done := make(chan struct{})
	go func() { defer close(done); e.c.Run(e.ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for e.sandbox("sb1").State != model.StateSuspending {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s after 60 s with a 1 s idle setting", e.sandbox("sb1").State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWakeRequestFromWorker(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	other := e.worker("w2")
	other.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	wake := func(w *fakeWorker, id string) (int, model.Operation, string) {
		t.Helper()
		resp, body := w.post("/internal/v1/workers/"+w.id+"/wake", workerapi.WakeRequest{SandboxID: id})
		var out struct {
			Operation model.Operation `json:"operation"`
		}
		json.Unmarshal(body, &out)
		return resp.StatusCode, out.Operation, string(body)
	}
	// Running: answers with the operation that got it there.
	if code, op, body := wake(w, "sb1"); code != http.StatusAccepted || op.ID != "op-create-sb1" {
		t.Fatalf("wake running: %d %s", code, body)
	}
	e.mustLifecycle(model.OpSuspend, "sb1")
	if code, _, body := wake(w, "sb1"); code != http.StatusConflict || !strings.Contains(body, "has a suspend operation") {
		t.Fatalf("wake while suspending: %d %s", code, body)
	}
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "s1"})
	if code, _, body := wake(other, "sb1"); code != http.StatusNotFound {
		t.Fatalf("wake from another worker: %d %s", code, body)
	}
	code, op, body := wake(w, "sb1")
	if code != http.StatusAccepted || op.Kind != model.OpWake || op.State != model.OpPending {
		t.Fatalf("wake suspended: %d %s", code, body)
	}
	if code, again, _ := wake(w, "sb1"); code != http.StatusAccepted || again.ID != op.ID {
		t.Fatalf("second wake request: %d %s, want the same operation %s", code, again.ID, op.ID)
	}
	e.reconcile()
	e.wantSandbox("sb1", model.StateWaking, "w1", "")
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantOp(op.ID, model.OpSucceeded, "")

	// Opted out of auto-wake.
	sb := e.sandbox("sb1")
	sb.NoAutoWake = true
	if _, err := e.st.UpdateSandbox(e.ctx, sb); err != nil {
		t.Fatal(err)
	}
	e.mustLifecycle(model.OpPause, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
	if code, _, body := wake(w, "sb1"); code != http.StatusConflict || !strings.Contains(body, "auto_wake=false") {
		t.Fatalf("wake opted-out sandbox: %d %s", code, body)
	}
}

func TestAutoWakeOnDataPlaneSession(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	svc := e.service()
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "s1"})

	cs, err := svc.CreateCommand(e.ctx, testPrincipal, "sb1", service.CommandParams{Cmd: "true"})
	if err != nil || cs.Token == "" || !strings.Contains(cs.AttachURL, "/sb1/commands/") {
		t.Fatalf("command on a suspended sandbox: %+v %v", cs, err)
	}
	open, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: "sb1", Open: true})
	if err != nil || len(open) != 1 || open[0].Kind != model.OpWake {
		t.Fatalf("open operations %+v (%v), want one wake", open, err)
	}
	// A files session while waking joins the same wake.
	if _, err := svc.FilesSession(e.ctx, testPrincipal, "sb1"); err != nil {
		t.Fatalf("files session while waking: %v", err)
	}
	e.reconcile()
	if _, err := svc.FilesSession(e.ctx, testPrincipal, "sb1"); err != nil {
		t.Fatalf("files session while waking: %v", err)
	}
	again, _ := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: "sb1", Open: true})
	if len(again) != 1 || again[0].ID != open[0].ID {
		t.Fatalf("open operations %+v, want only %s", again, open[0].ID)
	}
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateRunning, "w1", "")

	// Paused, opted out: 409 naming the opt-out.
	sb := e.sandbox("sb1")
	sb.NoAutoWake = true
	if _, err := e.st.UpdateSandbox(e.ctx, sb); err != nil {
		t.Fatal(err)
	}
	e.mustLifecycle(model.OpPause, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
	_, err = svc.CreateCommand(e.ctx, testPrincipal, "sb1", service.CommandParams{Cmd: "true"})
	if !errors.Is(err, model.ErrConflict) || !strings.Contains(err.Error(), "auto_wake=false") {
		t.Fatalf("command on an opted-out paused sandbox: %v", err)
	}
	if _, err := svc.FilesSession(e.ctx, testPrincipal, "sb1"); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("files on an opted-out paused sandbox: %v", err)
	}
}

func TestEnsureRunning(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	svc := e.service()
	e.createSandbox("sb1", 512)
	// Starting: joins the create.
	if op, err := svc.EnsureRunning(e.ctx, testPrincipal, "sb1"); err != nil || op.ID != "op-create-sb1" {
		t.Fatalf("ensure running while starting: %+v %v", op, err)
	}
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	// Running: the create that got it there.
	if op, err := svc.EnsureRunning(e.ctx, testPrincipal, "sb1"); err != nil || op.ID != "op-create-sb1" || op.State != model.OpSucceeded {
		t.Fatalf("ensure running while running: %+v %v", op, err)
	}
	// Suspended, even with auto-wake off: a wake.
	sb := e.sandbox("sb1")
	sb.NoAutoWake = true
	if _, err := e.st.UpdateSandbox(e.ctx, sb); err != nil {
		t.Fatal(err)
	}
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "s1"})
	op, err := svc.EnsureRunning(e.ctx, testPrincipal, "sb1")
	if err != nil || op.Kind != model.OpWake {
		t.Fatalf("ensure running while suspended: %+v %v", op, err)
	}
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantOp(op.ID, model.OpSucceeded, "")
}

// TestSuspendedReleasesCapacity: a suspended sandbox holds no capacity, so a
// sandbox that did not fit is placed once the other is suspended.
func TestSuspendedReleasesCapacity(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate) // 4096 MiB
	e.createSandbox("big", 4096)
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "big", State: model.StateRunning})
	e.createSandbox("next", 4096)
	e.reconcile()
	e.wantSandbox("next", model.StatePending, "", "no worker has capacity")
	e.mustLifecycle(model.OpSuspend, "big")
	e.reconcile()
	e.wantSandbox("next", model.StatePending, "", "no worker has capacity") // suspending still holds it
	w.sync(-1, 0, workerapi.Observed{SandboxID: "big", State: model.StateSuspended, SnapshotID: "s"})
	e.reconcile()
	e.wantSandbox("next", model.StateStarting, "w1", "")
}

// TestIdleSuspendFailureWaitsAPeriod: a failed idle suspend restarts the
// idle clock, so the controller does not retry every round.
func TestIdleSuspendFailureWaitsAPeriod(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	e.setIdle("sb1", 10)
	e.clock.Advance(11 * time.Second)
	e.reconcile()
	e.wantSandbox("sb1", model.StateSuspending, "w1", "")
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning, Reason: "suspend failed: checkpoint: boom"})
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	count := func() int {
		ops, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: "sb1"})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, op := range ops {
			if op.Kind == model.OpSuspend {
				n++
				if op.State == model.OpFailed && op.Reason != "suspend failed: checkpoint: boom" {
					t.Fatalf("failed suspend reason %q", op.Reason)
				}
			}
		}
		return n
	}
	e.clock.Advance(5 * time.Second)
	e.reconcile()
	if n := count(); n != 1 {
		t.Fatalf("%d suspend operations 5 s after a failure with a 10 s idle setting, want 1", n)
	}
	e.clock.Advance(6 * time.Second)
	e.reconcile()
	if n := count(); n != 2 {
		t.Fatalf("%d suspend operations a full idle period after the failure, want 2", n)
	}
}

// TestStaleReadDoesNotCompleteOperation: the controller reads a sandbox,
// then its operations, in two queries. A read of the sandbox from before a
// pause completed (running), paired with operations listed after a resume
// began, makes rule 4 complete the resume ("running is its target") while
// the sandbox is paused; the resume's caller then sees a paused sandbox
// on its way to running (seen once in CI by the CLI's lifecycle test). The
// operation's write must fail on the stale read instead.
func TestStaleReadDoesNotCompleteOperation(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.runningSandbox(w, "sb1")
	stale := e.sandbox("sb1")

	e.mustLifecycle(model.OpPause, "sb1")
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StatePaused})
	e.wantSandbox("sb1", model.StatePaused, "w1", "")
	resume := e.mustLifecycle(model.OpResume, "sb1")

	open, err := e.st.ListOperations(e.ctx, store.OperationFilter{SandboxID: "sb1", Open: true})
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := e.c.newRound(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := e.c.decide(r, stale, open, model.StateRunning)
	if a.op == nil || a.op.ID != resume.ID || a.op.State != model.OpSucceeded {
		t.Fatalf("decide on the stale read: %+v (the race needs rule 4 to complete the resume)", a)
	}
	if err := e.c.apply(e.ctx, a, stale); !errors.Is(err, model.ErrConflict) {
		t.Fatalf("apply on a stale read: %v, want a conflict", err)
	}
	e.wantOp(resume.ID, model.OpPending, "")
	e.wantSandbox("sb1", model.StatePaused, "w1", "")

	// Fresh reads carry it out as usual.
	e.reconcile()
	resp := w.sync(-1, 0)
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateRunning})
	w.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	e.wantOp(resume.ID, model.OpSucceeded, "")
}

// TestWakeMovesThroughTheBlobStore: a suspended sandbox whose snapshot is
// in the shared blob store wakes on another worker on the same store when
// its own is cordoned, silent or full; one whose snapshot is only on its
// worker wakes there; one that fits nowhere waits suspended with the
// reason.
func TestWakeMovesThroughTheBlobStore(t *testing.T) {
	e := newEnv(t)
	w1, w2, w3 := e.worker("w1"), e.worker("w2"), e.worker("w3")
	w1.blob, w2.blob, w3.blob = "file:///shared", "file:///shared", "s3://other"
	for _, w := range []*fakeWorker{w1, w2, w3} {
		w.register(baseTemplate)
	}
	e.runningSandbox(w1, "sb1")
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w1.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-1", SnapshotBytes: 10, SnapshotShared: true})
	if sb := e.wantSandbox("sb1", model.StateSuspended, "w1", ""); !sb.SnapshotShared {
		t.Fatal("a snapshot the worker reported shared is not recorded so")
	}

	// Its worker is live and has room: it wakes there.
	wake := e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateWaking, "w1", "")
	w1.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	if sb := e.wantSandbox("sb1", model.StateRunning, "w1", ""); sb.SnapshotShared {
		t.Fatal("a woken sandbox still says its snapshot is shared")
	}
	e.wantOp(wake.ID, model.OpSucceeded, "")

	// Suspended again, its worker cordoned: it wakes on w2 (same store),
	// never on w3 (another store), and w1 no longer has it assigned.
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w1.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-2", SnapshotBytes: 10, SnapshotShared: true})
	if err := e.st.SetWorkerCordoned(e.ctx, "w1", true); err != nil {
		t.Fatal(err)
	}
	wake = e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateWaking, "w2", "")
	wantAssignments(t, w1.sync(-1, 0), map[string]model.SandboxState{})
	resp := w2.sync(-1, 0)
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateRunning})
	if a := resp.Assignments[0].Sandbox; a.SnapshotID != "snap-2" || a.State != model.StateWaking {
		t.Fatalf("the moved wake is assigned as %s with snapshot %q, want waking with snap-2", a.State, a.SnapshotID)
	}
	w2.sync(resp.Version, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateRunning, "w2", "")
	e.wantOp(wake.ID, model.OpSucceeded, "")

	// A snapshot only on its worker (the push failed) stays there even
	// when that worker is cordoned.
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w2.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-3", SnapshotBytes: 10,
		Reason: "snapshot not copied to the blob store (it wakes only on worker w2): unreachable"})
	e.wantSandbox("sb1", model.StateSuspended, "w2", "snapshot not copied to the blob store")
	if err := e.st.SetWorkerCordoned(e.ctx, "w2", true); err != nil {
		t.Fatal(err)
	}
	if err := e.st.SetWorkerCordoned(e.ctx, "w1", false); err != nil {
		t.Fatal(err)
	}
	e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateWaking, "w2", "")
	w2.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})

	// Its worker silent and the only other one on the store cordoned: it
	// waits suspended, saying why, and wakes once a worker can take it.
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w2.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-4", SnapshotBytes: 10, SnapshotShared: true})
	if err := e.st.SetWorkerCordoned(e.ctx, "w2", false); err != nil {
		t.Fatal(err)
	}
	if err := e.st.SetWorkerCordoned(e.ctx, "w1", true); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * e.c.HeartbeatTTL())
	w3.sync(-1, 0) // w3 is live, on another store
	wake = e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateSuspended, "w2", "waiting to wake")
	if err := e.st.SetWorkerCordoned(e.ctx, "w1", false); err != nil {
		t.Fatal(err)
	}
	w1.sync(-1, 0)
	e.reconcile()
	e.wantSandbox("sb1", model.StateWaking, "w1", "")
	w1.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateRunning, "w1", "")
	e.wantOp(wake.ID, model.OpSucceeded, "")

	// Its worker goes silent while waking it: back to suspended, then
	// waking on the other worker of the store.
	e.mustLifecycle(model.OpSuspend, "sb1")
	e.reconcile()
	w1.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateSuspended, SnapshotID: "snap-5", SnapshotBytes: 10, SnapshotShared: true})
	w2.sync(-1, 0)
	wake = e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	e.wantSandbox("sb1", model.StateWaking, "w1", "")
	e.clock.Advance(3 * e.c.HeartbeatTTL())
	w2.sync(-1, 0)
	e.reconcile()
	e.wantSandbox("sb1", model.StateWaking, "w2", "")
	w2.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	e.wantSandbox("sb1", model.StateRunning, "w2", "")
	e.wantOp(wake.ID, model.OpSucceeded, "")
}

// suspendedOn brings running sandbox id on w to suspended, its snapshot
// shared or not.
func (e *env) suspendedOn(w *fakeWorker, id, snap string, shared bool) {
	e.t.Helper()
	e.mustLifecycle(model.OpSuspend, id)
	e.reconcile()
	w.sync(-1, 0, workerapi.Observed{SandboxID: id, State: model.StateSuspended, SnapshotID: snap, SnapshotBytes: 1, SnapshotShared: shared})
	e.wantSandbox(id, model.StateSuspended, w.id, "")
}

// TestWorkerLoss: a worker silent for longer than the loss grace takes its
// sandboxes with it, each marked lost with the reason (never dropped),
// except one suspended with its snapshot in the blob store, which wakes
// elsewhere; a deleting one is deleted; a lost one deletes at once, is no
// longer assigned to the worker should it come back, and shows as lost in
// the workers list.
func TestWorkerLoss(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkerLossGrace = 5 * time.Minute })
	w1, w2 := e.worker("w1"), e.worker("w2")
	w1.blob, w2.blob = "file:///shared", "file:///shared"
	w1.register(baseTemplate)
	for _, id := range []string{"run", "shared", "local", "del"} {
		e.runningSandbox(w1, id)
	}
	e.suspendedOn(w1, "shared", "snap-s", true)
	e.suspendedOn(w1, "local", "snap-l", false)
	runOp := e.mustLifecycle(model.OpPause, "run") // left open: the loss fails it
	e.reconcile()
	if _, err := e.service().DeleteSandbox(e.ctx, testPrincipal, "del"); err != nil {
		t.Fatal(err)
	}
	e.reconcile()
	e.wantSandbox("del", model.StateDeleting, "w1", "")
	w2.register(baseTemplate)

	// Silent, but within the grace: nothing is lost.
	e.clock.Advance(e.c.WorkerLossGrace() / 2)
	w2.sync(-1, 0)
	e.reconcile()
	e.wantSandbox("run", model.StateRunning, "w1", "worker w1 is unreachable")

	e.clock.Advance(e.c.WorkerLossGrace())
	w2.sync(-1, 0)
	e.reconcile()
	e.wantSandbox("run", model.StateLost, "w1", "worker w1 was lost")
	e.wantOp(runOp.ID, model.OpFailed, "worker w1 was lost")
	e.wantSandbox("local", model.StateLost, "w1", "the sandbox was suspended there")
	e.wantSandbox("shared", model.StateSuspended, "w1", "")
	e.wantSandbox("del", model.StateDeleted, "w1", "")
	e.wantConflict(model.OpWake, "run", "was lost with its worker")
	ws, err := e.service().ListWorkers(e.ctx, service.Principal{OrgID: service.DefaultOrgID, Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if want := map[string]string{"w1": service.WorkerLost, "w2": service.WorkerReady}[w.Worker.ID]; w.State != want {
			t.Errorf("worker %s: state %s, want %s", w.Worker.ID, w.State, want)
		}
	}

	// The shared one wakes on w2.
	e.mustLifecycle(model.OpWake, "shared")
	e.reconcile()
	e.wantSandbox("shared", model.StateWaking, "w2", "")

	// A lost sandbox is deleted at once; w1, back, has nothing assigned.
	op, err := e.service().DeleteSandbox(e.ctx, testPrincipal, "run")
	if err != nil {
		t.Fatal(err)
	}
	e.reconcile()
	e.wantSandbox("run", model.StateDeleted, "w1", "")
	e.wantOp(op.ID, model.OpSucceeded, "")
	wantAssignments(t, w1.sync(-1, 0), map[string]model.SandboxState{})
}

// TestWorkerLossRestores: with OnWorkerLoss restore, a running sandbox
// whose last snapshot is in the blob store is restored from it on another
// worker when its worker is lost; one without is lost.
func TestWorkerLossRestores(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.OnWorkerLoss = OnLossRestore; c.WorkerLossGrace = 5 * time.Minute })
	w1, w2 := e.worker("w1"), e.worker("w2")
	w1.blob, w2.blob = "file:///shared", "file:///shared"
	w1.register(baseTemplate)
	e.runningSandbox(w1, "sb1")
	e.runningSandbox(w1, "fresh")
	e.suspendedOn(w1, "sb1", "snap-1", true)
	e.mustLifecycle(model.OpWake, "sb1")
	e.reconcile()
	w1.sync(-1, 0, workerapi.Observed{SandboxID: "sb1", State: model.StateRunning})
	if sb := e.wantSandbox("sb1", model.StateRunning, "w1", ""); !sb.SnapshotShared || sb.SnapshotID != "snap-1" {
		t.Fatalf("woken sandbox %+v: its last snapshot is not kept for a restore", sb)
	}
	w2.register(baseTemplate)
	e.clock.Advance(2 * e.c.WorkerLossGrace())
	w2.sync(-1, 0)
	e.reconcile()
	e.wantSandbox("fresh", model.StateLost, "w1", "worker w1 was lost")
	sb := e.sandbox("sb1")
	if sb.State == model.StateSuspended {
		e.reconcile()
		sb = e.sandbox("sb1")
	}
	e.wantSandbox("sb1", model.StateWaking, "w2", "")
	resp := w2.sync(-1, 0)
	wantAssignments(t, resp, map[string]model.SandboxState{"sb1": model.StateRunning})
	if got := resp.Assignments[0].Sandbox.SnapshotID; got != "snap-1" {
		t.Fatalf("restore assigned with snapshot %q, want snap-1", got)
	}
}

// TestDrain: a drain moves each running sandbox of the worker to another
// worker of the blob store (suspend there, wake elsewhere), suspends the
// paused ones, leaves one whose snapshot stayed local where it is with the
// reason; a worker without a blob store cannot be drained.
func TestDrain(t *testing.T) {
	e := newEnv(t)
	w1, w2 := e.worker("w1"), e.worker("w2")
	w1.blob, w2.blob = "file:///shared", "file:///shared"
	w1.register(baseTemplate)
	for _, id := range []string{"run", "paused", "stuck"} {
		e.runningSandbox(w1, id)
	}
	e.mustLifecycle(model.OpPause, "paused")
	e.reconcile()
	w1.sync(-1, 0, workerapi.Observed{SandboxID: "paused", State: model.StatePaused})
	w2.register(baseTemplate)
	op := service.Principal{OrgID: service.DefaultOrgID, Admin: true}
	ws, err := e.service().DrainWorker(e.ctx, op, "w1")
	if err != nil || ws.State != service.WorkerDraining || !ws.Worker.Cordoned {
		t.Fatalf("drain: %+v %v", ws, err)
	}
	e.reconcile() // suspend operations
	e.reconcile() // → suspending
	for _, id := range []string{"run", "paused", "stuck"} {
		e.wantSandbox(id, model.StateSuspending, "w1", "")
	}
	if sb := e.sandbox("run"); sb.MoveFrom != "w1" {
		t.Fatalf("a sandbox being moved has MoveFrom %q", sb.MoveFrom)
	}
	w1.sync(-1, 0,
		workerapi.Observed{SandboxID: "run", State: model.StateSuspended, SnapshotID: "snap-r", SnapshotBytes: 1, SnapshotShared: true},
		workerapi.Observed{SandboxID: "paused", State: model.StateSuspended, SnapshotID: "snap-p", SnapshotBytes: 1, SnapshotShared: true},
		workerapi.Observed{SandboxID: "stuck", State: model.StateSuspended, SnapshotID: "snap-s", SnapshotBytes: 1})
	e.reconcile() // wake operation for run; stuck stays
	e.reconcile() // → waking on w2
	e.wantSandbox("run", model.StateWaking, "w2", "")
	e.wantSandbox("paused", model.StateSuspended, "w1", "")
	e.wantSandbox("stuck", model.StateSuspended, "w1", "its snapshot did not reach the blob store")
	w2.sync(-1, 0, workerapi.Observed{SandboxID: "run", State: model.StateRunning})
	e.reconcile()
	if sb := e.wantSandbox("run", model.StateRunning, "w2", ""); sb.MoveFrom != "" {
		t.Fatalf("a moved sandbox keeps MoveFrom %q", sb.MoveFrom)
	}
	// Nothing more happens: the drain is over.
	e.reconcile()
	e.wantSandbox("paused", model.StateSuspended, "w1", "")
	e.wantSandbox("stuck", model.StateSuspended, "w1", "")

	// Uncordon ends the drain.
	if ws, err := e.service().CordonWorker(e.ctx, op, "w1", false); err != nil || ws.State != service.WorkerReady || ws.Worker.Draining {
		t.Fatalf("uncordon after a drain: %+v %v", ws, err)
	}
	// A worker without a blob store cannot be drained.
	w3 := e.worker("w3")
	w3.register(baseTemplate)
	if _, err := e.service().DrainWorker(e.ctx, op, "w3"); !errors.Is(err, model.ErrConflict) || !strings.Contains(err.Error(), "--blob-store") {
		t.Fatalf("drain without a blob store: %v, want a conflict naming --blob-store", err)
	}
}

// TestDeposedLeaderWritesNothing: a round fenced by a lease epoch that
// another replica has taken over writes nothing and ends at its first
// write; the new holder's round goes through.
func TestDeposedLeaderWritesNothing(t *testing.T) {
	e := newEnv(t)
	w := e.worker("w1")
	w.register(baseTemplate)
	e.createSandbox("sb1", 512)
	now := e.clock.Now()
	a, err := e.st.AcquireLease(e.ctx, LeaseName, "replica-a", now, 15*time.Second)
	if err != nil || a.Holder != "replica-a" {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	e.clock.Advance(20 * time.Second) // a stalls past its TTL; b takes over
	w.sync(-1, 0)
	b, err := e.st.AcquireLease(e.ctx, LeaseName, "replica-b", e.clock.Now(), 15*time.Second)
	if err != nil || b.Holder != "replica-b" || b.Epoch != a.Epoch+1 {
		t.Fatalf("takeover: %+v %v", b, err)
	}
	_, err = e.c.reconcileAll(withFence(e.ctx, fence{name: LeaseName, holder: "replica-a", epoch: a.Epoch}))
	if !errors.Is(err, errDeposed) {
		t.Fatalf("the deposed replica's round: %v, want errDeposed", err)
	}
	e.wantSandbox("sb1", model.StatePending, "", "")
	if _, err := e.c.reconcileAll(withFence(e.ctx, fence{name: LeaseName, holder: "replica-b", epoch: b.Epoch})); err != nil {
		t.Fatalf("the holder's round: %v", err)
	}
	e.wantSandbox("sb1", model.StateStarting, "w1", "")
}
